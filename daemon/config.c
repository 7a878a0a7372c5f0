/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Defaults and command-line parsing for tpipd.
 */
#include <getopt.h>
#include <stdio.h>
#include <string.h>
#include "config.h"
#include "tpconfig.h"

void tpd_config_defaults(struct tpd_config *c)
{
	memset(c, 0, sizeof(*c));
	c->log_level = TPU_LOG_INFO;
	c->copy_threads = 2;
	tpw_limits_default(&c->wire);
	c->sessions_max = 1024;
	c->pipes_max = 4096;
	c->pipe_queue_max = 4096;
	c->pipe_queue_bytes = 64ull << 20;
	c->buffers_max = 1024;
	c->buffer_bytes_max = 1ull << 40;
	c->outq_max = 256ull << 20;
	c->listeners_max = 256;
	c->drain_ms = 5000;
}

enum {
	OPT_SOCKET = 256, OPT_LOG_LEVEL, OPT_COPY_THREADS, OPT_FRAME_MAX, OPT_INLINE_MAX,
	OPT_SEGMENTS_MAX, OPT_METADATA_MAX, OPT_MESSAGE_BYTES_MAX, OPT_SESSIONS_MAX,
	OPT_PIPES_MAX, OPT_PIPE_QUEUE_MAX, OPT_PIPE_QUEUE_BYTES, OPT_BUFFERS_MAX,
	OPT_BUFFER_BYTES_MAX, OPT_NO_CMA, OPT_VERSION, OPT_HELP,
};

static const struct option options[] = {
	{ "socket", required_argument, NULL, OPT_SOCKET },
	{ "log-level", required_argument, NULL, OPT_LOG_LEVEL },
	{ "copy-threads", required_argument, NULL, OPT_COPY_THREADS },
	{ "frame-max", required_argument, NULL, OPT_FRAME_MAX },
	{ "inline-max", required_argument, NULL, OPT_INLINE_MAX },
	{ "segments-max", required_argument, NULL, OPT_SEGMENTS_MAX },
	{ "metadata-max", required_argument, NULL, OPT_METADATA_MAX },
	{ "message-bytes-max", required_argument, NULL, OPT_MESSAGE_BYTES_MAX },
	{ "sessions-max", required_argument, NULL, OPT_SESSIONS_MAX },
	{ "pipes-max", required_argument, NULL, OPT_PIPES_MAX },
	{ "pipe-queue-max", required_argument, NULL, OPT_PIPE_QUEUE_MAX },
	{ "pipe-queue-bytes", required_argument, NULL, OPT_PIPE_QUEUE_BYTES },
	{ "buffers-max", required_argument, NULL, OPT_BUFFERS_MAX },
	{ "buffer-bytes-max", required_argument, NULL, OPT_BUFFER_BYTES_MAX },
	{ "no-cma", no_argument, NULL, OPT_NO_CMA },
	{ "version", no_argument, NULL, OPT_VERSION },
	{ "help", no_argument, NULL, OPT_HELP },
	{}
};

static void usage(FILE *f)
{
	fprintf(f,
		"Usage: tpipd [OPTIONS]\n"
		"Move tensors between processes through a per-host daemon.\n\n"
		"  --socket PATH             control socket (default: $TPIPD_SOCKET,\n"
		"                            /run/tpipd/tpipd.sock as root, else\n"
		"                            $XDG_RUNTIME_DIR/tpipd.sock)\n"
		"  --log-level LEVEL         err, warning, notice, info (default), debug\n"
		"  --copy-threads N          copy threads (default 2)\n"
		"  --frame-max BYTES         largest frame accepted (default 4M, at most 64M)\n"
		"  --inline-max BYTES        largest inline data per write (default 1M)\n"
		"  --segments-max N          payloads + tensors per message (default 1024)\n"
		"  --metadata-max BYTES      metadata bytes per message (default 1M)\n"
		"  --message-bytes-max BYTES data bytes per message (default 16G)\n"
		"  --sessions-max N          attached clients (default 1024)\n"
		"  --pipes-max N             pipes per client (default 4096)\n"
		"  --pipe-queue-max N        unread messages per pipe direction (default 4096)\n"
		"  --pipe-queue-bytes BYTES  inline bytes held per pipe direction (default 64M)\n"
		"  --buffers-max N           shared buffers per client (default 1024)\n"
		"  --buffer-bytes-max BYTES  shared buffer bytes per client (default 1T)\n"
		"  --no-cma                  never use cross-memory attach\n"
		"  --version                 print the version and exit\n"
		"  --help                    print this help and exit\n");
}

static int parse_u64(const char *name, const char *arg, uint64_t min, uint64_t max, uint64_t *ret)
{
	uint64_t v;

	if (tpu_parse_size(arg, &v) < 0 || v < min || v > max) {
		fprintf(stderr, "tpipd: --%s: '%s' is not a number in [%llu, %llu]\n", name, arg,
			(unsigned long long)min, (unsigned long long)max);
		return -EINVAL;
	}
	*ret = v;
	return 0;
}

static int parse_u32(const char *name, const char *arg, uint64_t min, uint64_t max, uint32_t *ret)
{
	uint64_t v;
	int r = parse_u64(name, arg, min, max, &v);

	if (r == 0)
		*ret = (uint32_t)v;
	return r;
}

static int apply(struct tpd_config *c, int opt, const char *arg)
{
	uint32_t v32;

	switch (opt) {
	case OPT_SOCKET:
		if (strlen(arg) >= sizeof(c->socket_path)) {
			fprintf(stderr, "tpipd: --socket: path too long\n");
			return -EINVAL;
		}
		strcpy(c->socket_path, arg);
		return 0;
	case OPT_LOG_LEVEL:
		if (tpu_log_parse_level(arg, &c->log_level) < 0) {
			fprintf(stderr, "tpipd: --log-level: unknown level '%s'\n", arg);
			return -EINVAL;
		}
		return 0;
	case OPT_COPY_THREADS:
		if (parse_u32("copy-threads", arg, 1, 64, &v32) < 0)
			return -EINVAL;
		c->copy_threads = v32;
		return 0;
	case OPT_FRAME_MAX:
		return parse_u32("frame-max", arg, 4096, TPW_FRAME_MAX_HARD, &c->wire.frame_max);
	case OPT_INLINE_MAX:
		return parse_u32("inline-max", arg, 0, TPW_FRAME_MAX_HARD, &c->wire.inline_max);
	case OPT_SEGMENTS_MAX:
		return parse_u32("segments-max", arg, 0, 1u << 20, &c->wire.segments_max);
	case OPT_METADATA_MAX:
		return parse_u32("metadata-max", arg, 0, TPW_FRAME_MAX_HARD, &c->wire.metadata_max);
	case OPT_MESSAGE_BYTES_MAX:
		return parse_u64("message-bytes-max", arg, 0, UINT64_MAX, &c->wire.message_bytes_max);
	case OPT_SESSIONS_MAX:
		return parse_u32("sessions-max", arg, 1, 1u << 20, &c->sessions_max);
	case OPT_PIPES_MAX:
		return parse_u32("pipes-max", arg, 1, 1u << 24, &c->pipes_max);
	case OPT_PIPE_QUEUE_MAX:
		return parse_u32("pipe-queue-max", arg, 1, 1u << 24, &c->pipe_queue_max);
	case OPT_PIPE_QUEUE_BYTES:
		return parse_u64("pipe-queue-bytes", arg, 0, UINT64_MAX, &c->pipe_queue_bytes);
	case OPT_BUFFERS_MAX:
		return parse_u32("buffers-max", arg, 0, 1u << 20, &c->buffers_max);
	case OPT_BUFFER_BYTES_MAX:
		return parse_u64("buffer-bytes-max", arg, 0, UINT64_MAX, &c->buffer_bytes_max);
	case OPT_NO_CMA:
		c->no_cma = true;
		return 0;
	}
	return -EINVAL;
}

int tpd_config_parse_args(struct tpd_config *c, int argc, char **argv)
{
	int opt;

	optind = 1;
	while ((opt = getopt_long(argc, argv, "", options, NULL)) != -1) {
		if (opt == OPT_HELP) {
			usage(stdout);
			return 1;
		}
		if (opt == OPT_VERSION) {
			printf("tpipd %s\n", TP_VERSION);
			return 1;
		}
		if (opt == '?' || apply(c, opt, optarg) < 0) {
			if (opt == '?')
				usage(stderr);
			return -EINVAL;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "tpipd: unexpected argument '%s'\n", argv[optind]);
		return -EINVAL;
	}
	if ((uint64_t)c->wire.inline_max + 65536 > c->wire.frame_max)
		c->wire.inline_max = c->wire.frame_max > 65536 ? c->wire.frame_max - 65536 : 0;
	return 0;
}
