/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The peer fuzz target's entry point (fuzz_peer.c), shared by the libFuzzer binary and the corpus
 * replay (replay_daemon.c), and the placeholders its seeds (gen_peer_corpus.c) put where an id the
 * daemon chooses belongs.
 */
#ifndef FUZZ_PEER_H
#define FUZZ_PEER_H

#include <stddef.h>
#include <stdint.h>

/*
 * Placeholders for ids the daemon picks. A record with FUZZ_PEER_OP_SUBST has every 10-byte
 * protobuf varint encoding of one of them replaced, before it is sent, by a 10-byte (padded)
 * varint of the real id: the link id of the last PeerReady and the pipe id of the last accepted
 * PeerConnectReply the daemon sent on connection 0. Both have bit 63 set, so that their canonical
 * varint is 10 bytes long and the frame's length does not change.
 */
#define FUZZ_PEER_LINK_ID 0xf1f2f3f4f5f6f7f8ull
#define FUZZ_PEER_PIPE_ID 0xe1e2e3e4e5e6e7e8ull

/* Record op bits (see fuzz_peer.c). */
#define FUZZ_PEER_OP_CONN 0x03
#define FUZZ_PEER_OP_SUBST 0x04
#define FUZZ_PEER_OP_HANGUP 0x08
#define FUZZ_PEER_OP_BATCH 0x10
#define FUZZ_PEER_OP_LOCAL 0x20

/* The listener the harness's local session opens to every peer before each input. */
#define FUZZ_PEER_LISTENER "fuzz"

/*
 * fuzz_peer_run() - feed one input (a sequence of records over TCP connections to the peer port,
 * see fuzz_peer.c) to an in-process daemon, started on first use with an insecure peer listener
 * on 127.0.0.1. Aborts when an invariant fails (a link, pending peer connection, data dial, pipe,
 * session or listener left once every connection closed).
 * @data: borrowed.
 */
void fuzz_peer_run(const uint8_t *data, size_t len);

#endif
