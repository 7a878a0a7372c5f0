/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * What the two halves of tp_baseline share: the options, the per-process connection state that
 * TensorPipe's callbacks report into, the session description, and the helpers that make a
 * tensorpipe::Pipe synchronous where the benchmark waits. The latency case, the sessions and the
 * driver live in tp_baseline.cpp; the throughput reader and writer in tp_baseline_tput.cpp.
 */
#ifndef TP_BASELINE_H
#define TP_BASELINE_H

#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <tensorpipe/tensorpipe.h>

#include "bench_common.h"

namespace tpb {

namespace tp = tensorpipe;

constexpr int kTimeoutMs = 20000; /* no progress for this long fails the session */
constexpr long kLatPendingMax = 64;
constexpr size_t kLatTensor = 64;
constexpr size_t kRateSize = 4096;
constexpr int kRateInflight = 4;
constexpr int kSlotsMax = 16;
/* The reader's slots hold at most this many bytes, as bench_throughput's (bench_tput_slots()). */
constexpr uint64_t kSlotsBytesMax = 4ull << 30;
constexpr size_t kSizesMax = 16;
inline const std::string kHello = "tp_baseline hello";

struct Opts {
	long iters = 20000;
	long warmup = -1;
	std::vector<size_t> sizes;
	int inflight = 4;
	double min_s = 0.5;
	long min_msgs = 8;
	long window = 64;
	bool rate = true;
	std::string cases = "lcb";
	/* uv+mpt sessions (u, m): TCP between the processes */
	int lanes = 4;			     /* mpt lanes, each its own uv context and connection */
	std::string peer_host = "127.0.0.1"; /* the peer listens (pipe and lanes) here */
	std::string driver_host;	     /* the driver's lanes listen here ("": peer_host) */
	std::string netns;		     /* the peer's network namespace ("": this one) */
};

struct Slot {
	void *data = nullptr;
	bool busy = false;
	bool last = false;
	uint64_t phase = 0;
};

/* One process's end of a session: its context and pipe, and what their callbacks report. */
struct Conn {
	std::shared_ptr<tp::Context> ctx;
	std::shared_ptr<tp::Listener> listener;
	std::shared_ptr<tp::Pipe> pipe;
	std::mutex mu;
	std::condition_variable cv;
	int err = 0;	      /* first failure; then every wait returns it */
	std::string why;      /* what it was */
	bool closing = false; /* the exchange is over: failures are expected, not printed */
	long pending = 0;     /* writes not completed */
	bool have_desc = false;
	tp::Descriptor desc;
	bool read_done = false;
	/* throughput writer */
	uint64_t phase = 0;
	long credited = 0;
	bool done = false;
	uint64_t done_ns = 0;
	bool bye = false;
	/* throughput reader */
	std::vector<Slot> slots;
	size_t slot_size = 0;
	size_t slots_used = 0; /* slots of this phase's size: all, or 4 GiB of them */
	long completed = 0;
	long credit_every = 32;

	Conn() = default;
	Conn(const Conn &) = delete;
	Conn &operator=(const Conn &) = delete;
	~Conn();
};

struct Session {
	char key;
	const char *label;     /* row prefix, e.g. "tensorpipe shm+basic" */
	const char *transport; /* "shm" or "uv" */
	const char *channel;   /* "basic", "cma" or "mpt" */
	bool latency;	       /* latency ping-pong, else throughput */
	bool rate;	       /* throughput: also the 4 KiB message rate */
	const Opts *o;
	char addr[96];
};

/* Records the first failure (printed unless closing) and wakes every waiter. Holds c.mu. */
void fail_locked(Conn &c, int err, const std::string &what);
/* The same, taking c.mu. */
void fail(Conn &c, int err, const std::string &what);

/* Waits, holding @lk on c.mu, until @ready() or a failure; kTimeoutMs without either fails. */
template <typename Pred>
int wait_until(Conn &c, std::unique_lock<std::mutex> &lk, const char *what, Pred ready)
{
	auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(kTimeoutMs);

	while (!c.err && !ready())
		if (c.cv.wait_until(lk, deadline) == std::cv_status::timeout && !c.err && !ready())
			fail_locked(c, -ETIMEDOUT,
				    std::string(what) + ": no progress in " +
					    std::to_string(kTimeoutMs / 1000) + " s");
	return c.err;
}

/*
 * conn_write() - write @m; its completion decrements c.pending. Then waits until at most @max
 * writes are pending (@max < 0: does not wait). Keeps @m's buffers until that completion.
 * Return: 0 or the connection's failure.
 */
int conn_write(Conn &c, tp::Message m, long max);
/* Waits for the next descriptor, moved into @ret. Return: 0 or the connection's failure. */
int conn_read_desc(Conn &c, tp::Descriptor &ret);
/* Reads the message just described into @a's buffers and waits for it. Return: as above. */
int conn_read(Conn &c, tp::Allocation a);

/* A message of metadata @meta and, if @data, one CPU tensor of @len bytes at @data (borrowed). */
tp::Message make_msg(std::string meta, void *data, size_t len);
/* An allocation of one CPU tensor at @data (borrowed), or none if @data is NULL. */
tp::Allocation make_alloc(void *data);
/* Page-aligned private memory, every page touched; free with free(). NULL if out of memory. */
void *buf_get(size_t size);
/* The peer's answer to a small message (hello, latency): reads it and writes it back. */
int echo(Conn &c, const tp::Descriptor &d);

/* tp_baseline_tput.cpp: the forked reader's loop, and the writer's phases and rows. */
int tput_serve(Conn &c, const Opts &o);
int tput_drive(Conn &c, const Opts &o, const Session &s);

} /* namespace tpb */

#endif
