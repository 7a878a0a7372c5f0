/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The frame fuzz target's body, shared by the libFuzzer entry point (fuzz_frame.c) and the
 * corpus replay driver (replay_frame.c): header parse, bounded unpack and validation of one
 * frame, read as a client message, as a daemon message and as a peer (daemon <-> daemon)
 * control message.
 */
#ifndef TPT_FUZZ_FRAME_H
#define TPT_FUZZ_FRAME_H

#include <stddef.h>
#include <stdint.h>

#define FUZZ_CLIENT_OK 1u /* the frame is a valid client -> daemon frame */
#define FUZZ_DAEMON_OK 2u /* the frame is a valid daemon -> client frame */
#define FUZZ_PEER_OK 4u	  /* the frame is a valid daemon <-> daemon control frame */

/*
 * fuzz_frame_check() - run one input (a whole frame: header, message, data tail) through
 * tpw_hdr_parse(), tpw_*_msg_unpack() and tpw_*_msg_validate() with default limits. Aborts if
 * validation accepts a frame whose inline ranges or eager tail do not fit the input.
 * Return: a mask of FUZZ_CLIENT_OK and FUZZ_DAEMON_OK.
 */
unsigned fuzz_frame_check(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#endif
