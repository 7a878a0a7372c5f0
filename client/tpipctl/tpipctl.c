/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * tpipctl: show what the local tpipd is doing. Parses the command line, opens one control
 * session (conn.c), asks the daemon for one report and prints it (render.c), or for watch keeps
 * asking (watch.c). Exit status: 0 ok, 1 usage error, 2 the daemon cannot be reached (or went
 * away during watch), 3 the daemon answered with an error. Only the admin commands change
 * daemon state.
 */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "ctl.h"
#include "tpconfig.h"

enum {
	EXIT_OK = 0,
	EXIT_USAGE = 1,
	EXIT_UNREACHABLE = 2,
	EXIT_DAEMON = 3,
};

#define DEFAULT_TIMEOUT_MS 5000
#define MAX_TIMEOUT_S 3600
#define DEFAULT_INTERVAL_MS 1000
#define MIN_INTERVAL_S 0.1
#define MAX_INTERVAL_S 3600.0

enum { OPT_INTERVAL = 1000, OPT_COUNT };

typedef int (*render_fn)(const Tpw__V1__CtlReply *r, const struct ctl_view *v, FILE *out);

struct command {
	const char *name;
	const char *arg; /* name of the one argument it takes, or NULL */
	Tpw__V1__CtlWhat what;
	render_fn render; /* NULL: watch, which renders through ctl_watch() */
	const char *help;
};

static const struct command commands[] = {
	{ "status", NULL, TPW__V1__CTL_WHAT__CTL_STATUS, ctl_render_status,
	  "daemon version, pid, uptime, socket, counts, bytes and messages moved" },
	{ "sessions", NULL, TPW__V1__CTL_WHAT__CTL_SESSIONS, ctl_render_sessions,
	  "attached processes (clients and control sessions)" },
	{ "pipes", NULL, TPW__V1__CTL_WHAT__CTL_PIPES, ctl_render_pipes,
	  "open pipes, their ends, channels used and traffic" },
	{ "listeners", NULL, TPW__V1__CTL_WHAT__CTL_LISTENERS, ctl_render_listeners,
	  "registered listener names and their access policy" },
	{ "peers", NULL, TPW__V1__CTL_WHAT__CTL_PEERS, ctl_render_peers,
	  "links to other hosts' daemons: state, connections, RTT, traffic" },
	{ "groups", NULL, TPW__V1__CTL_WHAT__CTL_GROUPS, ctl_render_groups,
	  "collective groups: members, plan, arena, per-member collectives, bytes, seconds" },
	{ "channels", NULL, TPW__V1__CTL_WHAT__CTL_CHANNELS, ctl_render_channels,
	  "named channels: owner, access, state, items and bytes held, handles, readers waiting" },
	{ "queues", NULL, TPW__V1__CTL_WHAT__CTL_QUEUES, ctl_render_queues,
	  "work queues: owner, access, state, questions queued and taken, answers, workers" },
	{ "backends", NULL, TPW__V1__CTL_WHAT__CTL_BACKENDS, ctl_render_backends,
	  "channels in priority order, capabilities, viable here or why not" },
	{ "stats", NULL, TPW__V1__CTL_WHAT__CTL_STATS, ctl_render_stats,
	  "per-channel transfers, bytes, errors and copy latency" },
	{ "close-session", "ID", TPW__V1__CTL_WHAT__CTL_CLOSE_SESSION, ctl_render_close_session,
	  "admin: close session ID (its pipes fail on the other end)" },
	{ "drain", NULL, TPW__V1__CTL_WHAT__CTL_DRAIN, ctl_render_drain,
	  "admin: stop accepting clients, finish copies in flight, exit" },
	{ "watch", NULL, TPW__V1__CTL_WHAT__CTL_STATUS, NULL,
	  "status and pipes, refreshed every --interval until Ctrl-C" },
};

struct options {
	const char *socket_path;
	int timeout_ms;
	const struct command *cmd;
	struct ctl_view view;
	struct ctl_watch_opts watch;
	const char *watch_flag; /* a watch-only flag that was given, for the usage check */
};

static void usage(FILE *out)
{
	fprintf(out,
		"Usage: tpipctl [OPTIONS] COMMAND [ARG]\n"
		"\n"
		"Show the state of the local tpipd.\n"
		"\n"
		"Commands:\n");
	for (size_t i = 0; i < TPU_ARRAY_SIZE(commands); i++) {
		char name[32];

		snprintf(name, sizeof(name), "%s%s%s", commands[i].name, commands[i].arg ? " " : "",
			 commands[i].arg ? commands[i].arg : "");
		fprintf(out, "  %-17s %s\n", name, commands[i].help);
	}
	fprintf(out,
		"\n"
		"Options:\n"
		"  -s, --socket PATH    daemon socket (default: $TPIPD_SOCKET, else\n"
		"                       /run/tpipd/tpipd.sock for root, else\n"
		"                       $XDG_RUNTIME_DIR/tpipd.sock, then\n"
		"                       /run/tpipd/tpipd.sock)\n"
		"  -j, --json           print JSON instead of a table\n"
		"  -v, --verbose        pipes: each pipe's channels and why each was chosen\n"
		"  -t, --timeout SECS   give up after SECS seconds (default 5; for watch,\n"
		"                       per refresh)\n"
		"      --interval SECS  watch: refresh every SECS seconds (default 1, at\n"
		"                       least 0.1)\n"
		"      --count N        watch: stop after N refreshes (default: until\n"
		"                       SIGINT or SIGTERM)\n"
		"  -h, --help           show this help\n"
		"  -V, --version        show the version\n"
		"\n"
		"Admin commands need root or the daemon's admin group.\n"
		"Exit status: 0 ok, 1 usage error, 2 cannot reach the daemon (or it went away\n"
		"during watch), 3 daemon error.\n");
}

static const struct command *command_find(const char *name)
{
	for (size_t i = 0; i < TPU_ARRAY_SIZE(commands); i++)
		if (strcmp(commands[i].name, name) == 0)
			return &commands[i];
	return NULL;
}

static int parse_timeout(const char *s, int *ret)
{
	char *end;
	long v;

	errno = 0;
	v = strtol(s, &end, 10);
	if (errno || end == s || *end || v <= 0 || v > MAX_TIMEOUT_S)
		return -EINVAL;
	*ret = (int)v * 1000;
	return 0;
}

static int parse_interval(const char *s, uint64_t *ret)
{
	char *end;
	double v;

	errno = 0;
	v = strtod(s, &end);
	if (errno || end == s || *end || !isfinite(v) || v < MIN_INTERVAL_S || v > MAX_INTERVAL_S)
		return -EINVAL;
	*ret = (uint64_t)(v * 1000.0 + 0.5);
	return 0;
}

/* A positive decimal number: a session id or a count. */
static int parse_positive(const char *s, uint64_t *ret)
{
	char *end;
	unsigned long long v;

	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno || end == s || *end || *s == '-' || v == 0)
		return -EINVAL;
	*ret = v;
	return 0;
}

/* Return: -1 to go on, else an exit status (help, version, usage error). */
static int parse_flags(int argc, char **argv, struct options *o)
{
	static const struct option longopts[] = {
		{ "socket", required_argument, NULL, 's' }, { "json", no_argument, NULL, 'j' },
		{ "verbose", no_argument, NULL, 'v' },
		{ "timeout", required_argument, NULL, 't' }, { "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, 'V' },
		{ "interval", required_argument, NULL, OPT_INTERVAL },
		{ "count", required_argument, NULL, OPT_COUNT },
		{ 0 },
	};
	int c;

	while ((c = getopt_long(argc, argv, "s:jvt:hV", longopts, NULL)) != -1) {
		switch (c) {
		case 's': o->socket_path = optarg; break;
		case 'j': o->view.json = true; break;
		case 'v': o->view.verbose = true; break;
		case 't':
			if (parse_timeout(optarg, &o->timeout_ms) < 0) {
				fprintf(stderr, "tpipctl: invalid timeout '%s' (1..%d seconds)\n",
					optarg, MAX_TIMEOUT_S);
				return EXIT_USAGE;
			}
			break;
		case OPT_INTERVAL:
			o->watch_flag = "--interval";
			if (parse_interval(optarg, &o->watch.interval_ms) < 0) {
				fprintf(stderr, "tpipctl: invalid interval '%s' (%g..%g seconds)\n",
					optarg, MIN_INTERVAL_S, MAX_INTERVAL_S);
				return EXIT_USAGE;
			}
			break;
		case OPT_COUNT:
			o->watch_flag = "--count";
			if (parse_positive(optarg, &o->watch.count) < 0) {
				fprintf(stderr, "tpipctl: invalid count '%s' (a positive number)\n",
					optarg);
				return EXIT_USAGE;
			}
			break;
		case 'h': usage(stdout); return EXIT_OK;
		case 'V':
			printf("tpipctl %s (protocol %d.%d)\n", TP_VERSION, TPW_PROTO_MAJOR,
			       TPW_PROTO_MINOR);
			return EXIT_OK;
		default:
			fprintf(stderr, "Try 'tpipctl --help'.\n");
			return EXIT_USAGE;
		}
	}
	return -1;
}

/* Checks the command's argument count and parses its argument. Return: -1 or EXIT_USAGE. */
static int parse_command_args(int argc, char **argv, struct options *o)
{
	int want = o->cmd->arg ? 1 : 0, have = argc - optind - 1;

	if (have > want) {
		fprintf(stderr, "tpipctl: unexpected argument '%s'\n", argv[optind + 1 + want]);
		return EXIT_USAGE;
	}
	if (have < want) {
		fprintf(stderr, "tpipctl: %s needs %s\n", o->cmd->name, o->cmd->arg);
		return EXIT_USAGE;
	}
	if (want && parse_positive(argv[optind + 1], &o->view.target_id) < 0) {
		fprintf(stderr, "tpipctl: %s: '%s' is not a session id\n", o->cmd->name,
			argv[optind + 1]);
		return EXIT_USAGE;
	}
	return -1;
}

static int parse_args(int argc, char **argv, struct options *o)
{
	int r = parse_flags(argc, argv, o);

	if (r >= 0)
		return r;
	if (optind >= argc) {
		fprintf(stderr, "tpipctl: missing command\n");
		usage(stderr);
		return EXIT_USAGE;
	}
	o->cmd = command_find(argv[optind]);
	if (!o->cmd) {
		fprintf(stderr, "tpipctl: unknown command '%s'; try 'tpipctl --help'\n",
			argv[optind]);
		return EXIT_USAGE;
	}
	if (o->watch_flag && o->cmd->render) {
		fprintf(stderr, "tpipctl: %s applies only to watch\n", o->watch_flag);
		return EXIT_USAGE;
	}
	return parse_command_args(argc, argv, o);
}

static int conn_exit_status(const struct ctl_conn *c)
{
	fprintf(stderr, "tpipctl: %s\n", c->why[0] ? c->why : "out of memory");
	return c->fail == CTL_FAIL_DAEMON ? EXIT_DAEMON : EXIT_UNREACHABLE;
}

/*
 * A daemon with nothing in flight may stop before its answer to drain reaches us; after the
 * request went out, the connection closing is the outcome asked for.
 */
static bool drain_done(const struct options *o, const struct ctl_conn *c)
{
	return o->cmd->what == TPW__V1__CTL_WHAT__CTL_DRAIN && c->eof && c->seq >= 2;
}

static int render(const struct options *o, const Tpw__V1__CtlReply *r)
{
	char eb[128];
	int ret = o->cmd->render(r, &o->view, stdout);

	if (ret == 0 && fflush(stdout) != 0)
		ret = -errno;
	if (ret == 0 && r->own_only && !o->view.json &&
	    (o->cmd->what == TPW__V1__CTL_WHAT__CTL_SESSIONS ||
	     o->cmd->what == TPW__V1__CTL_WHAT__CTL_PIPES ||
	     o->cmd->what == TPW__V1__CTL_WHAT__CTL_LISTENERS))
		fprintf(stderr, "tpipctl: not an admin: only uid %u's objects are shown\n",
			(unsigned)r->viewer_uid);
	if (ret < 0) {
		fprintf(stderr, "tpipctl: writing output: %s\n", tpu_strerror(ret, eb, sizeof(eb)));
		return EXIT_DAEMON;
	}
	return EXIT_OK;
}

static int run(const struct options *o)
{
	static const Tpw__V1__CtlReply empty = TPW__V1__CTL_REPLY__INIT;
	Tpw__V1__DaemonMsg *reply = NULL;
	struct ctl_conn c;
	int r;

	r = ctl_conn_open(&c, o->socket_path, o->timeout_ms);
	c.verbose = o->view.verbose;
	if (r == 0)
		r = ctl_conn_request(&c, o->cmd->what, o->view.target_id, &reply);
	if (r < 0 && drain_done(o, &c))
		r = render(o, &empty);
	else if (r < 0)
		r = conn_exit_status(&c);
	else
		r = render(o, reply->ctl_reply);
	ctl_conn_close(&c);
	tpw_daemon_msg_free(reply);
	return r;
}

static int run_watch(struct options *o)
{
	char eb[128];
	struct ctl_conn c;
	int r;

	o->watch.timeout_ms = o->timeout_ms;
	r = ctl_conn_open(&c, o->socket_path, o->timeout_ms);
	if (r == 0)
		r = ctl_watch(&c, &o->watch, &o->view, stdout);
	if (r < 0 && c.fail != CTL_FAIL_NONE)
		r = conn_exit_status(&c);
	else if (r < 0) {
		fprintf(stderr, "tpipctl: watch: %s\n", tpu_strerror(r, eb, sizeof(eb)));
		r = EXIT_DAEMON;
	}
	ctl_conn_close(&c);
	return r;
}

int main(int argc, char **argv)
{
	struct options o = {
		.timeout_ms = DEFAULT_TIMEOUT_MS,
		.watch = { .interval_ms = DEFAULT_INTERVAL_MS },
	};
	int r = parse_args(argc, argv, &o);

	if (r >= 0)
		return r;
	return o.cmd->render ? run(&o) : run_watch(&o);
}
