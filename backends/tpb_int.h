/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * What the registry shares with the channels of libtpbackends and nothing outside it: the probe
 * round, so that a probe two channels need (RDMA: rdma and cuda_gdr) runs once per
 * tpb_registry_init().
 */
#ifndef TPB_INT_H
#define TPB_INT_H

/* Bumped by every tpb_registry_init() before it probes the channels. */
extern unsigned tpb_probe_round;

#endif
