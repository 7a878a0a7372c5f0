/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The session fuzz target's entry point (fuzz_session.c), shared by the libFuzzer binary and the
 * corpus replay (replay_daemon.c).
 */
#ifndef FUZZ_SESSION_H
#define FUZZ_SESSION_H

#include <stddef.h>
#include <stdint.h>

/*
 * fuzz_session_run() - feed one input (a sequence of client records, see fuzz_session.c) to an
 * in-process daemon, started on first use in a temporary directory. Aborts when an invariant
 * fails (sessions, pipes or listeners left once every client hung up).
 * @data: borrowed.
 */
void fuzz_session_run(const uint8_t *data, size_t len);

#endif
