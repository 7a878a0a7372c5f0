#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# tpipctl --json for scripts: `backends` lists every channel with a boolean viable and, when not
# viable, a reason (the daemon runs with --no-cma, so cma is listed as not viable and says why);
# `stats` starts at zero and, after example_client moved one message, shows channel transfers
# and bytes > 0 (none on cma) and messages_moved >= 1.
. "$(dirname -- "$0")/lib.sh" || exit 1
need_env TPIPD_BIN TPIPCTL_BIN EXAMPLE_CLIENT_BIN
need_tool jq
svc_init

sock=$SVC_TMP/tpipd.sock
log=$SVC_TMP/tpipd.log
svc_start_daemon "$sock" "$log" --config /dev/null --no-cma

# jq_check DESCRIPTION FILE FILTER: FILTER must evaluate to true on FILE.
jq_check() {
	check "$1"
	jq -e "$3" "$2" >/dev/null || { jq . "$2"; fail "$1"; }
}

ctl --socket "$sock" --json backends >"$SVC_TMP/backends.json" || fail "tpipctl --json backends"
jq -r '.backends[] | "\(.priority) \(.name) viable=\(.viable) \(.why)"' "$SVC_TMP/backends.json" |
	sed "s/^/$SVC_NAME:   /"
jq_check "backends lists channels, each with a name and a boolean viable" "$SVC_TMP/backends.json" \
	'(.backends | length > 0) and
	 all(.backends[]; (.name | type == "string" and length > 0) and (.viable | type == "boolean"))'
jq_check "every channel that is not viable says why" "$SVC_TMP/backends.json" \
	'all(.backends[] | select(.viable == false); .why | type == "string" and length > 0)'
jq_check "every channel has a caps array" "$SVC_TMP/backends.json" \
	'all(.backends[]; .caps | type == "array")'
jq_check "shm, cma and basic are all listed" "$SVC_TMP/backends.json" \
	'[.backends[].name] as $n | all("shm", "cma", "basic"; . as $c | $n | index($c))'
jq_check "with --no-cma, cma is not viable and says why" "$SVC_TMP/backends.json" \
	'.backends[] | select(.name == "cma") | .viable == false and (.why | length > 0)'
jq_check "basic is viable (the fallback)" "$SVC_TMP/backends.json" \
	'.backends[] | select(.name == "basic") | .viable == true'

ctl --socket "$sock" --json status >"$SVC_TMP/status.json" || fail "tpipctl --json status"
jq_check "status says cma is not available" "$SVC_TMP/status.json" '.cma_available == false'

ctl --socket "$sock" --json stats >"$SVC_TMP/stats0.json" || fail "tpipctl --json stats"
jq_check "stats of a fresh daemon: every channel listed, all counters 0" "$SVC_TMP/stats0.json" \
	'(.channels | length > 0) and all(.channels[]; .transfers == 0 and .bytes == 0 and
	 .errors == 0) and .status.messages_moved == 0'

check "example_client moves one message (payload and tensor)"
"$EXAMPLE_CLIENT_BIN" "$sock" >"$SVC_TMP/client.out" 2>&1 ||
	{ cat "$SVC_TMP/client.out"; fail "example_client failed"; }
say "  $(cat "$SVC_TMP/client.out")"

ctl --socket "$sock" --json stats >"$SVC_TMP/stats1.json" || fail "tpipctl --json stats"
jq -r '.channels[] | "\(.name) transfers=\(.transfers) bytes=\(.bytes) errors=\(.errors)"' \
	"$SVC_TMP/stats1.json" | sed "s/^/$SVC_NAME:   /"
jq_check "after one message: messages_moved >= 1 and bytes_moved > 0" "$SVC_TMP/stats1.json" \
	'.status.messages_moved >= 1 and .status.bytes_moved > 0'
jq_check "after one message: channel transfers > 0, and every channel that moved has bytes > 0" \
	"$SVC_TMP/stats1.json" \
	'([.channels[].transfers] | add > 0) and
	 all(.channels[] | select(.transfers > 0); .bytes > 0)'
jq_check "nothing went through cma, nothing failed" "$SVC_TMP/stats1.json" \
	'all(.channels[]; .errors == 0) and
	 (.channels[] | select(.name == "cma") | .transfers == 0)'
jq_check "the latency histogram counts the copies it timed" "$SVC_TMP/stats1.json" \
	'all(.channels[]; (.latency_us_log2 | type == "array") and
	 ((.latency_us_log2 | add) <= .transfers))'

check "SIGTERM: exit status 0"
svc_stop_daemon "$SVC_DAEMON_PID"
say "ok"
