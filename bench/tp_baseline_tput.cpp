/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The throughput half of tp_baseline, with TensorPipe: the writer (the driver process) keeps k
 * writes of one CPU tensor in flight and at most a window of unread messages, the forked reader
 * reads each message into the next slot of a ring of private buffers and returns a credit every
 * window/2 reads and a done message once it has read the message flagged last; the writer times
 * each phase from its first write to that done message, as bench_throughput does with tpipd.
 */
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "tp_baseline.h"

namespace tpb {

static constexpr uint32_t kTagMagic = 0x54504254u; /* "TBPT" */
static constexpr uint16_t kTagLast = 1;

enum TagType : uint16_t { kData = 1, kCredit, kDone, kQuit, kBye };

/* Metadata of every throughput message. */
struct Tag {
	uint32_t magic;
	uint16_t type;
	uint16_t flags;
	uint64_t phase;
	uint64_t seq; /* DATA: index in phase; CREDIT/DONE: messages read in phase */
};

static std::string tag_meta(TagType type, uint64_t phase, uint64_t seq, bool last)
{
	Tag t = { kTagMagic, type, static_cast<uint16_t>(last ? kTagLast : 0), phase, seq };

	return std::string(reinterpret_cast<const char *>(&t), sizeof(t));
}

static bool tag_parse(const tp::Descriptor &d, Tag &t)
{
	if (d.metadata.size() != sizeof(t))
		return false;
	memcpy(&t, d.metadata.data(), sizeof(t));
	return t.magic == kTagMagic;
}

/* ---- throughput: the reader (forked peer) ------------------------------------------------ */

static void r_send_ctl(Conn &c, TagType type, uint64_t phase, long n)
{
	conn_write(c, make_msg(tag_meta(type, phase, (uint64_t)n, false), nullptr, 0), -1);
}

static void r_on_read(Conn &c, Slot &s, const tp::Error &e)
{
	bool last = s.last, credit;
	uint64_t phase = s.phase;
	long n;
	{
		std::lock_guard<std::mutex> lk(c.mu);

		s.busy = false;
		n = ++c.completed;
		if (e)
			fail_locked(c, -EIO, "reader: read: " + e.what());
		credit = !last && n % c.credit_every == 0;
		c.cv.notify_all();
	}
	if (e)
		return;
	if (last)
		r_send_ctl(c, kDone, phase, n);
	else if (credit)
		r_send_ctl(c, kCredit, phase, n);
}

/* Waits until no read is pending (and, with @ctl, no credit write). */
static int r_wait_idle(Conn &c, bool ctl)
{
	std::unique_lock<std::mutex> lk(c.mu);

	return wait_until(c, lk, "reader", [&c, ctl] {
		return std::none_of(c.slots.begin(), c.slots.end(),
				    [](const Slot &s) { return s.busy; }) &&
		       (!ctl || c.pending == 0);
	});
}

static void r_free_slots(Conn &c)
{
	for (auto &s : c.slots) {
		free(s.data);
		s.data = nullptr;
	}
	c.slot_size = 0;
}

/* A new phase: earlier reads are done; the slots are reallocated if the size changed. */
static int r_new_phase(Conn &c, uint64_t phase, size_t size)
{
	int r = r_wait_idle(c, false);

	if (r < 0)
		return r;
	c.phase = phase;
	{
		std::lock_guard<std::mutex> lk(c.mu);
		c.completed = 0;
	}
	if (size == c.slot_size)
		return 0;
	r_free_slots(c);
	c.slots_used = (size_t)std::clamp<uint64_t>(kSlotsBytesMax / std::max<size_t>(size, 1), 1,
						    c.slots.size());
	for (size_t i = 0; i < c.slots_used; i++)
		if (!(c.slots[i].data = buf_get(size))) {
			fail(c, -ENOMEM, "reader: out of memory");
			return -ENOMEM;
		}
	c.slot_size = size;
	return 0;
}

/* Issues the read of one data message into the next slot, once that slot is free. */
static int r_read_data(Conn &c, const tp::Descriptor &d, const Tag &t, long &idx)
{
	int r = 0;

	if (d.tensors.size() != 1 || !d.payloads.empty()) {
		fail(c, -EBADMSG, "reader: unexpected message shape");
		return -EBADMSG;
	}
	if (t.phase != c.phase)
		r = r_new_phase(c, t.phase, d.tensors[0].length);
	if (r == 0 && d.tensors[0].length != c.slot_size) {
		fail(c, -EBADMSG, "reader: size changed within a phase");
		r = -EBADMSG;
	}
	if (r < 0)
		return r;
	Slot &s = c.slots[(size_t)(idx++ % (long)c.slots_used)];
	{
		std::unique_lock<std::mutex> lk(c.mu);

		r = wait_until(c, lk, "reader slot", [&s] { return !s.busy; });
		s.busy = true;
		s.last = t.flags & kTagLast;
		s.phase = t.phase;
	}
	if (r == 0)
		c.pipe->read(make_alloc(s.data),
			     [&c, &s](const tp::Error &e) { r_on_read(c, s, e); });
	return r;
}

int tput_serve(Conn &c, const Opts &o)
{
	long idx = 0;

	c.slots.resize((size_t)std::max(o.inflight, kRateInflight));
	c.credit_every = std::max(o.window / 2, 1L);
	for (;;) {
		tp::Descriptor d;
		Tag t;
		int r = conn_read_desc(c, d);

		if (r == 0 && d.metadata == kHello) {
			r = echo(c, d);
			if (r < 0)
				return r;
			continue;
		}
		if (r == 0 && !tag_parse(d, t)) {
			fail(c, -EBADMSG, "reader: unexpected metadata");
			r = -EBADMSG;
		}
		if (r == 0 && t.type == kQuit) {
			r = conn_read(c, tp::Allocation{});
			if (r == 0)
				r = r_wait_idle(c, true);
			if (r == 0)
				r = conn_write(c, make_msg(tag_meta(kBye, 0, 0, false), nullptr, 0),
					       -1);
			return r;
		}
		if (r == 0)
			r = r_read_data(c, d, t, idx);
		if (r < 0)
			return r;
	}
}

/* ---- throughput: the writer (driver) ----------------------------------------------------- */

static void w_arm(Conn &c);

/* A credit, done or bye message from the reader: note it, consume it, wait for the next. */
static void w_on_desc(Conn &c, const tp::Error &e, const tp::Descriptor &d)
{
	Tag t = {};
	bool bye;

	if (e) {
		fail(c, -EIO, "writer: credit readDescriptor: " + e.what());
		return;
	}
	tag_parse(d, t);
	{
		std::lock_guard<std::mutex> lk(c.mu);

		if (t.phase == c.phase && t.type == kCredit && (long)t.seq > c.credited)
			c.credited = (long)t.seq;
		if (t.phase == c.phase && t.type == kDone) {
			c.done = true;
			c.done_ns = bench_now_ns();
		}
		if (t.type == kBye)
			c.bye = true;
		bye = c.bye;
		c.cv.notify_all();
	}
	c.pipe->read(tp::Allocation{}, [&c](const tp::Error &e2) {
		if (e2)
			fail(c, -EIO, "writer: credit read: " + e2.what());
	});
	if (!bye)
		w_arm(c);
}

static void w_arm(Conn &c)
{
	c.pipe->readDescriptor(
		[&c](const tp::Error &e, tp::Descriptor d) { w_on_desc(c, e, d); });
}

/* Waits until message @seq may be sent (or, with @seq < 0, until the phase is done). */
static int w_wait(Conn &c, int inflight, long window, long seq)
{
	std::unique_lock<std::mutex> lk(c.mu);

	return wait_until(c, lk, "writer", [&c, inflight, window, seq] {
		if (seq < 0)
			return c.done && c.pending == 0;
		return c.pending < inflight && seq - c.credited < window;
	});
}

struct PhaseResult {
	long msgs;
	double secs;
};

/*
 * One phase: messages of @size from @src, at most @inflight uncompleted writes and o.window
 * unread messages, until @min_s seconds and @min_msgs messages; the last is flagged and the
 * phase ends when the reader says it has read it.
 */
static int w_phase(Conn &c, const Opts &o, void *src, size_t size, int inflight, double min_s,
		   long min_msgs, PhaseResult &ret)
{
	uint64_t t0, phase;
	long seq;
	int r;
	{
		std::lock_guard<std::mutex> lk(c.mu);

		phase = ++c.phase;
		c.credited = 0;
		c.done = false;
	}
	t0 = bench_now_ns();
	for (seq = 0;; seq++) {
		r = w_wait(c, inflight, o.window, seq);
		if (r < 0)
			return r;
		bool last = seq + 1 >= min_msgs && (double)(bench_now_ns() - t0) >= min_s * 1e9;
		conn_write(c, make_msg(tag_meta(kData, phase, (uint64_t)seq, last), src, size), -1);
		if (last)
			break;
	}
	r = w_wait(c, inflight, o.window, -1);
	if (r < 0)
		return r;
	ret.msgs = seq + 1;
	ret.secs = (double)(c.done_ns - t0) / 1e9;
	return 0;
}

/* Warm-up phase (untimed) then the timed phase. */
static int w_measure(Conn &c, const Opts &o, size_t size, int inflight, PhaseResult &ret)
{
	long warm = std::min(std::max((long)((64u << 20) / size), 2L * inflight), 2000L);
	PhaseResult wr;
	void *src = buf_get(size);
	int r;

	if (!src) {
		fail(c, -ENOMEM, "writer: out of memory");
		return -ENOMEM;
	}
	r = w_phase(c, o, src, size, inflight, 0, warm, wr);
	if (r == 0)
		r = w_phase(c, o, src, size, inflight, o.min_s, o.min_msgs, ret);
	/* A failed write may still reference @src until the context is joined. */
	if (r == 0)
		free(src);
	return r;
}

static int tput_row(Conn &c, const Opts &o, const Session &s, size_t size, bool rate)
{
	char name[96], sz[32], res[96];
	int inflight = rate ? kRateInflight : o.inflight;
	PhaseResult pr;
	int r;

	snprintf(name, sizeof(name), "%s %s k=%d", s.label, rate ? "rate" : "tput", inflight);
	bench_fmt_size(size, sz, sizeof(sz));
	r = w_measure(c, o, size, inflight, pr);
	if (r < 0) {
		bench_row(name, sz, "error (see stderr)", "-", "-");
		return r;
	}
	if (rate)
		snprintf(res, sizeof(res), "%.0f msg/s (%ld msgs, %.2f s)",
			 (double)pr.msgs / pr.secs, pr.msgs, pr.secs);
	else
		snprintf(res, sizeof(res), "%.2f GB/s (%ld msgs, %.2f s)",
			 (double)pr.msgs * (double)size / pr.secs / 1e9, pr.msgs, pr.secs);
	bench_row(name, sz, res, "-", "-");
	return 0;
}

int tput_drive(Conn &c, const Opts &o, const Session &s)
{
	int r = 0;

	w_arm(c);
	for (size_t i = 0; i < o.sizes.size() && r == 0; i++)
		r = tput_row(c, o, s, o.sizes[i], false);
	if (r == 0 && s.rate && o.rate)
		r = tput_row(c, o, s, kRateSize, true);
	if (r < 0)
		return r;
	conn_write(c, make_msg(tag_meta(kQuit, 0, 0, false), nullptr, 0), -1);
	std::unique_lock<std::mutex> lk(c.mu);
	return wait_until(c, lk, "writer: quit", [&c] { return c.bye && c.pending == 0; });
}

} /* namespace tpb */
