/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Daemon state, control socket, accept loop, signals and graceful stop. See daemon.h.
 */
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include "buffer.h"
#include "ctl.h"
#include "daemon.h"
#include "frame.h"
#include "group.h"
#include "chan.h"
#include "wq.h"
#include "rdma/rdma.h"
#include "peer.h"
#include "local.h"
#include "log.h"
#include "metrics.h"
#include "pipe.h"
#include "notify.h"
#include "session.h"
#include "tpb.h"
#include "tpconfig.h"

#define ACCEPT_BATCH 32
#define DRAIN_POLL_MS 10
#define STATUS_PERIOD_US 2000000ull

static void daemon_on_accept(evutil_socket_t fd, short what, void *arg);

static bool daemon_bulk_running(const struct tpd_daemon *d)
{
	return tpb_copier_busy(d->copier) || tpd_broker_busy(d->broker);
}

/* Refuses to take over a socket another daemon is serving; removes a stale one. */
static int socket_take_path(const struct sockaddr_un *sun)
{
	_cleanup_close_ int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct stat st;

	if (lstat(sun->sun_path, &st) < 0)
		return errno == ENOENT ? 0 : -errno;
	if (!S_ISSOCK(st.st_mode))
		return -EEXIST;
	if (fd >= 0 && connect(fd, (const struct sockaddr *)sun, sizeof(*sun)) == 0)
		return -EADDRINUSE;
	if (unlink(sun->sun_path) < 0 && errno != ENOENT)
		return -errno;
	return 0;
}

static void make_parent_dir(const char *path)
{
	char dir[sizeof(((struct sockaddr_un *)0)->sun_path)];
	char *slash;

	snprintf(dir, sizeof(dir), "%s", path);
	slash = strrchr(dir, '/');
	if (!slash || slash == dir)
		return;
	*slash = '\0';
	if (mkdir(dir, 0755) < 0 && errno != EEXIST)
		tpu_log_warn("cannot create %s: %m", dir);
}

/*
 * Refuses a socket directory in which another user could swap files: one owned by neither root
 * nor the daemon's uid, or writable by group or others (a sticky /tmp included: anyone may
 * create the name first there). Return: 0, -EPERM (logged) or -errno.
 */
static int socket_check_dir(const char *path)
{
	char dir[sizeof(((struct sockaddr_un *)0)->sun_path)];
	_cleanup_close_ int fd = -EBADF;
	char *slash;
	struct stat st;

	snprintf(dir, sizeof(dir), "%s", path);
	slash = strrchr(dir, '/');
	if (!slash)
		snprintf(dir, sizeof(dir), ".");
	else if (slash == dir)
		slash[1] = '\0';
	else
		*slash = '\0';
	fd = open(dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0 || fstat(fd, &st) < 0) {
		int r = -errno;
		tpu_log_err("cannot use socket directory %s: %s", dir, strerror(-r));
		return r;
	}
	if (st.st_uid != 0 && st.st_uid != geteuid()) {
		tpu_log_err("refusing socket directory %s: owned by uid %u, not by root or tpipd's "
			    "uid %u (another user could replace the socket)", dir,
			    (unsigned)st.st_uid, (unsigned)geteuid());
		return -EPERM;
	}
	if (st.st_mode & (S_IWGRP | S_IWOTH)) {
		tpu_log_err("refusing socket directory %s: mode %04o lets other users create or "
			    "replace files in it; use a directory only root or uid %u can write, "
			    "such as /run/tpipd or $XDG_RUNTIME_DIR", dir,
			    (unsigned)(st.st_mode & 07777), (unsigned)geteuid());
		return -EPERM;
	}
	return 0;
}

/* Uses the socket passed by socket activation. Return: 1 if one was, 0 if none, < 0 error. */
static int socket_adopt(struct tpd_daemon *d)
{
	struct sockaddr_un sun = { 0 };
	socklen_t len = sizeof(sun);
	int fd = tpd_notify_listen_fd();

	if (fd == -ENOENT)
		return 0;
	if (fd < 0)
		return fd;
	if (tpu_fd_nonblock(fd) < 0 || fcntl(fd, F_SETFD, FD_CLOEXEC) < 0) {
		tpu_close(fd);
		return -errno;
	}
	if (getsockname(fd, (struct sockaddr *)&sun, &len) == 0 && sun.sun_path[0])
		snprintf(d->socket_path, sizeof(d->socket_path), "%s", sun.sun_path);
	else
		snprintf(d->socket_path, sizeof(d->socket_path), "(socket activation)");
	d->listen_fd = fd;
	d->socket_activated = true;
	tpu_log_info("using control socket %s from socket activation", d->socket_path);
	return 1;
}

static int socket_bind(struct tpd_daemon *d)
{
	struct sockaddr_un sun = { .sun_family = AF_UNIX };
	_cleanup_close_ int fd = -EBADF;
	mode_t old_mask;
	int r;

	r = socket_adopt(d);
	if (r != 0)
		return r < 0 ? r : 0;
	r = tpu_socket_path(d->cfg.socket_path[0] ? d->cfg.socket_path : NULL, sun.sun_path,
			    sizeof(sun.sun_path));
	if (r < 0) {
		tpu_log_err("no control socket path: pass --socket or set $TPIPD_SOCKET or "
			    "$XDG_RUNTIME_DIR");
		return r;
	}
	snprintf(d->socket_path, sizeof(d->socket_path), "%s", sun.sun_path);
	make_parent_dir(sun.sun_path);
	r = socket_check_dir(sun.sun_path);
	if (r < 0)
		return r;
	r = socket_take_path(&sun);
	if (r < 0) {
		tpu_log_err("cannot use %s: %s", sun.sun_path,
			    r == -EADDRINUSE ? "another tpipd is serving it" : strerror(-r));
		return r;
	}
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0)
		return -errno;
	/* Every user may connect (who may reach whom is decided per listener from peer
	 * credentials): the mode is set by bind() itself, never by a chmod() of the path that
	 * would follow a link swapped in after it. */
	old_mask = umask(0111);
	r = bind(fd, (struct sockaddr *)&sun, sizeof(sun)) < 0 ? -errno : 0;
	umask(old_mask);
	if (r < 0) {
		tpu_log_err("cannot bind %s: %s", sun.sun_path, strerror(-r));
		return r;
	}
	d->socket_bound = true;
	if (listen(fd, 128) < 0)
		return -errno;
	d->listen_fd = TAKE_FD(fd);
	return 0;
}

static void daemon_on_accept_resume(evutil_socket_t fd, short what, void *arg)
{
	struct tpd_daemon *d = arg;

	if (!d->stopping)
		event_add(d->ev_accept, NULL);
}

static void daemon_on_accept(evutil_socket_t lfd, short what, void *arg)
{
	struct tpd_daemon *d = arg;

	for (int i = 0; i < ACCEPT_BATCH; i++) {
		struct tpd_session *s;
		int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);

		if (fd < 0) {
			struct timeval one = { 1, 0 };
			unsigned suppressed;

			if (errno == EAGAIN || errno == EINTR || errno == ECONNABORTED)
				return;
			if (tpd_quota_ratelog_ok(&d->accept_log, 10000, &suppressed))
				tpu_log_warn("accept failed: %m; pausing accepts for 1 s (%u more "
					     "pauses since the last such line)", suppressed);
			event_del(d->ev_accept);
			tpd_timer_add(d->ev_accept_resume, &one);
			return;
		}
		/* Limits (sessions-max, per uid, reserved slots) are checked against the
		 * client's credentials; a refused client is told why (session.c). */
		tpd_session_new(d, fd, &s);
	}
}

static void finish_stop(struct tpd_daemon *d)
{
	tpd_peers_stop(d); /* cross-host pipes learn "daemon stopping" first */
	tpd_local_stop(d->local);
	event_base_loopbreak(d->base);
}

static void daemon_on_drain(evutil_socket_t fd, short what, void *arg)
{
	struct tpd_daemon *d = arg;
	struct timeval tv = { 0, DRAIN_POLL_MS * 1000 };

	if (tpb_copier_busy(d->copier) == 0 || tpu_now_ns() >= d->drain_deadline_ns) {
		if (tpb_copier_busy(d->copier))
			tpu_log_warn("drain deadline passed with %u copies in flight",
				     tpb_copier_busy(d->copier));
		finish_stop(d);
		return;
	}
	tpd_timer_add(d->ev_drain, &tv);
}

static void daemon_stop(struct tpd_daemon *d, const char *why)
{
	char status[96];

	/* Never finish here: the caller may be a session's own handler. The drain event runs
	 * on the next loop iteration and decides. */
	if (d->stopping) {
		tpu_log_notice("%s again, stopping now", why);
		d->drain_deadline_ns = 0;
		event_active(d->ev_drain, 0, 0);
		return;
	}
	tpu_log_notice("stopping (%s): no new clients, draining copies", why);
	snprintf(status, sizeof(status), "Stopping: draining %u copies",
		 tpb_copier_busy(d->copier));
	tpd_notify_stopping(status);
	d->stopping = true;
	event_del(d->ev_accept);
	event_del(d->ev_accept_resume);
	d->drain_deadline_ns = tpu_now_ns() + (uint64_t)d->cfg.drain_ms * 1000000ull;
	event_active(d->ev_drain, 0, 0);
}

static void daemon_on_signal(evutil_socket_t sig, short what, void *arg)
{
	struct tpd_daemon *d = arg;

	if (sig == SIGHUP) {
		if (!d->stopping)
			tpd_daemon_reload(d);
		return;
	}
	daemon_stop(d, sig == SIGINT ? "SIGINT" : "SIGTERM");
}

static void update_status(struct tpd_daemon *d)
{
	char status[160];

	snprintf(status, sizeof(status), "Serving on %s: %u clients, %u pipes, %llu messages moved",
		 d->socket_path, tpd_local_session_count(d->local), tpd_broker_pipe_count(d->broker),
		 (unsigned long long)tpd_broker_messages_moved(d->broker));
	if (strcmp(status, d->last_status) != 0) {
		tpd_notify_status(status);
		memcpy(d->last_status, status, sizeof(status));
	}
}

/* Runs on the loop thread, so a WATCHDOG=1 proves the loop is turning. */
static void daemon_on_tick(evutil_socket_t fd, short what, void *arg)
{
	struct tpd_daemon *d = arg;

	if (d->watchdog_usec)
		tpd_notify_watchdog();
	if (!d->stopping)
		update_status(d);
}

static int setup_tick(struct tpd_daemon *d)
{
	uint64_t period = STATUS_PERIOD_US;
	struct timeval tv;

	d->watchdog_usec = tpd_notify_watchdog_usec();
	if (!d->watchdog_usec && !tpd_notify_enabled())
		return 0; /* no service manager to tell: an idle daemon never wakes up */
	if (d->watchdog_usec && d->watchdog_usec / 2 < period)
		period = d->watchdog_usec / 2;
	tv.tv_sec = (time_t)(period / 1000000);
	tv.tv_usec = (suseconds_t)(period % 1000000);
	d->ev_tick = event_new(d->base, -1, EV_PERSIST, daemon_on_tick, d);
	if (!d->ev_tick || tpd_timer_add(d->ev_tick, &tv) < 0)
		return -ENOMEM;
	return 0;
}

int tpd_daemon_reload(struct tpd_daemon *d)
{
	struct tpd_config n, live;
	char err[512], restart[512];
	int r, changed;

	tpd_notify_reloading();
	r = tpd_config_reload(&d->cfg, &n, err, sizeof(err));
	if (r < 0) {
		tpu_log_err("reload failed, the running configuration stays: %s", err);
		tpd_notify_ready(d->last_status);
		return r;
	}
	changed = tpd_config_diff(&d->cfg, &n, &live, restart, sizeof(restart));
	d->cfg = live;
	d->limits = live.wire;
	tpb_rdma_set_cache(d->gdr, live.rdma_cache);
	tpu_log_set_level(live.log_level);
	tpu_log_notice("reloaded %s: %d option%s changed%s%s", d->cfg.config_path, changed,
		       changed == 1 ? "" : "s", restart[0] ? "; needs a restart: " : "", restart);
	tpd_notify_ready(d->last_status);
	return 0;
}

/*
 * SIGTERM, SIGINT and SIGHUP are the loop's from here on. Installed before the control socket
 * listens: a client may connect, and a service manager stop the daemon, as soon as it does, and
 * a signal with its default action would kill the daemon (status 143) instead of stopping it.
 */
static void daemon_on_copier(evutil_socket_t fd, short what, void *arg)
{
	struct tpd_daemon *d = arg;

	tpb_copier_progress(d->copier);
}

static void daemon_on_mpt(evutil_socket_t fd, short what, void *arg)
{
	struct tpd_daemon *d = arg;

	tpb_progress(d->mpt);
}

/* The copy threads and the mpt channel complete through their event fds: run their
 * completions from the loop. */
static int watch_engines(struct tpd_daemon *d)
{
	int r;

	d->ev_copier = event_new(d->base, tpb_copier_event_fd(d->copier), EV_READ | EV_PERSIST,
				 daemon_on_copier, d);
	if (!d->ev_copier || event_add(d->ev_copier, NULL) < 0)
		return -ENOMEM;
	r = tpb_ctx_new(tpb_index("mpt"), NULL, NULL, &d->mpt);
	if (r < 0)
		return r;
	d->ev_mpt = event_new(d->base, tpb_event_fd(d->mpt), EV_READ | EV_PERSIST, daemon_on_mpt,
			      d);
	if (!d->ev_mpt || event_add(d->ev_mpt, NULL) < 0)
		return -ENOMEM;
	return 0;
}

static int setup_signals(struct tpd_daemon *d)
{
	static const int sigs[] = { SIGTERM, SIGINT, SIGHUP };

	for (size_t i = 0; i < TPU_ARRAY_SIZE(sigs); i++) {
		d->ev_signals[i] = evsignal_new(d->base, sigs[i], daemon_on_signal, d);
		if (!d->ev_signals[i] || event_add(d->ev_signals[i], NULL) < 0)
			return -ENOMEM;
	}
	return 0;
}

static int setup_events(struct tpd_daemon *d)
{
	d->ev_accept = event_new(d->base, d->listen_fd, EV_READ | EV_PERSIST, daemon_on_accept, d);
	d->ev_accept_resume = evtimer_new(d->base, daemon_on_accept_resume, d);
	d->ev_drain = evtimer_new(d->base, daemon_on_drain, d);
	if (!d->ev_accept || !d->ev_accept_resume || !d->ev_drain)
		return -ENOMEM;
	if (setup_tick(d) < 0)
		return -ENOMEM;
	return event_add(d->ev_accept, NULL) < 0 ? -EIO : 0;
}

/* ---- rdma and cuda_gdr: the context backends/rdma needs, and its event fd on the loop ---- */

static void rdma_on_event(evutil_socket_t fd, short what, void *arg)
{
	tpb_progress(arg);
}

/* Makes rdma's context through the op table and watches its event fd; none where the registry
 * found rdma not viable (no port, --no-rdma, built without rdma-core). */
static int rdma_start(struct tpd_daemon *d)
{
	struct tpb_rdma_config rc = {
		.disabled = d->cfg.no_rdma,
		.cache_bytes = d->cfg.rdma_cache,
		.traffic_class = (uint8_t)d->cfg.rdma_traffic_class,
		.sl = (uint8_t)d->cfg.rdma_sl,
		.timeout = (uint8_t)d->cfg.rdma_timeout,
		.retry = (uint8_t)d->cfg.rdma_retry,
		.gid_index_set = d->cfg.rdma_gid_index != UINT32_MAX,
		.gid_index = d->cfg.rdma_gid_index,
		.rebuild_ms = d->cfg.rdma_rebuild_ms,
		.rebuild_max = d->cfg.rdma_rebuild_max,
		.ports_max = TPW_RDMA_PORTS_MAX,
		/* no link_ops: each link brings its own when it opens its endpoints (peerhs.c) */
	};
	struct tpb_config bc = { .rdma_disabled = d->cfg.no_rdma, .rdma = &rc };
	struct tpb_ctx *ctx;
	int fd, r = tpb_ctx_new(tpb_index("rdma"), &bc, NULL, &ctx);

	if (r == -ENODEV || r == -EOPNOTSUPP)
		return 0; /* the registry said why, at start-up */
	if (r < 0)
		return r;
	d->gdr = tpb_rdma_of(ctx);
	fd = tpb_event_fd(ctx);
	if (fd < 0)
		return fd;
	d->ev_rdma = event_new(d->base, fd, EV_READ | EV_PERSIST, rdma_on_event, ctx);
	if (!d->ev_rdma || event_add(d->ev_rdma, NULL) < 0)
		return -ENOMEM;
	return 0;
}

static void probe_backends(struct tpd_daemon *d)
{
	struct tpb_config bc = { .cma_disabled = d->cfg.no_cma, .shm_disabled = d->cfg.no_shm,
				 .rdma_disabled = d->cfg.no_rdma, .priority = d->cfg.backend_priority };
	const struct tpb_channel_info *ch;
	size_t n;

	if (tpb_registry_init(&bc) < 0)
		tpu_log_warn("backend-priority '%s' names an unknown channel; using the built-in "
			     "order", d->cfg.backend_priority);
	ch = tpb_registry_list(&n);
	for (size_t i = 0; i < n; i++) {
		tpu_log_info("channel %s (priority %zu): %s%s%s", ch[i].ops->name, i,
			     ch[i].viable ? "viable" : "not viable", ch[i].why[0] ? ": " : "",
			     ch[i].why);
		if (strcmp(ch[i].ops->name, "cma") == 0)
			d->cma_viable = ch[i].viable;
	}
	if (!d->cma_viable)
		return;
	if (tpb_cma_as_probe())
		tpu_log_info("cma: copies run with each client's own uid and gid (kernel ptrace "
			     "check as the client)");
	else
		tpu_log_info("cma: no CAP_SETUID/CAP_SETGID, so CMA only for clients of uid %u "
			     "(others stage through shared buffers)", (unsigned)geteuid());
}

static const struct tpd_daemon_ops daemon_ops = {
	.stop = daemon_stop,
	.bulk_running = daemon_bulk_running,
};

int tpd_daemon_new(const struct tpd_config *cfg, struct tpd_daemon **ret)
{
	struct tpd_daemon *d = calloc(1, sizeof(*d));
	int r;

	if (!d)
		return -ENOMEM;
	d->ops = &daemon_ops;
	d->cfg = *cfg;
	d->limits = cfg->wire;
	d->listen_fd = -EBADF;
	d->start_ns = tpu_now_ns();
	tpd_listener_registry_init(&d->registry);
	tpd_quota_init(&d->quota);
	r = tpd_broker_new(&d->broker);
	if (r < 0)
		goto fail;
	r = -ENOMEM;
	/* libevent's coarse clock (a tick of up to 4 ms stale): its precise one re-arms a timerfd on
	 * every loop pass. Timers go through tpd_timer_add(), which pads them by a tick so that none
	 * fires early (a channel write's 100 ms timeout must not end after 97 ms). */
	d->base = event_base_new();
	if (!d->base)
		goto fail;
	r = tpd_local_new(d, &d->local);
	if (r < 0)
		goto fail;
	tpd_broker_serve_local(d->local); /* sessions hand pipe messages up through its ops */
	r = tpd_group_new(d, &d->groups);
	if (r < 0)
		goto fail;
	tpd_group_serve_local(d->local); /* and group messages through this part's */
	r = tpd_chan_new(d, &d->chans);
	if (r < 0)
		goto fail;
	tpd_chan_serve_local(d->local);
	r = tpd_wq_new(d, &d->wqs);
	if (r < 0)
		goto fail;
	tpd_wq_serve_local(d->local);
	probe_backends(d);
	r = tpb_copier_new(cfg->copy_threads, &d->copier);
	if (r < 0)
		goto fail;
	r = watch_engines(d);
	if (r < 0)
		goto fail;
	r = setup_signals(d);
	if (r < 0)
		goto fail;
	r = socket_bind(d);
	if (r < 0)
		goto fail;
	r = setup_events(d);
	if (r < 0)
		goto fail;
	r = rdma_start(d);
	if (r < 0)
		goto fail;
	tpd_ctl_start(); /* sessions hand CtlRequest up through the handler it registers */
	tpd_xpipe_start(); /* the peer part calls the broker through its pipe ops */
	r = tpd_peers_new(d, &d->peers);
	if (r < 0)
		goto fail;
	r = tpd_peers_start(d);
	if (r < 0)
		goto fail;
	if (cfg->metrics_listen[0]) {
		r = tpd_metrics_start(d, cfg->metrics_listen, cfg->metrics_allow_remote,
				      &d->metrics);
		if (r < 0)
			goto fail;
	}
	*ret = d;
	return 0;
fail:
	tpd_daemon_free(d);
	return r;
}

int tpd_daemon_run(struct tpd_daemon *d)
{
	char status[160];

	snprintf(status, sizeof(status), "Serving on %s", d->socket_path);
	memcpy(d->last_status, status, sizeof(status));
	tpd_notify_ready(status);
	tpu_log_notice("tpipd %s ready on %s (pid %d, %u copy threads%s)", TP_VERSION,
		       d->socket_path, (int)getpid(), d->cfg.copy_threads,
		       d->watchdog_usec ? ", watchdog on" : "");
	/* One pass at a time, so that the control frames a pass queued go out together at its
	 * end. Like event_base_dispatch(): until a break, or no event is left. */
	for (;;) {
		int r = event_base_loop(d->base, EVLOOP_ONCE);

		tpd_pipes_flow_flush(d);
		tpd_peers_flush(d);
		if (r < 0)
			return -EIO;
		if (r > 0 || event_base_got_break(d->base) || event_base_got_exit(d->base))
			break;
	}
	tpu_log_notice("tpipd stopped");
	return 0;
}

void tpd_daemon_free(struct tpd_daemon *d)
{
	if (!d)
		return;
	tpd_peers_stop(d);
	tpd_local_stop(d->local);
	tpd_metrics_free(d->metrics);
	if (d->ev_copier)
		event_free(d->ev_copier);
	tpb_copier_free(d->copier);
	if (d->ev_mpt)
		event_free(d->ev_mpt);
	tpb_ctx_free(d->mpt); /* the links are gone: what they owed has been delivered */
	if (d->ev_rdma)
		event_free(d->ev_rdma);
	tpb_ctx_free(tpb_rdma_ctx(d->gdr));
	d->gdr = NULL;
	tpd_listener_registry_done(&d->registry);
	for (size_t i = 0; i < TPU_ARRAY_SIZE(d->ev_signals); i++)
		if (d->ev_signals[i])
			event_free(d->ev_signals[i]);
	if (d->ev_accept)
		event_free(d->ev_accept);
	if (d->ev_accept_resume)
		event_free(d->ev_accept_resume);
	if (d->ev_drain)
		event_free(d->ev_drain);
	tpd_local_free(d->local);
	if (d->ev_tick)
		event_free(d->ev_tick);
	if (d->socket_bound)
		unlink(d->socket_path);
	tpu_close(d->listen_fd);
	tpd_peers_free(d->peers); /* after every other event: it runs the loop once */
	d->peers = NULL;
	tpd_broker_free(d->broker);
	tpd_group_free(d->groups); /* after the sessions: they leave their groups */
	tpd_chan_free(d->chans);
	tpd_wq_free(d->wqs);
	/* after everything that may hold a client's kept fd (buffers in channel items, copies) */
	tpd_quota_done(&d->quota);
	if (d->base)
		event_base_free(d->base);
	free(d);
}
