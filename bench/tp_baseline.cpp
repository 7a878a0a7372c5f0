/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * tp_baseline: the same-host measurements of bench_latency and bench_throughput, made with
 * TensorPipe (the installed libtensorpipe, through its public API only) instead of tpipd, so
 * that bench/run.sh can set tpipd's figures next to an established library's, measured in the
 * same run. Each session forks its peer before either process creates a tensorpipe::Context;
 * both register the shm transport and one channel. Sessions: round-trip latency of 8 B metadata
 * and of 8 B metadata + one 64 B CPU tensor (shm+basic); one-way throughput of one CPU tensor
 * per message with k writes in flight, credits from the reader, and a phase that ends when the
 * reader has read the message flagged last (shm+cma, then shm+basic), and the 4 KiB message
 * rate (shm+basic). On request (-c u, m), the same latency and throughput cases over TCP: the uv
 * transport and the mpt channel with -L lanes, between -H (the peer) and -A (the driver's lanes),
 * with the peer optionally in another network namespace (-N); bench/run_xhost.sh compares them
 * with a pipe across two daemons. Memory is private (malloc) on both sides. When a transport or
 * channel is
 * not viable here, or the pipe cannot be established, it says why and prints a "skipped" row.
 * Figures only, never a verdict; it measures nothing of tpipd and needs no daemon. This file
 * holds the pipe helpers, set-up, the latency case and the driver; tp_baseline_tput.cpp the
 * throughput reader and writer.
 */
#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <getopt.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tp_baseline.h"

namespace tpb {

static const std::string kLatQuit(8, '\xff');
static char lat_sbuf[kLatTensor];
static char lat_rbuf[kLatTensor];

/* ---- the pipe, made synchronous where the benchmark waits -------------------------------- */

/* c.why keeps the failure without TensorPipe's "(this error originated at FILE:LINE)". */
void fail_locked(Conn &c, int err, const std::string &what)
{
	if (c.err == 0) {
		if (!c.closing)
			fprintf(stderr, "tp_baseline: %s\n", what.c_str());
		c.err = err;
		c.why = what.substr(0, what.find(" (this error originated"));
	}
	c.cv.notify_all();
}

void fail(Conn &c, int err, const std::string &what)
{
	std::lock_guard<std::mutex> lk(c.mu);

	fail_locked(c, err, what);
}

int conn_write(Conn &c, tp::Message m, long max)
{
	{
		std::lock_guard<std::mutex> lk(c.mu);
		c.pending++;
	}
	c.pipe->write(std::move(m), [&c](const tp::Error &e) {
		std::lock_guard<std::mutex> lk(c.mu);

		c.pending--;
		if (e)
			fail_locked(c, -EIO, "write: " + e.what());
		c.cv.notify_all();
	});
	if (max < 0)
		return 0;
	std::unique_lock<std::mutex> lk(c.mu);
	return wait_until(c, lk, "write", [&c, max] { return c.pending <= max; });
}

int conn_read_desc(Conn &c, tp::Descriptor &ret)
{
	{
		std::lock_guard<std::mutex> lk(c.mu);
		c.have_desc = false;
	}
	c.pipe->readDescriptor([&c](const tp::Error &e, tp::Descriptor d) {
		std::lock_guard<std::mutex> lk(c.mu);

		if (e) {
			fail_locked(c, -EIO, "readDescriptor: " + e.what());
			return;
		}
		c.desc = std::move(d);
		c.have_desc = true;
		c.cv.notify_all();
	});
	std::unique_lock<std::mutex> lk(c.mu);
	int r = wait_until(c, lk, "readDescriptor", [&c] { return c.have_desc; });
	if (r == 0)
		ret = std::move(c.desc);
	return r;
}

int conn_read(Conn &c, tp::Allocation a)
{
	{
		std::lock_guard<std::mutex> lk(c.mu);
		c.read_done = false;
	}
	c.pipe->read(std::move(a), [&c](const tp::Error &e) {
		std::lock_guard<std::mutex> lk(c.mu);

		if (e) {
			fail_locked(c, -EIO, "read: " + e.what());
			return;
		}
		c.read_done = true;
		c.cv.notify_all();
	});
	std::unique_lock<std::mutex> lk(c.mu);
	return wait_until(c, lk, "read", [&c] { return c.read_done; });
}

tp::Message make_msg(std::string meta, void *data, size_t len)
{
	tp::Message m;

	m.metadata = std::move(meta);
	if (data) {
		tp::Message::Tensor t;
		t.buffer = tp::CpuBuffer{ data };
		t.length = len;
		m.tensors.push_back(std::move(t));
	}
	return m;
}

tp::Allocation make_alloc(void *data)
{
	tp::Allocation a;

	if (data) {
		tp::Allocation::Tensor t;
		t.buffer = tp::CpuBuffer{ data };
		a.tensors.push_back(std::move(t));
	}
	return a;
}

/* Page-aligned private memory with every page touched. Return: nullptr if out of memory. */
void *buf_get(size_t size)
{
	void *p = nullptr;

	if (posix_memalign(&p, 4096, size) != 0)
		return nullptr;
	memset(p, 0xa5, size);
	return p;
}

/* ---- set-up and tear-down --------------------------------------------------------------- */

/* Closes and joins transport and channel contexts that will not be registered. */
template <typename T> static void drop(std::shared_ptr<T> &x)
{
	if (x) {
		x->close();
		x->join();
	}
}

/* "HOST:PORT", with brackets around an IPv6 HOST: the uv transport's address syntax. */
static std::string host_port(const std::string &host, int port)
{
	bool v6 = host.find(':') != std::string::npos;

	return (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

/*
 * A context with the uv transport and the mpt channel over o.lanes uv lanes, each listening on
 * @host (the address the other process reaches this one at), or nullptr and @why.
 */
static std::shared_ptr<tp::Context> make_uv_context(const Session &s, const char *name,
						     const std::string &host, std::string &why)
{
	std::shared_ptr<tp::transport::Context> uv = tp::transport::uv::create();
	std::vector<std::shared_ptr<tp::transport::Context>> lanes;
	std::vector<std::shared_ptr<tp::transport::Listener>> listeners;

	if (!uv->isViable()) {
		why = "TensorPipe's uv transport is not viable here";
		drop(uv);
		return nullptr;
	}
	for (int i = 0; i < s.o->lanes; i++) {
		lanes.push_back(tp::transport::uv::create());
		listeners.push_back(lanes.back()->listen(host_port(host, 0)));
	}
	auto ch = tp::channel::mpt::create(std::move(lanes), std::move(listeners));
	auto ctx = std::make_shared<tp::Context>(tp::ContextOptions().name(name));
	ctx->registerTransport(0, "uv", uv);
	ctx->registerChannel(0, "mpt", ch);
	return ctx;
}

/* A context with the shm transport and the session's channel, or nullptr and @why. */
static std::shared_ptr<tp::Context> try_make_context(const Session &s, const char *name,
						      bool peer, std::string &why)
{
	std::shared_ptr<tp::transport::Context> shm;
	std::shared_ptr<tp::channel::Context> ch;

	if (strcmp(s.transport, "uv") == 0)
		return make_uv_context(s, name,
				       peer || s.o->driver_host.empty() ? s.o->peer_host :
									  s.o->driver_host,
				       why);
#if TENSORPIPE_HAS_SHM_TRANSPORT
	shm = tp::transport::shm::create();
#endif
	if (strcmp(s.channel, "basic") == 0)
		ch = tp::channel::basic::create();
#if TENSORPIPE_HAS_CMA_CHANNEL
	else if (strcmp(s.channel, "cma") == 0)
		ch = tp::channel::cma::create();
#endif
	if (!shm)
		why = "this TensorPipe was built without the shm transport";
	else if (!ch)
		why = std::string("this TensorPipe was built without the channel ") + s.channel;
	else if (!shm->isViable())
		why = "TensorPipe's shm transport is not viable here";
	else if (!ch->isViable())
		why = std::string("TensorPipe's ") + s.channel + " channel is not viable here";
	if (!why.empty()) {
		drop(shm);
		drop(ch);
		return nullptr;
	}
	auto ctx = std::make_shared<tp::Context>(tp::ContextOptions().name(name));
	ctx->registerTransport(0, "shm", shm);
	ctx->registerChannel(0, s.channel, ch);
	return ctx;
}

/* @peer: for the listening process (its lanes listen on the peer's address). */
static std::shared_ptr<tp::Context> make_context(const Session &s, const char *name, bool peer,
						  std::string &why)
{
	try {
		return try_make_context(s, name, peer, why);
	} catch (const std::exception &e) {
		why = std::string("TensorPipe set-up: ") + e.what();
		return nullptr;
	}
}

/* Closes everything; afterwards no callback runs. Also what the destructor does, first. */
static void conn_close(Conn &c)
{
	{
		std::lock_guard<std::mutex> lk(c.mu);
		c.closing = true;
	}
	if (c.pipe)
		c.pipe->close();
	if (c.listener)
		c.listener->close();
	if (c.ctx) {
		c.ctx->close();
		c.ctx->join();
	}
	c.pipe.reset();
	c.listener.reset();
	c.ctx.reset();
}

/* The callbacks use this object's mutex: join the context before the members go. */
Conn::~Conn()
{
	conn_close(*this);
	for (auto &s : slots)
		free(s.data);
}

/* The peer's last step: its writes complete, then it waits for the driver to close the pipe. */
static int conn_linger(Conn &c)
{
	std::unique_lock<std::mutex> lk(c.mu);
	int r = wait_until(c, lk, "last write", [&c] { return c.pending == 0; });

	c.closing = true;
	lk.unlock();
	if (r < 0)
		return r;
	c.pipe->readDescriptor([&c](const tp::Error &e, tp::Descriptor) {
		fail(c, -EPIPE, e ? e.what() : "unexpected message after the end");
	});
	lk.lock();
	wait_until(c, lk, "close", [] { return false; });
	return 0;
}

/* Reads a message of at most one tensor of at most kLatTensor bytes and writes it back. */
int echo(Conn &c, const tp::Descriptor &d)
{
	bool t = d.tensors.size() == 1;

	if (!d.payloads.empty() || d.tensors.size() > 1 ||
	    (t && d.tensors[0].length > kLatTensor)) {
		fail(c, -EBADMSG, "peer: unexpected message shape");
		return -EBADMSG;
	}
	int r = conn_read(c, make_alloc(t ? lat_rbuf : nullptr));
	if (r == 0)
		r = conn_write(c, make_msg(d.metadata, t ? lat_sbuf : nullptr,
					   t ? d.tensors[0].length : 0),
			       kLatPendingMax);
	return r;
}

/* The driver's first exchange, through the session's channel: can the pipe carry a tensor? */
static int hello(Conn &c)
{
	tp::Descriptor d;
	int r = conn_write(c, make_msg(kHello, lat_sbuf, kLatTensor), 0);

	if (r == 0)
		r = conn_read_desc(c, d);
	if (r == 0 && (d.metadata != kHello || d.tensors.size() != 1)) {
		fail(c, -EBADMSG, "hello: unexpected reply");
		r = -EBADMSG;
	}
	if (r == 0)
		r = conn_read(c, make_alloc(lat_rbuf));
	return r;
}

/* ---- latency ----------------------------------------------------------------------------- */

static int lat_serve(Conn &c, const Opts &)
{
	for (;;) {
		tp::Descriptor d;
		int r = conn_read_desc(c, d);

		if (r == 0)
			r = echo(c, d);
		if (r < 0 || d.metadata == kLatQuit)
			return r;
	}
}

/* One round trip: write @meta (+ a 64 B tensor), read the echo's descriptor, then the echo. */
static int lat_round(Conn &c, const std::string &meta, bool tensor)
{
	tp::Descriptor d;
	int r = conn_write(c, make_msg(meta, tensor ? lat_sbuf : nullptr, kLatTensor),
			   kLatPendingMax);

	if (r == 0)
		r = conn_read_desc(c, d);
	if (r == 0 && (d.metadata != meta || d.tensors.size() != (tensor ? 1u : 0u))) {
		fail(c, -EBADMSG, "latency: unexpected reply");
		r = -EBADMSG;
	}
	if (r == 0)
		r = conn_read(c, make_alloc(tensor ? lat_rbuf : nullptr));
	return r;
}

static int lat_rounds(Conn &c, uint64_t &seq, bool tensor, long count, double *samples)
{
	int r = 0;

	for (long i = 0; i < count && r == 0; i++, seq++) {
		uint64_t t0 = bench_now_ns();

		r = lat_round(c, std::string(reinterpret_cast<const char *>(&seq), sizeof(seq)),
			      tensor);
		if (samples)
			samples[i] = (double)(bench_now_ns() - t0) / 1e3;
	}
	return r;
}

static int lat_drive(Conn &c, const Opts &o, const Session &s)
{
	static const struct {
		const char *name;
		bool tensor;
	} cases[] = { { "meta8", false }, { "meta8+tensor64", true } };
	std::vector<double> samples((size_t)o.iters);
	uint64_t seq = 0;
	int r = 0;

	for (const auto &lc : cases) {
		char name[96], size[32], res[96];
		struct bench_stats st;

		snprintf(name, sizeof(name), "%s latency rtt %s", s.label, lc.name);
		bench_fmt_size(sizeof(seq) + (lc.tensor ? kLatTensor : 0), size, sizeof(size));
		r = lat_rounds(c, seq, lc.tensor, o.warmup, nullptr);
		if (r == 0)
			r = lat_rounds(c, seq, lc.tensor, o.iters, samples.data());
		if (r < 0) {
			bench_row(name, size, "error (see stderr)", "-", "-");
			return r;
		}
		bench_stats_compute(samples.data(), samples.size(), &st);
		snprintf(res, sizeof(res), "med %.1f p90 %.1f p99 %.1f min %.1f us", st.median,
			 st.p90, st.p99, st.min);
		bench_row(name, size, res, "-", "-");
	}
	return lat_round(c, kLatQuit, false);
}

/* ---- sessions ---------------------------------------------------------------------------- */

static void skip_rows(const Session &s, const std::string &why)
{
	std::string res = "skipped: " + why;
	char name[96];

	if (s.latency) {
		for (const char *n : { "meta8", "meta8+tensor64" }) {
			snprintf(name, sizeof(name), "%s latency rtt %s", s.label, n);
			bench_row(name, "-", res.c_str(), "-", "-");
		}
		return;
	}
	snprintf(name, sizeof(name), "%s tput k=%d", s.label, s.o->inflight);
	bench_row(name, "-", res.c_str(), "-", "-");
}

/* What the peer tells the driver once it listens: 0, or for uv the TCP port it got. */
static int peer_ready_value(const Session &s, const tp::Listener &l)
{
	std::string url;
	size_t colon;

	if (strcmp(s.transport, "uv") != 0)
		return 0;
	url = l.url("uv");
	colon = url.rfind(':');
	return colon == std::string::npos ? -EPROTO : atoi(url.c_str() + colon + 1);
}

/* The forked peer: listens, accepts one pipe, serves it until the driver quits. */
static int peer_main(void *arg, int ready_fd)
{
	const Session &s = *static_cast<const Session *>(arg);
	Conn c;
	std::string why;
	int r = 0;

	if (!s.o->netns.empty() && bench_netns_enter(s.o->netns.c_str()) < 0) {
		bench_ready_send(ready_fd, -EIO);
		return -EIO;
	}
	try {
		c.ctx = make_context(s, "tp_baseline-peer", true, why);
		if (!c.ctx) {
			fprintf(stderr, "tp_baseline: %s: %s\n", s.label, why.c_str());
			bench_ready_send(ready_fd, -EOPNOTSUPP);
			return 0;
		}
		c.listener = c.ctx->listen({ s.addr });
		bench_ready_send(ready_fd, peer_ready_value(s, *c.listener));
		c.listener->accept([&c](const tp::Error &e, std::shared_ptr<tp::Pipe> p) {
			std::lock_guard<std::mutex> lk(c.mu);

			if (e)
				fail_locked(c, -EIO, "accept: " + e.what());
			c.pipe = std::move(p);
			c.cv.notify_all();
		});
		std::unique_lock<std::mutex> lk(c.mu);
		r = wait_until(c, lk, "accept", [&c] { return c.pipe != nullptr; });
		lk.unlock();
		if (r == 0)
			r = s.latency ? lat_serve(c, *s.o) : tput_serve(c, *s.o);
		if (r == 0)
			r = conn_linger(c);
	} catch (const std::exception &e) {
		fprintf(stderr, "tp_baseline: %s: peer: %s\n", s.label, e.what());
		bench_ready_send(ready_fd, -EIO); /* ignored if already sent */
		r = -EIO;
	}
	conn_close(c);
	return r;
}

/* Stops a peer that is of no more use (the session is skipped) without a message. */
static void peer_discard(pid_t pid)
{
	kill(pid, SIGTERM);
	while (waitpid(pid, nullptr, 0) < 0 && errno == EINTR)
		;
}

/* The driver's side: connect, exchange a hello, then run the session. */
static int drive(Session &s, bool &skipped)
{
	Conn c;
	std::string why;
	int r;

	c.ctx = make_context(s, "tp_baseline-driver", false, why);
	if (!c.ctx) {
		skipped = true;
		skip_rows(s, why);
		return 0;
	}
	c.pipe = c.ctx->connect(s.addr);
	r = hello(c);
	if (r < 0) {
		skipped = true;
		skip_rows(s, "no pipe over " + std::string(s.transport) + "+" + s.channel + ": " +
				     c.why);
		r = 0;
	} else {
		r = s.latency ? lat_drive(c, *s.o, s) : tput_drive(c, *s.o, s);
	}
	conn_close(c);
	return r;
}

static int run_session(Session &s)
{
	bool skipped = false, uv = strcmp(s.transport, "uv") == 0;
	int ready_fd, r;
	pid_t pid;

	if (uv)
		snprintf(s.addr, sizeof(s.addr), "uv://%s", host_port(s.o->peer_host, 0).c_str());
	else
		snprintf(s.addr, sizeof(s.addr), "shm://tp_baseline-%d-%c", (int)getpid(), s.key);
	r = bench_spawn(peer_main, &s, &pid, &ready_fd);
	if (r < 0) {
		fprintf(stderr, "tp_baseline: fork: %s\n", strerror(-r));
		return r;
	}
	r = bench_ready_wait(ready_fd, kTimeoutMs);
	close(ready_fd);
	if (uv && r > 0) {
		/* The peer listens on port r now: that is where the driver connects. */
		snprintf(s.addr, sizeof(s.addr), "uv://%s", host_port(s.o->peer_host, r).c_str());
		r = 0;
	}
	if (r == -EOPNOTSUPP) {
		std::string why;

		/* The peer has said why on stderr; the same check here names it in the table. */
		if (make_context(s, "tp_baseline-probe", false, why))
			why = "not viable in the peer process (see stderr)";
		skip_rows(s, why);
		return bench_reap(pid, "peer");
	}
	if (r < 0) {
		fprintf(stderr, "tp_baseline: %s: peer not ready: %s\n", s.label, strerror(-r));
		skip_rows(s, "peer did not start (see stderr)");
		peer_discard(pid);
		return r;
	}
	try {
		r = drive(s, skipped);
	} catch (const std::exception &e) {
		fprintf(stderr, "tp_baseline: %s: %s\n", s.label, e.what());
		r = -EIO;
	}
	if (skipped) {
		peer_discard(pid);
		return 0;
	}
	if (bench_reap(pid, "peer") < 0 && r == 0)
		r = -ECHILD;
	return r;
}

/* ---- driver ------------------------------------------------------------------------------ */

static void usage()
{
	printf("usage: tp_baseline [-c CASES] [-n ITERS] [-w WARMUP] [-s SIZES] [-k N]\n"
	       "                   [-T SECONDS] [-m MSGS] [-D WINDOW] [-R] [-L LANES] [-H HOST]\n"
	       "                   [-A HOST] [-N NETNS] [-t]\n"
	       "  -c CASES    any of l (latency, shm+basic), c (throughput, shm+cma),\n"
	       "              b (throughput and 4 KiB rate, shm+basic), u (latency, uv+mpt),\n"
	       "              m (throughput, uv+mpt); default lcb\n"
	       "  -n ITERS    timed round trips per latency case (default 20000)\n"
	       "  -w WARMUP   untimed round trips first (default ITERS/10, at least 100)\n"
	       "  -s SIZES    comma list, K/M/G suffixes (default 4K,64K,1M,16M,64M,256M)\n"
	       "  -k N        writes in flight (default 4, at most %d)\n"
	       "  -T SECONDS  minimum timed duration per size (default 0.5)\n"
	       "  -m MSGS     minimum timed messages per size (default 8)\n"
	       "  -D WINDOW   messages the reader may lag before the writer waits (default 64)\n"
	       "  -R          skip the 4 KiB message-rate case\n"
	       "  -L LANES    uv+mpt: mpt lanes (TCP connections for tensors; default 4)\n"
	       "  -H HOST     uv+mpt: numeric address the peer listens on (default 127.0.0.1)\n"
	       "  -A HOST     uv+mpt: numeric address the driver's lanes listen on (default -H)\n"
	       "  -N NETNS    uv+mpt: the peer runs in this network namespace (name or path)\n"
	       "  -t          tab-separated rows, no header (for bench/run.sh)\n",
	       kSlotsMax);
}

static int parse_sizes(const char *arg, Opts &o)
{
	std::string list(arg);
	size_t pos = 0;

	o.sizes.clear();
	while (pos <= list.size()) {
		size_t end = list.find(',', pos), v;

		if (end == std::string::npos)
			end = list.size();
		if (o.sizes.size() == kSizesMax ||
		    bench_parse_size(list.substr(pos, end - pos).c_str(), &v) < 0 || v == 0)
			return -EINVAL;
		o.sizes.push_back(v);
		pos = end + 1;
	}
	return 0;
}

static int parse_args(int argc, char **argv, Opts &o)
{
	int opt, r = parse_sizes("4K,64K,1M,16M,64M,256M", o);

	while ((opt = getopt(argc, argv, "c:n:w:s:k:T:m:D:RL:H:A:N:th")) != -1 && r == 0) {
		switch (opt) {
		case 'c': o.cases = optarg; break;
		case 'n': o.iters = strtol(optarg, nullptr, 10); break;
		case 'w': o.warmup = strtol(optarg, nullptr, 10); break;
		case 's': r = parse_sizes(optarg, o); break;
		case 'k': o.inflight = atoi(optarg); break;
		case 'T': o.min_s = strtod(optarg, nullptr); break;
		case 'm': o.min_msgs = strtol(optarg, nullptr, 10); break;
		case 'D': o.window = strtol(optarg, nullptr, 10); break;
		case 'R': o.rate = false; break;
		case 'L': o.lanes = atoi(optarg); break;
		case 'H': o.peer_host = optarg; break;
		case 'A': o.driver_host = optarg; break;
		case 'N': o.netns = optarg; break;
		case 't': bench_tsv = true; break;
		case 'h': usage(); exit(0);
		default: r = -EINVAL; break;
		}
	}
	if (r == 0 && (o.iters <= 0 || o.inflight < 1 || o.inflight > kSlotsMax || o.min_s < 0 ||
		       o.min_msgs < 1 || o.window < 1 || o.lanes < 1 || o.lanes > 64 ||
		       optind != argc))
		r = -EINVAL;
	if (r < 0)
		usage();
	if (o.warmup < 0)
		o.warmup = std::max(o.iters / 10, 100L);
	return r;
}

} /* namespace tpb */

int main(int argc, char **argv)
{
	using namespace tpb;

	Opts o;
	Session sessions[] = {
		{ 'l', "tensorpipe shm+basic", "shm", "basic", true, false, &o, "" },
		{ 'c', "tensorpipe shm+cma", "shm", "cma", false, false, &o, "" },
		{ 'b', "tensorpipe shm+basic", "shm", "basic", false, true, &o, "" },
		{ 'u', "tensorpipe uv+mpt", "uv", "mpt", true, false, &o, "" },
		{ 'm', "tensorpipe uv+mpt", "uv", "mpt", false, false, &o, "" },
	};
	int failed = 0;

	if (parse_args(argc, argv, o) < 0)
		return 2;
	bench_table_header("TensorPipe baseline: latency (shm+basic, uv+mpt), one-way throughput "
			   "(shm+cma, shm+basic, uv+mpt), private memory");
	/* Sessions are independent: a failure in one does not stop the next. */
	for (auto &s : sessions)
		if (o.cases.find(s.key) != std::string::npos && run_session(s) < 0)
			failed++;
	return failed ? 1 : 0;
}
