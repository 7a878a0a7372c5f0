/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * tpipd configuration: defaults and command-line flags. Every user-controllable resource has a
 * hard, configurable limit here. (A config file arrives with the service integration.)
 */
#ifndef TPD_CONFIG_H
#define TPD_CONFIG_H

#include <stdbool.h>
#include <stdint.h>
#include "log.h"
#include "validate.h"

struct tpd_config {
	char socket_path[108];
	enum tpu_log_level log_level;
	unsigned copy_threads;
	bool no_cma;
	struct tpw_limits wire;	    /* frame, inline, segments, message bytes, metadata */
	uint32_t sessions_max;
	uint32_t pipes_max;	    /* per session */
	uint32_t pipe_queue_max;    /* messages written, not yet read, per pipe direction */
	uint64_t pipe_queue_bytes;  /* inline bytes held per pipe direction */
	uint32_t buffers_max;	    /* shared buffers per session */
	uint64_t buffer_bytes_max;  /* shared buffer bytes per session */
	uint64_t outq_max;	    /* bytes queued towards one session before it is dropped */
	uint32_t listeners_max;	    /* per session */
	unsigned drain_ms;	    /* graceful stop: wait this long for copies */
};

void tpd_config_defaults(struct tpd_config *c);

/*
 * tpd_config_parse_args() - apply command-line flags to @c.
 * Return: 0 to run, 1 if --help/--version was handled (exit 0), -EINVAL on a bad flag (a
 * message was printed to stderr).
 */
int tpd_config_parse_args(struct tpd_config *c, int argc, char **argv);

#endif
