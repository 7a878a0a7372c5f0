#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# sd_notify (READY/STATUS, WATCHDOG, RELOADING, STOPPING) without systemd: notify.py plays the
# service manager on a datagram socket. Skips without python3; notify.py cleans up after itself.
. "$(dirname -- "$0")/lib.sh" || exit 1
need_env TPIPD_BIN
need_tool python3 "it plays the service manager"
exec python3 "$(dirname "$0")/notify.py"
