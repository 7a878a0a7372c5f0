/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Test harness for the integration suites: start a real tpipd on a socket in a fresh temporary
 * directory and stop it again (checking its exit status), watch its fds and memory, fork client
 * processes that die with the test, wait for them with deadlines, synchronise them through
 * pipes, fill and verify deterministic byte patterns, and run commands (tpipctl) capturing
 * their output. Nothing here sleeps to synchronise: waits poll a condition with a short backoff
 * until a deadline. Raw wire access (frames on a Unix socket) lives in tpt_wire.h.
 */
#ifndef TPT_H
#define TPT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

/* Deadlines used when a test does not choose one. */
#define TPT_START_TIMEOUT_MS 10000
#define TPT_STOP_TIMEOUT_MS 10000
#define TPT_CHILD_TIMEOUT_MS 60000

struct tpt_daemon {
	pid_t pid;
	char dir[64];	  /* mktemp -d directory holding socket, log and config */
	char socket[108]; /* dir/tpipd.sock */
	char log[128];	  /* the daemon's stderr */
	pid_t reaper;	  /* cleans up if the test process dies first */
	int reaper_fd;
	int peer_port;	  /* bound peer listener port (tpt_daemon_start_peer), else 0 */
};

/*
 * tpt_daemon_start() - start $TPIPD_BIN --socket DIR/tpipd.sock --config DIR/tpipd.conf (a file
 * holding only "[peer] listen = off", so that no test binds the default "*:7420"; a
 * --peer-listen flag in @extra_args wins) plus @extra_args, with stderr to DIR/tpipd.log, and
 * wait until its socket accepts connections. The daemon gets PR_SET_PDEATHSIG(SIGKILL), so it
 * dies with the test process.
 * @extra_args: NULL-terminated list of further arguments, or NULL (borrowed).
 * Return: 0; -ENOENT if TPIPD_BIN is not set; -ETIMEDOUT or -ECHILD (exited early) with the log
 * printed to stderr; other -errno. On failure nothing is left running.
 */
int tpt_daemon_start(struct tpt_daemon *d, const char *const *extra_args);

/*
 * tpt_daemon_stop() - SIGTERM, wait up to TPT_STOP_TIMEOUT_MS, then SIGKILL; remove the temp
 * directory. Prints the daemon's log to stderr if it did not exit with status 0, or always when
 * $TPT_DAEMON_LOG is set.
 * Return: the exit status (0 = clean stop), 128 + signal if killed, -ETIMEDOUT if it needed
 * SIGKILL, -ECHILD if it was already gone.
 */
int tpt_daemon_stop(struct tpt_daemon *d);

/* True while the daemon process exists and has not exited. */
bool tpt_daemon_alive(const struct tpt_daemon *d);

/* Number of open fds of the daemon (/proc/PID/fd). Return: count or -errno. */
int tpt_daemon_fd_count(const struct tpt_daemon *d);

/* Resident set size of the daemon in KiB (VmRSS). Return: size or -errno. */
long tpt_daemon_rss_kb(const struct tpt_daemon *d);

/*
 * tpt_daemon_fd_settle() - poll the daemon's fd count until it stays the same for @quiet_ms.
 * Return: the settled count, or -ETIMEDOUT after @timeout_ms.
 */
int tpt_daemon_fd_settle(const struct tpt_daemon *d, int quiet_ms, int timeout_ms);

/*
 * tpt_daemon_wait_fds() - poll until the daemon has at most @max fds.
 * Return: the final count (<= @max), or -ETIMEDOUT (the last count is printed).
 */
int tpt_daemon_wait_fds(const struct tpt_daemon *d, int max, int timeout_ms);

/*
 * tpt_daemon_kill() - SIGKILL the daemon (as a crash would), reap it and remove its temp
 * directory. Prints the log first when $TPT_DAEMON_LOG is set.
 * Return: 0, or -ECHILD if it was not running.
 */
int tpt_daemon_kill(struct tpt_daemon *d);

/*
 * tpt_daemon_wait_log() - poll the daemon's log until a line contains @needle.
 * @ret_line: the first such line without its newline (truncated to @line_len), or NULL.
 * Return: 0; -ETIMEDOUT after @timeout_ms; -ECHILD if the daemon exited without logging it.
 */
int tpt_daemon_wait_log(const struct tpt_daemon *d, const char *needle, int timeout_ms,
			char *ret_line, size_t line_len);

/* True if the daemon's log holds a line containing @needle now. */
bool tpt_daemon_log_has(const struct tpt_daemon *d, const char *needle);

/* Lines of @d's log that contain @needle, or -1 if the log cannot be read. */
int tpt_daemon_log_count(const struct tpt_daemon *d, const char *needle);

/* The memfd mappings daemon @d holds now (its clients' registered buffers among them), or -1
 * if its /proc/PID/maps cannot be read. */
int tpt_daemon_memfd_maps(const struct tpt_daemon *d);

/* A TCP listener on 127.0.0.1 at a port the kernel picks (*@ret_port), backlog 8, for a test
 * that plays a peer daemon. Return: its fd, or -1 (errno set). */
int tpt_loopback_listen(int *ret_port);

/* ---- peering (cross-host pipes between two daemons on this machine) ------------------------ */

/*
 * tpt_daemon_peer_port() - the TCP port the daemon's peer listener is bound to, learnt from its
 * log line "peer listener on ADDR:PORT" (logged before the daemon accepts clients; polled up to
 * @timeout_ms in case a wrapper delays it).
 * Return: the port (1..65535); -ETIMEDOUT or -ECHILD as tpt_daemon_wait_log(); -EBADMSG if the
 * line names no port.
 */
int tpt_daemon_peer_port(const struct tpt_daemon *d, int timeout_ms);

/*
 * tpt_daemon_start_peer() - tpt_daemon_start() with "--peer-listen 127.0.0.1:0
 * --peer-force-cross-host" before @extra_args (a later --peer-listen in @extra_args wins), then
 * learn the bound port into @d->peer_port. The daemon treats other daemons on this machine as
 * remote hosts, so two of them exercise the whole cross-host path over loopback. Without a peer
 * authentication flag in @extra_args it gets --peer-key-file tpt_peer_key_file().
 * Return: 0 or -errno (nothing left running).
 */
int tpt_daemon_start_peer(struct tpt_daemon *d, const char *const *extra_args);

/*
 * tpt_peer_key_file() - the path of a pre-shared peer key file (mode 0600, removed when the test
 * process exits) that every peer daemon of this test process shares.
 * tpt_daemon_start_peer() passes it as --peer-key-file unless @extra_args name --peer-key-file,
 * --peer-cert or --peer-insecure. Return: borrowed path, valid until the process exits.
 */
const char *tpt_peer_key_file(void);

/*
 * tpt_daemon_pair_start() - start @a and @b with tpt_daemon_start_peer(), each with its own
 * extra arguments (NULL: none). Return: 0 or -errno (then neither is left running).
 */
int tpt_daemon_pair_start(struct tpt_daemon *a, const char *const *extra_a, struct tpt_daemon *b,
			  const char *const *extra_b);

/*
 * tpt_peer_address() - write "tpip://127.0.0.1:PORT/NAME" for listener @name on the daemon @d
 * (started with tpt_daemon_start_peer()) into @buf. Return: @buf.
 */
char *tpt_peer_address(const struct tpt_daemon *d, const char *name, char *buf, size_t len);

/* Copies the daemon's log to stderr (for failure diagnostics). */
void tpt_daemon_dump_log(const struct tpt_daemon *d);

/* Makes the temp directory and socket reachable by every uid (for access tests). */
int tpt_daemon_open_to_all(const struct tpt_daemon *d);

/* ---- child processes ---------------------------------------------------------------------- */

typedef int (*tpt_child_fn)(void *arg);

/*
 * tpt_fork() - run @fn(@arg) in a child process that gets PR_SET_PDEATHSIG(SIGKILL) and exits
 * with @fn's return value (0 = success). Call it before creating any tp_context in this process.
 * Return: the child's pid or -errno.
 */
pid_t tpt_fork(tpt_child_fn fn, void *arg);

/* tpt_become() - make this process (a child's) uid and gid @uid with no supplementary groups.
 * Return: 0 or -errno. */
int tpt_become(uid_t uid);

/*
 * tpt_become_user() - tpt_become(@uid), then dumpable again (PR_SET_DUMPABLE) like any process
 * that user starts: the change of uid cleared it, and a non-dumpable client is no CMA target.
 * Prints the reason on failure. Return: 0 or -errno.
 */
int tpt_become_user(uid_t uid);

/*
 * tpt_wait() - wait up to @timeout_ms for child @pid to exit.
 * @ret_status: the raw wait status, or NULL.
 * Return: 0; -ETIMEDOUT (the child is then SIGKILLed and reaped); -errno.
 */
int tpt_wait(pid_t pid, int timeout_ms, int *ret_status);

/* Waits for @pid like tpt_wait() and returns true if it exited with status 0; else prints why. */
bool tpt_wait_ok(pid_t pid, int timeout_ms, const char *what);

/* ---- synchronisation between processes ---------------------------------------------------- */

/* A one-way event channel (a pipe) created before fork; any process may post or wait. */
struct tpt_sync {
	int fd[2];
};

int tpt_sync_init(struct tpt_sync *s);
void tpt_sync_done(struct tpt_sync *s);
/* Posts one event carrying @value (a small code, e.g. a status). Return: 0 or -errno. */
int tpt_sync_post(struct tpt_sync *s, int8_t value);
/* Waits for one event. Return: its value (>= -128), -ETIMEDOUT, -EPIPE if every poster is gone. */
int tpt_sync_wait(struct tpt_sync *s, int timeout_ms);

/*
 * tpt_cpu_beside() - does another user's load slow what @probe(@arg) costs daemon @pid? The
 * ticks of @pid's CPU time @probe takes alone, then again while child @hog (forked: it posts
 * @ready once it holds its load, up to @ready_ms, then waits for @done) holds its load; prints
 * both under @what, and lets @hog go. Ticks, not the wall clock: other work on the machine does
 * not count. Return: 0 with *@ret_alone and *@ret_beside, or -1 (said why).
 */
int tpt_cpu_beside(pid_t pid, long (*probe)(void *), void *arg, tpt_child_fn hog,
		   struct tpt_sync *ready, struct tpt_sync *done, int ready_ms, const char *what,
		   long *ret_alone, long *ret_beside);

/* Whether @beside is within what @alone allows: twice and a quarter second of ticks of slack
 * (ticks are coarse, the machine's caches shared). */
bool tpt_cpu_beside_ok(long alone, long beside);

/* ---- byte patterns ------------------------------------------------------------------------- */

/* Seed for segment @seg of message @msg on pipe @pipe: distinct across all three. */
uint64_t tpt_seed(unsigned pipe, unsigned msg, unsigned seg);

/* Fills @len bytes with the pattern of @seed (position dependent, fast for large buffers). */
void tpt_fill(void *buf, size_t len, uint64_t seed);

/*
 * tpt_verify() - check @len bytes against the pattern of @seed.
 * Return: true if equal; else false and, if @ret_off, the offset of the first bad byte.
 */
bool tpt_verify(const void *buf, size_t len, uint64_t seed, size_t *ret_off);

/* ---- commands ---------------------------------------------------------------------------- */

struct tpt_cmd_result {
	int status; /* raw wait status */
	char *out;  /* stdout, NUL-terminated, free() it */
	size_t out_len;
	char *err;  /* stderr, NUL-terminated, free() it */
};

/*
 * tpt_run() - run @argv (argv[0] is a path) with stdin from /dev/null, capturing stdout and
 * stderr, for at most @timeout_ms (then SIGKILL).
 * Return: 0 with @ret filled (free with tpt_cmd_result_free()), -ETIMEDOUT, -errno.
 */
int tpt_run(const char *const *argv, int timeout_ms, struct tpt_cmd_result *ret);
void tpt_cmd_result_free(struct tpt_cmd_result *r);

/* ---- time -------------------------------------------------------------------------------- */

/* Milliseconds on the monotonic clock. */
uint64_t tpt_now_ms(void);

/* CPU time process @pid used so far (user and system, all its threads), in clock ticks
 * (sysconf(_SC_CLK_TCK) a second), or -1. */
long tpt_cpu_ticks(pid_t pid);

/* Short poll backoff for condition loops: sleeps 1 ms, doubling per @round up to 20 ms. */
void tpt_backoff(unsigned round);

/* Prints a line prefixed with the pid to stderr (children report failures this way). */
void tpt_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/*
 * TPT_REQUIRE() - for code running in a forked child: on failure print the condition and
 * location, then return @ret from the enclosing function.
 */
#define TPT_REQUIRE(cond, ret, fmt, ...)                                                           \
	do {                                                                                       \
		if (!(cond)) {                                                                     \
			tpt_log("%s:%d: %s failed: " fmt, __FILE__, __LINE__, #cond,              \
				##__VA_ARGS__);                                                    \
			return (ret);                                                              \
		}                                                                                  \
	} while (0)

#endif
