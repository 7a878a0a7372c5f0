/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The Slurm bootstrap fuzz target's body, shared by the libFuzzer entry point (fuzz_slurm.c)
 * and the corpus replay driver (replay_slurm.c). The first byte of an input picks what the
 * rest is:
 *   'h' a host list, for tpc_slurm_hostlist_parse();
 *   't' a node count in decimal, '\n', a tasks-per-node list, for tpc_slurm_tasks_parse();
 *   'e' lines NAME=VALUE of Slurm variables (SLURM_PROCID=3), for tpc_slurm_from_vars().
 * Other first bytes are ignored (refused).
 */
#ifndef TPT_FUZZ_SLURM_H
#define TPT_FUZZ_SLURM_H

#include <stddef.h>
#include <stdint.h>

/*
 * fuzz_slurm_check() - run one input through the parser its first byte picks. Aborts if the
 * parser accepts something that breaks its contract (a name empty, too long or with a byte
 * outside the allowed set; more hosts or tasks than the limits; counts that do not add up; a
 * rank, local rank or node not below its count).
 * Return: 1 if the parser accepted the input, 0 if it refused it.
 */
int fuzz_slurm_check(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#endif
