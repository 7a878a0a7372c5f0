/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Unit tests of message validation (proto/validate.c): every rule for client and daemon
 * messages, each limit just at and just past its value, overflow-prone arithmetic, listener
 * names. Messages are built in memory (no packing): validation sees exactly what unpack would
 * produce. The status <-> errno mapping is tested in test_status.c.
 */
#include <check.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include "pring.h"
#include "validate.h"

/* Small limits so that "just above" cases stay cheap. */
static const struct tpw_limits lim = {
	.frame_max = 4096,
	.inline_max = 64,
	.segments_max = 4,
	.message_bytes_max = 1000,
	.metadata_max = 100,
};

static uint8_t meta_bytes[256];
static char why[256];

static struct tpw_hdr hdr(uint16_t nfds, uint32_t data_len)
{
	return (struct tpw_hdr){ TPW_MAGIC, TPW_WIRE_VERSION, nfds, 1, data_len, 1 };
}

static int vc(const Tpw__V1__ClientMsg *m, uint16_t nfds, uint32_t data_len)
{
	struct tpw_hdr h = hdr(nfds, data_len);

	why[0] = '\0';
	return tpw_client_msg_validate(m, &h, &lim, why, sizeof(why));
}

static int vd(const Tpw__V1__DaemonMsg *m, uint16_t nfds, uint32_t data_len)
{
	struct tpw_hdr h = hdr(nfds, data_len);

	why[0] = '\0';
	return tpw_daemon_msg_validate(m, &h, &lim, why, sizeof(why));
}

/* ---- a Write under construction ---------------------------------------------------------- */

#define NSEG 8

struct wmsg {
	Tpw__V1__ClientMsg m;
	Tpw__V1__Write w;
	Tpw__V1__Payload p[NSEG];
	Tpw__V1__Tensor t[NSEG];
	Tpw__V1__Segment seg[2 * NSEG];
	Tpw__V1__ShmRef shm[2 * NSEG];
	Tpw__V1__Device dev[NSEG], tgt[NSEG];
	Tpw__V1__Payload *pp[NSEG];
	Tpw__V1__Tensor *tp[NSEG];
};

/* A Write with @np payloads and @nt tensors, each an inline segment of 0 bytes at offset 0. */
static void wmsg_init(struct wmsg *x, size_t np, size_t nt)
{
	memset(x, 0, sizeof(*x));
	tpw__v1__client_msg__init(&x->m);
	tpw__v1__write__init(&x->w);
	for (size_t i = 0; i < 2 * NSEG; i++) {
		tpw__v1__segment__init(&x->seg[i]);
		tpw__v1__shm_ref__init(&x->shm[i]);
		x->seg[i].loc_case = TPW__V1__SEGMENT__LOC_INLINE_OFF;
	}
	for (size_t i = 0; i < NSEG; i++) {
		tpw__v1__payload__init(&x->p[i]);
		tpw__v1__tensor__init(&x->t[i]);
		x->p[i].data = &x->seg[i];
		x->t[i].data = &x->seg[NSEG + i];
		x->pp[i] = &x->p[i];
		x->tp[i] = &x->t[i];
	}
	x->w.pipe_id = 1;
	x->w.n_payloads = np;
	x->w.payloads = x->pp;
	x->w.n_tensors = nt;
	x->w.tensors = x->tp;
	x->m.body_case = TPW__V1__CLIENT_MSG__BODY_WRITE;
	x->m.write = &x->w;
}

static void set_inline(Tpw__V1__Segment *s, uint64_t off, uint64_t len)
{
	s->loc_case = TPW__V1__SEGMENT__LOC_INLINE_OFF;
	s->inline_off = off;
	s->length = len;
}

static void set_device(struct wmsg *x, size_t i, int type, int target_type)
{
	tpw__v1__device__init(&x->dev[i]);
	tpw__v1__device__init(&x->tgt[i]);
	x->dev[i].type = type;
	x->tgt[i].type = target_type;
	x->t[i].device = &x->dev[i];
	x->t[i].target = &x->tgt[i];
}

/* Largest value an enum of the schema defines. */
static int enum_max(const ProtobufCEnumDescriptor *d)
{
	int max = 0;

	for (unsigned i = 0; i < d->n_values; i++)
		if (d->values[i].value > max)
			max = d->values[i].value;
	return max;
}

static ProtobufCBinaryData meta(size_t n)
{
	return (ProtobufCBinaryData){ n, meta_bytes };
}

START_TEST(test_validate_accepts_plain_write)
{
	struct wmsg x;

	wmsg_init(&x, 1, 1);
	set_inline(&x.seg[0], 0, 10);
	set_inline(&x.seg[NSEG], 10, 20);
	ck_assert_int_eq(vc(&x.m, 0, 30), 0);
	wmsg_init(&x, 0, 0);
	ck_assert_int_eq(vc(&x.m, 0, 0), 0);
}
END_TEST

START_TEST(test_validate_limits_segment_count)
{
	struct wmsg x;

	for (size_t np = 0; np <= lim.segments_max; np++) {
		wmsg_init(&x, np, lim.segments_max - np);
		ck_assert_msg(vc(&x.m, 0, 0) == 0, "%zu + %zu: %s", np,
			      (size_t)lim.segments_max - np, why);
	}
	wmsg_init(&x, 3, 2);
	ck_assert_int_eq(vc(&x.m, 0, 0), -E2BIG);
	wmsg_init(&x, 5, 0);
	ck_assert_int_eq(vc(&x.m, 0, 0), -E2BIG);
	wmsg_init(&x, 0, 5);
	ck_assert_int_eq(vc(&x.m, 0, 0), -E2BIG);
	/* a huge payload count must not wrap the tensor comparison */
	wmsg_init(&x, 0, 0);
	x.w.n_payloads = SIZE_MAX;
	ck_assert_int_eq(vc(&x.m, 0, 0), -E2BIG);
}
END_TEST

START_TEST(test_validate_limits_metadata_sum)
{
	struct wmsg x;

	wmsg_init(&x, 1, 1);
	x.w.metadata = meta(40);
	x.p[0].metadata = meta(30);
	x.t[0].metadata = meta(30);
	ck_assert_int_eq(vc(&x.m, 0, 0), 0);
	x.t[0].metadata = meta(31);
	ck_assert_int_eq(vc(&x.m, 0, 0), -EMSGSIZE);
	wmsg_init(&x, 0, 0);
	x.w.metadata = meta(lim.metadata_max);
	ck_assert_int_eq(vc(&x.m, 0, 0), 0);
	x.w.metadata = meta(lim.metadata_max + 1);
	ck_assert_int_eq(vc(&x.m, 0, 0), -EMSGSIZE);
}
END_TEST

START_TEST(test_validate_limits_message_bytes)
{
	struct wmsg x;

	wmsg_init(&x, 1, 1);
	x.seg[0].loc_case = TPW__V1__SEGMENT__LOC_CMA_ADDR;
	x.seg[0].cma_addr = 0x1000;
	x.seg[0].length = 600;
	x.seg[NSEG].loc_case = TPW__V1__SEGMENT__LOC_CMA_ADDR;
	x.seg[NSEG].cma_addr = 0x1000;
	x.seg[NSEG].length = 400;
	ck_assert_int_eq(vc(&x.m, 0, 0), 0);
	x.seg[NSEG].length = 401;
	ck_assert_int_eq(vc(&x.m, 0, 0), -EMSGSIZE);
}
END_TEST

START_TEST(test_validate_message_bytes_sum_does_not_wrap)
{
	struct tpw_limits big = lim;
	struct tpw_hdr h = hdr(0, 0);
	struct wmsg x;

	big.message_bytes_max = UINT64_MAX;
	wmsg_init(&x, 2, 0);
	for (int i = 0; i < 2; i++) {
		x.seg[i].loc_case = TPW__V1__SEGMENT__LOC_SHM;
		x.seg[i].shm = &x.shm[i];
		x.seg[i].length = (UINT64_MAX >> 1) + 1; /* 2^63 + 2^63 wraps to 0 */
	}
	ck_assert_int_eq(tpw_client_msg_validate(&x.m, &h, &big, why, sizeof(why)), -EMSGSIZE);
	x.seg[1].length = UINT64_MAX >> 1; /* sums to UINT64_MAX exactly */
	ck_assert_int_eq(tpw_client_msg_validate(&x.m, &h, &big, why, sizeof(why)), 0);
}
END_TEST

START_TEST(test_validate_limits_inline_tail)
{
	struct wmsg x;

	wmsg_init(&x, 1, 0);
	set_inline(&x.seg[0], 0, lim.inline_max);
	ck_assert_int_eq(vc(&x.m, 0, lim.inline_max), 0);
	set_inline(&x.seg[0], 0, lim.inline_max + 1);
	ck_assert_int_eq(vc(&x.m, 0, lim.inline_max + 1), -EMSGSIZE);
	/* a tail nobody refers to still counts */
	set_inline(&x.seg[0], 0, 0);
	ck_assert_int_eq(vc(&x.m, 0, lim.inline_max + 1), -EMSGSIZE);
}
END_TEST

START_TEST(test_validate_inline_range_edges)
{
	struct wmsg x;

	wmsg_init(&x, 1, 0);
	set_inline(&x.seg[0], 10, 22); /* ends exactly at the tail's end */
	ck_assert_int_eq(vc(&x.m, 0, 32), 0);
	set_inline(&x.seg[0], 10, 23); /* one byte over */
	ck_assert_int_eq(vc(&x.m, 0, 32), -EBADMSG);
	set_inline(&x.seg[0], 32, 0); /* empty, at the end */
	ck_assert_int_eq(vc(&x.m, 0, 32), 0);
	set_inline(&x.seg[0], 33, 0); /* empty, past the end */
	ck_assert_int_eq(vc(&x.m, 0, 32), -EBADMSG);
	set_inline(&x.seg[0], 0, 1); /* any byte of an absent tail */
	ck_assert_int_eq(vc(&x.m, 0, 0), -EBADMSG);
}
END_TEST

START_TEST(test_validate_inline_range_does_not_wrap)
{
	struct tpw_limits big = lim;
	struct tpw_hdr h = hdr(0, 32);
	struct wmsg x;

	big.message_bytes_max = UINT64_MAX;
	wmsg_init(&x, 1, 0);
	set_inline(&x.seg[0], UINT64_MAX, 1);
	ck_assert_int_eq(tpw_client_msg_validate(&x.m, &h, &big, why, sizeof(why)), -EBADMSG);
	set_inline(&x.seg[0], 16, UINT64_MAX - 8); /* 16 + huge wraps to 7 */
	ck_assert_int_eq(tpw_client_msg_validate(&x.m, &h, &big, why, sizeof(why)), -EBADMSG);
	set_inline(&x.seg[0], UINT64_MAX - 10, 20);
	ck_assert_int_eq(tpw_client_msg_validate(&x.m, &h, &big, why, sizeof(why)), -EBADMSG);
}
END_TEST

START_TEST(test_validate_cma_range_does_not_wrap)
{
	struct wmsg x;

	wmsg_init(&x, 1, 0);
	x.seg[0].loc_case = TPW__V1__SEGMENT__LOC_CMA_ADDR;
	x.seg[0].cma_addr = UINT64_MAX - 10;
	x.seg[0].length = 10; /* ends at UINT64_MAX: representable */
	ck_assert_int_eq(vc(&x.m, 0, 0), 0);
	x.seg[0].length = 11;
	ck_assert_int_eq(vc(&x.m, 0, 0), -EBADMSG);
}
END_TEST

START_TEST(test_validate_ring_addr_range_does_not_wrap)
{
	struct wmsg x;

	wmsg_init(&x, 1, 0);
	x.seg[0].loc_case = TPW__V1__SEGMENT__LOC_RING_ADDR;
	x.seg[0].ring_addr = UINT64_MAX - 10;
	x.seg[0].length = 10; /* ends at UINT64_MAX: representable */
	ck_assert_int_eq(vc(&x.m, 0, 0), 0);
	x.seg[0].length = 11;
	ck_assert_int_eq(vc(&x.m, 0, 0), -EBADMSG);
}
END_TEST

/* A RingXfer offer: id 0, the writer's, its fd following, no segments; a transfer: id not 0. */
START_TEST(test_validate_ring_offer)
{
	Tpw__V1__RingXfer x = TPW__V1__RING_XFER__INIT;
	uint64_t v[2] = { 4096, 100 };
	char msg[128];

	x.pipe_id = 1;
	x.chunk_bytes = 65536;
	x.nchunks = 8;
	x.offer = true;
	x.fd_follows = true;
	ck_assert_int_eq(tpw_pring_xfer_check(&x, &lim, msg, sizeof(msg)), 0);
	x.fd_follows = false;
	ck_assert_int_eq(tpw_pring_xfer_check(&x, &lim, msg, sizeof(msg)), -EBADMSG);
	x.fd_follows = true;
	x.reader = true;
	ck_assert_int_eq(tpw_pring_xfer_check(&x, &lim, msg, sizeof(msg)), -EBADMSG);
	x.reader = false;
	x.id = 3;
	ck_assert_int_eq(tpw_pring_xfer_check(&x, &lim, msg, sizeof(msg)), -EBADMSG);
	x.id = 0;
	x.n_addrs = x.n_lens = 1;
	x.addrs = &v[0];
	x.lens = &v[1];
	ck_assert_int_eq(tpw_pring_xfer_check(&x, &lim, msg, sizeof(msg)), -EBADMSG);
	/* the same segment in a transfer, which needs an id */
	x.offer = false;
	ck_assert_int_eq(tpw_pring_xfer_check(&x, &lim, msg, sizeof(msg)), -EBADMSG);
	x.id = 3;
	ck_assert_int_eq(tpw_pring_xfer_check(&x, &lim, msg, sizeof(msg)), 0);
}
END_TEST

START_TEST(test_validate_segment_without_location)
{
	struct wmsg x;

	wmsg_init(&x, 1, 1);
	x.seg[0].loc_case = TPW__V1__SEGMENT__LOC__NOT_SET;
	x.seg[NSEG].loc_case = TPW__V1__SEGMENT__LOC__NOT_SET;
	ck_assert_int_eq(vc(&x.m, 0, 0), 0);
	x.seg[NSEG].length = 1;
	ck_assert_int_eq(vc(&x.m, 0, 0), -EBADMSG);
	/* a payload with no Segment at all */
	wmsg_init(&x, 1, 0);
	x.p[0].data = NULL;
	ck_assert_int_eq(vc(&x.m, 0, 0), -EBADMSG);
	wmsg_init(&x, 0, 1);
	x.t[0].data = NULL;
	ck_assert_int_eq(vc(&x.m, 0, 0), -EBADMSG);
}
END_TEST

START_TEST(test_validate_rejects_empty_shm_reference)
{
	struct wmsg x;

	wmsg_init(&x, 1, 0);
	x.seg[0].loc_case = TPW__V1__SEGMENT__LOC_SHM;
	x.seg[0].shm = NULL;
	ck_assert_int_eq(vc(&x.m, 0, 0), -EBADMSG);
	x.seg[0].shm = &x.shm[0];
	x.shm[0].offset = UINT64_MAX; /* buffer ranges are the daemon's to check */
	x.seg[0].length = 5;
	ck_assert_int_eq(vc(&x.m, 0, 0), 0);
}
END_TEST

START_TEST(test_validate_checks_tensor_devices)
{
	struct wmsg x;

	wmsg_init(&x, 0, 1);
	set_device(&x, 0, TPW__V1__DEVICE_TYPE__DEVICE_CPU,
		   TPW__V1__DEVICE_TYPE__DEVICE_UNSPECIFIED);
	ck_assert_int_eq(vc(&x.m, 0, 0), 0);
	set_device(&x, 0, TPW__V1__DEVICE_TYPE__DEVICE_CUDA, TPW__V1__DEVICE_TYPE__DEVICE_CPU);
	ck_assert_int_eq(vc(&x.m, 0, 0), 0);
	set_device(&x, 0, TPW__V1__DEVICE_TYPE__DEVICE_UNSPECIFIED,
		   TPW__V1__DEVICE_TYPE__DEVICE_CPU);
	ck_assert_int_eq(vc(&x.m, 0, 0), -EBADMSG);
	set_device(&x, 0, 3, TPW__V1__DEVICE_TYPE__DEVICE_CPU);
	ck_assert_int_eq(vc(&x.m, 0, 0), -EBADMSG);
	set_device(&x, 0, TPW__V1__DEVICE_TYPE__DEVICE_CPU, 3);
	ck_assert_int_eq(vc(&x.m, 0, 0), -EBADMSG);
	set_device(&x, 0, TPW__V1__DEVICE_TYPE__DEVICE_CPU, -1);
	ck_assert_int_eq(vc(&x.m, 0, 0), -EBADMSG);
	x.t[0].device = NULL; /* absent: CPU */
	x.t[0].target = NULL;
	ck_assert_int_eq(vc(&x.m, 0, 0), 0);
}
END_TEST

/* ---- Read ----------------------------------------------------------------------------------- */

struct rmsg {
	Tpw__V1__ClientMsg m;
	Tpw__V1__Read r;
	Tpw__V1__Segment seg[2 * NSEG];
	Tpw__V1__ShmRef shm[2 * NSEG];
	Tpw__V1__Segment *ps[NSEG], *ts[NSEG];
};

/* A Read with @np + @nt shm destinations of 0 bytes. */
static void rmsg_init(struct rmsg *x, size_t np, size_t nt)
{
	memset(x, 0, sizeof(*x));
	tpw__v1__client_msg__init(&x->m);
	tpw__v1__read__init(&x->r);
	for (size_t i = 0; i < 2 * NSEG; i++) {
		tpw__v1__segment__init(&x->seg[i]);
		tpw__v1__shm_ref__init(&x->shm[i]);
		x->seg[i].loc_case = TPW__V1__SEGMENT__LOC_SHM;
		x->seg[i].shm = &x->shm[i];
	}
	for (size_t i = 0; i < NSEG; i++) {
		x->ps[i] = &x->seg[i];
		x->ts[i] = &x->seg[NSEG + i];
	}
	x->r.pipe_id = 1;
	x->r.msg_id = 1;
	x->r.n_payloads = np;
	x->r.payloads = x->ps;
	x->r.n_tensors = nt;
	x->r.tensors = x->ts;
	x->m.body_case = TPW__V1__CLIENT_MSG__BODY_READ;
	x->m.read = &x->r;
}

START_TEST(test_validate_read_rejects_inline_destination)
{
	struct rmsg x;

	rmsg_init(&x, 1, 1);
	ck_assert_int_eq(vc(&x.m, 0, 0), 0);
	x.seg[NSEG].loc_case = TPW__V1__SEGMENT__LOC_INLINE_OFF;
	x.seg[NSEG].inline_off = 0;
	ck_assert_int_eq(vc(&x.m, 0, 0), -EBADMSG);
	/* even with a tail that would contain it: reads take no tail at all */
	ck_assert_int_eq(vc(&x.m, 0, 16), -EBADMSG);
}
END_TEST

START_TEST(test_validate_read_ack_and_discard_take_no_segments)
{
	struct rmsg x;

	rmsg_init(&x, 0, 0);
	x.r.ack_eager = true;
	ck_assert_int_eq(vc(&x.m, 0, 0), 0);
	rmsg_init(&x, 1, 0);
	x.r.ack_eager = true;
	ck_assert_int_eq(vc(&x.m, 0, 0), -EBADMSG);
	rmsg_init(&x, 0, 0);
	x.r.discard = true;
	ck_assert_int_eq(vc(&x.m, 0, 0), 0);
	rmsg_init(&x, 0, 1);
	x.r.discard = true;
	ck_assert_int_eq(vc(&x.m, 0, 0), -EBADMSG);
}
END_TEST

START_TEST(test_validate_read_limits)
{
	struct rmsg x;

	rmsg_init(&x, 2, 2);
	ck_assert_int_eq(vc(&x.m, 0, 0), 0);
	rmsg_init(&x, 2, 3);
	ck_assert_int_eq(vc(&x.m, 0, 0), -E2BIG);
	rmsg_init(&x, 1, 1);
	x.seg[0].length = 500;
	x.seg[NSEG].length = 500;
	ck_assert_int_eq(vc(&x.m, 0, 0), 0);
	x.seg[NSEG].length = 501;
	ck_assert_int_eq(vc(&x.m, 0, 0), -EMSGSIZE);
	rmsg_init(&x, 1, 0);
	x.seg[0].loc_case = TPW__V1__SEGMENT__LOC__NOT_SET;
	ck_assert_int_eq(vc(&x.m, 0, 0), 0);
	x.seg[0].length = 1;
	ck_assert_int_eq(vc(&x.m, 0, 0), -EBADMSG);
}
END_TEST

/* ---- fds and data tails per message type -------------------------------------------------- */

START_TEST(test_validate_fd_count_per_message_type)
{
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__BufferRegister br = TPW__V1__BUFFER_REGISTER__INIT;
	Tpw__V1__PipeClose pc = TPW__V1__PIPE_CLOSE__INIT;
	struct wmsg x;

	br.size = 4096;
	m.body_case = TPW__V1__CLIENT_MSG__BODY_BUFFER_REGISTER;
	m.buffer_register = &br;
	ck_assert_int_eq(vc(&m, 1, 0), 0);
	ck_assert_int_eq(vc(&m, 0, 0), -EBADMSG);
	ck_assert_int_eq(vc(&m, 2, 0), -EBADMSG);
	m.body_case = TPW__V1__CLIENT_MSG__BODY_PIPE_CLOSE;
	m.pipe_close = &pc;
	ck_assert_int_eq(vc(&m, 0, 0), 0);
	ck_assert_int_eq(vc(&m, 1, 0), -EBADMSG);
	wmsg_init(&x, 0, 0);
	ck_assert_int_eq(vc(&x.m, 1, 0), -EBADMSG);
	ck_assert_int_eq(vc(&x.m, TPW_FDS_MAX, 0), -EBADMSG);
}
END_TEST

START_TEST(test_validate_buffer_register_needs_size)
{
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__BufferRegister br = TPW__V1__BUFFER_REGISTER__INIT;

	m.body_case = TPW__V1__CLIENT_MSG__BODY_BUFFER_REGISTER;
	m.buffer_register = &br;
	ck_assert_int_eq(vc(&m, 1, 0), -EBADMSG);
	br.size = 1;
	ck_assert_int_eq(vc(&m, 1, 0), 0);
	br.size = UINT64_MAX;
	ck_assert_int_eq(vc(&m, 1, 0), 0);
}
END_TEST

START_TEST(test_validate_data_tail_only_on_write)
{
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__BufferRegister br = TPW__V1__BUFFER_REGISTER__INIT;
	Tpw__V1__ListenerClose lc = TPW__V1__LISTENER_CLOSE__INIT;
	struct rmsg r;

	m.body_case = TPW__V1__CLIENT_MSG__BODY_LISTENER_CLOSE;
	m.listener_close = &lc;
	ck_assert_int_eq(vc(&m, 0, 0), 0);
	ck_assert_int_eq(vc(&m, 0, 1), -EBADMSG);
	br.size = 10;
	m.body_case = TPW__V1__CLIENT_MSG__BODY_BUFFER_REGISTER;
	m.buffer_register = &br;
	ck_assert_int_eq(vc(&m, 1, 1), -EBADMSG);
	rmsg_init(&r, 0, 0);
	ck_assert_int_eq(vc(&r.m, 0, 1), -EBADMSG);
}
END_TEST

START_TEST(test_validate_rejects_message_without_body)
{
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__DaemonMsg d = TPW__V1__DAEMON_MSG__INIT;

	ck_assert_int_eq(vc(&m, 0, 0), -EBADMSG);
	ck_assert_int_eq(vd(&d, 0, 0), -EBADMSG);
	ck_assert_str_ne(why, "");
}
END_TEST

/* ---- Hello, Listen, Connect, Ctl ----------------------------------------------------------- */

START_TEST(test_validate_hello_roles_and_name)
{
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__Hello h = TPW__V1__HELLO__INIT;
	char name[TPW_NAME_MAX + 2];

	m.body_case = TPW__V1__CLIENT_MSG__BODY_HELLO;
	m.hello = &h;
	h.major = 1;
	h.role = TPW__V1__ROLE__ROLE_CLIENT;
	ck_assert_int_eq(vc(&m, 0, 0), 0);
	h.role = TPW__V1__ROLE__ROLE_CONTROL;
	ck_assert_int_eq(vc(&m, 0, 0), 0);
	h.role = TPW__V1__ROLE__ROLE_UNSPECIFIED;
	ck_assert_int_eq(vc(&m, 0, 0), -EBADMSG);
	h.role = enum_max(&tpw__v1__role__descriptor) + 1;
	ck_assert_int_eq(vc(&m, 0, 0), -EBADMSG);
	h.role = -1;
	ck_assert_int_eq(vc(&m, 0, 0), -EBADMSG);
	h.role = TPW__V1__ROLE__ROLE_CLIENT;
	memset(name, 'n', sizeof(name));
	name[TPW_NAME_MAX] = '\0';
	h.name = name;
	ck_assert_int_eq(vc(&m, 0, 0), 0);
	name[TPW_NAME_MAX] = 'n';
	name[TPW_NAME_MAX + 1] = '\0';
	ck_assert_int_eq(vc(&m, 0, 0), -EBADMSG);
}
END_TEST

START_TEST(test_validate_listen_name_and_access)
{
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__Listen l = TPW__V1__LISTEN__INIT;

	m.body_case = TPW__V1__CLIENT_MSG__BODY_LISTEN;
	m.listen = &l;
	l.name = "trainer0";
	for (int a = 0; a <= TPW__V1__ACCESS__ACCESS_ANYONE; a++) {
		l.access = a;
		ck_assert_int_eq(vc(&m, 0, 0), 0);
	}
	l.access = enum_max(&tpw__v1__access__descriptor) + 1;
	ck_assert_int_eq(vc(&m, 0, 0), -EBADMSG);
	l.access = -1;
	ck_assert_int_eq(vc(&m, 0, 0), -EBADMSG);
	l.access = TPW__V1__ACCESS__ACCESS_OWNER;
	l.name = "";
	ck_assert_int_eq(vc(&m, 0, 0), -EBADMSG);
	l.name = "bad/name";
	ck_assert_int_eq(vc(&m, 0, 0), -EBADMSG);
}
END_TEST

START_TEST(test_validate_listen_remote_access_and_peer_count)
{
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__Listen l = TPW__V1__LISTEN__INIT;
	char *peers[TPW_REMOTE_PEERS_MAX + 1], longp[TPW_NAME_MAX + 2];

	for (size_t i = 0; i <= TPW_REMOTE_PEERS_MAX; i++)
		peers[i] = "psk";
	m.body_case = TPW__V1__CLIENT_MSG__BODY_LISTEN;
	m.listen = &l;
	l.name = "trainer0";
	for (int a = 0; a <= TPW__V1__REMOTE_ACCESS__REMOTE_ANY_PEER; a++) {
		l.remote = a;
		ck_assert_int_eq(vc(&m, 0, 0), 0);
	}
	l.remote = enum_max(&tpw__v1__remote_access__descriptor) + 1;
	ck_assert_int_eq(vc(&m, 0, 0), -EBADMSG);
	l.remote = TPW__V1__REMOTE_ACCESS__REMOTE_PEERS;
	ck_assert_int_eq(vc(&m, 0, 0), -EBADMSG); /* PEERS without a peer */
	l.remote_peers = peers;
	l.n_remote_peers = TPW_REMOTE_PEERS_MAX;
	ck_assert_int_eq(vc(&m, 0, 0), 0);
	l.n_remote_peers = TPW_REMOTE_PEERS_MAX + 1;
	ck_assert_int_eq(vc(&m, 0, 0), -EBADMSG);
	l.n_remote_peers = 1;
	l.remote = TPW__V1__REMOTE_ACCESS__REMOTE_ANY_PEER;
	ck_assert_int_eq(vc(&m, 0, 0), -EBADMSG); /* peers only with PEERS */
	l.remote = TPW__V1__REMOTE_ACCESS__REMOTE_PEERS;
	memset(longp, 'p', sizeof(longp));
	longp[TPW_NAME_MAX] = '\0';
	peers[0] = longp;
	ck_assert_int_eq(vc(&m, 0, 0), 0);
	longp[TPW_NAME_MAX] = 'p';
	longp[TPW_NAME_MAX + 1] = '\0';
	ck_assert_int_eq(vc(&m, 0, 0), -EBADMSG);
	peers[0] = "";
	ck_assert_int_eq(vc(&m, 0, 0), -EBADMSG);
}
END_TEST

START_TEST(test_validate_connect_pipe_id_range)
{
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__Connect c = TPW__V1__CONNECT__INIT;

	m.body_case = TPW__V1__CLIENT_MSG__BODY_CONNECT;
	m.connect = &c;
	c.address = "trainer0";
	c.pipe_id = 1;
	ck_assert_int_eq(vc(&m, 0, 0), 0);
	c.pipe_id = (1ull << 63) - 1;
	ck_assert_int_eq(vc(&m, 0, 0), 0);
	c.pipe_id = 0;
	ck_assert_int_eq(vc(&m, 0, 0), -EBADMSG);
	c.pipe_id = 1ull << 63;
	ck_assert_int_eq(vc(&m, 0, 0), -EBADMSG);
	c.pipe_id = UINT64_MAX;
	ck_assert_int_eq(vc(&m, 0, 0), -EBADMSG);
}
END_TEST

/* A connect's expected peer identities (TP_CONNECT_EXPECT_PEER): as a listener's remote peers,
 * at most TPW_REMOTE_PEERS_MAX (just at and one above), only with REMOTE_PEERS, never NONE. */
START_TEST(test_validate_connect_expected_peers)
{
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__Connect c = TPW__V1__CONNECT__INIT;
	char *peers[TPW_REMOTE_PEERS_MAX + 1];

	for (size_t i = 0; i <= TPW_REMOTE_PEERS_MAX; i++)
		peers[i] = "cert:gn01";
	m.body_case = TPW__V1__CLIENT_MSG__BODY_CONNECT;
	m.connect = &c;
	c.address = "tpip://gn01/trainer0";
	c.pipe_id = 3;
	ck_assert_int_eq(vc(&m, 0, 0), 0); /* unspecified: no expectation */
	c.expect_remote = TPW__V1__REMOTE_ACCESS__REMOTE_ANY_PEER;
	ck_assert_int_eq(vc(&m, 0, 0), 0);
	c.expect_remote = TPW__V1__REMOTE_ACCESS__REMOTE_NONE;
	ck_assert_int_eq(vc(&m, 0, 0), -EBADMSG);
	c.expect_remote = TPW__V1__REMOTE_ACCESS__REMOTE_PEERS;
	ck_assert_int_eq(vc(&m, 0, 0), -EBADMSG); /* PEERS without a peer */
	c.expect_peers = peers;
	c.n_expect_peers = TPW_REMOTE_PEERS_MAX;
	ck_assert_int_eq(vc(&m, 0, 0), 0);
	c.n_expect_peers = TPW_REMOTE_PEERS_MAX + 1;
	ck_assert_int_eq(vc(&m, 0, 0), -EBADMSG);
	c.n_expect_peers = 1;
	c.expect_remote = TPW__V1__REMOTE_ACCESS__REMOTE_ANY_PEER;
	ck_assert_int_eq(vc(&m, 0, 0), -EBADMSG); /* peers only with PEERS */
	c.expect_remote = TPW__V1__REMOTE_ACCESS__REMOTE_PEERS;
	peers[0] = "";
	ck_assert_int_eq(vc(&m, 0, 0), -EBADMSG);
}
END_TEST

START_TEST(test_validate_connect_address_length)
{
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__Connect c = TPW__V1__CONNECT__INIT;
	char addr[1026];

	m.body_case = TPW__V1__CLIENT_MSG__BODY_CONNECT;
	m.connect = &c;
	c.pipe_id = 7;
	c.address = "";
	ck_assert_int_eq(vc(&m, 0, 0), -EBADMSG);
	memset(addr, 'a', sizeof(addr));
	addr[1024] = '\0';
	c.address = addr;
	ck_assert_int_eq(vc(&m, 0, 0), 0);
	addr[1024] = 'a';
	addr[1025] = '\0';
	ck_assert_int_eq(vc(&m, 0, 0), -EBADMSG);
}
END_TEST

START_TEST(test_validate_ctl_what_range)
{
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__CtlRequest c = TPW__V1__CTL_REQUEST__INIT;

	m.body_case = TPW__V1__CLIENT_MSG__BODY_CTL;
	m.ctl = &c;
	/* every value the schema defines, whatever its size, and one past the last */
	for (int w = TPW__V1__CTL_WHAT__CTL_STATUS; w <= enum_max(&tpw__v1__ctl_what__descriptor);
	     w++) {
		c.what = w;
		ck_assert_msg(vc(&m, 0, 0) == 0, "CtlWhat %d refused: %s", w, why);
	}
	c.what = TPW__V1__CTL_WHAT__CTL_UNSPECIFIED;
	ck_assert_int_eq(vc(&m, 0, 0), -EBADMSG);
	c.what = enum_max(&tpw__v1__ctl_what__descriptor) + 1;
	ck_assert_int_eq(vc(&m, 0, 0), -EBADMSG);
	c.what = -5;
	ck_assert_int_eq(vc(&m, 0, 0), -EBADMSG);
}
END_TEST

START_TEST(test_validate_cancel_kind_and_ids)
{
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__Cancel c = TPW__V1__CANCEL__INIT;

	m.body_case = TPW__V1__CLIENT_MSG__BODY_CANCEL;
	m.cancel = &c;
	c.pipe_id = 1;
	c.id = 1;
	for (int k = TPW__V1__CANCEL_KIND__CANCEL_WRITE;
	     k <= enum_max(&tpw__v1__cancel_kind__descriptor); k++) {
		c.kind = k;
		ck_assert_msg(vc(&m, 0, 0) == 0, "CancelKind %d refused: %s", k, why);
	}
	c.kind = TPW__V1__CANCEL_KIND__CANCEL_UNSPECIFIED;
	ck_assert_int_eq(vc(&m, 0, 0), -EBADMSG);
	c.kind = enum_max(&tpw__v1__cancel_kind__descriptor) + 1;
	ck_assert_int_eq(vc(&m, 0, 0), -EBADMSG);
	c.kind = -1;
	ck_assert_int_eq(vc(&m, 0, 0), -EBADMSG);
	c.kind = TPW__V1__CANCEL_KIND__CANCEL_READ;
	c.pipe_id = UINT64_MAX; /* accepted pipes have ids >= 2^63 */
	c.id = UINT64_MAX;
	ck_assert_int_eq(vc(&m, 0, 0), 0);
	c.id = 0;
	ck_assert_int_eq(vc(&m, 0, 0), -EBADMSG);
	c.id = 1;
	c.pipe_id = 0;
	ck_assert_int_eq(vc(&m, 0, 0), -EBADMSG);
	c.pipe_id = 1;
	ck_assert_int_eq(vc(&m, 0, 1), -EBADMSG); /* no data tail */
	ck_assert_int_eq(vc(&m, 1, 0), -EBADMSG); /* no fd */
}
END_TEST

START_TEST(test_validate_name_rules)
{
	static const char *good[] = { "a", "Z9", "trainer.0", "x_y-z", "job@host:1+2", "0" };
	static const char *bad[] = { "", "a b", "a/b", "a\nb", "caf\xc3\xa9", "a*", "tab\t", "~" };
	char name[TPW_NAME_MAX + 2];

	ck_assert(!tpw_name_valid(NULL));
	for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++)
		ck_assert_msg(tpw_name_valid(good[i]), "'%s' refused", good[i]);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		ck_assert_msg(!tpw_name_valid(bad[i]), "'%s' accepted", bad[i]);
	memset(name, 'x', sizeof(name));
	name[TPW_NAME_MAX] = '\0';
	ck_assert(tpw_name_valid(name));
	name[TPW_NAME_MAX] = 'x';
	name[TPW_NAME_MAX + 1] = '\0';
	ck_assert(!tpw_name_valid(name));
}
END_TEST

START_TEST(test_validate_tpip_address)
{
	static const struct {
		const char *a, *host, *name;
		unsigned port;
	} good[] = {
		{ "tpip://h/x", "h", "x", 7420 },
		{ "tpip://127.0.0.1:1/x", "127.0.0.1", "x", 1 },
		{ "tpip://node-7.cluster_a.example:65535/job@0", "node-7.cluster_a.example", "job@0",
		  65535 },
		{ "tpip://[::1]/x", "::1", "x", 7420 },
		{ "tpip://[::1]:9/x", "::1", "x", 9 },
		{ "tpip://[fe80::1%eth0]:7421/x", "fe80::1%eth0", "x", 7421 },
	};
	static const char *bad[] = {
		"", "x", "tpip:/h/x", "tpip://", "tpip:///x", "tpip://h", "tpip://h/", "tpip://h:0/x",
		"tpip://h:65536/x", "tpip://h:99999/x", "tpip://h:18446744073709551617/x",
		"tpip://h:-1/x", "tpip://h:+1/x", "tpip://h: 1/x", "tpip://h:1a/x", "tpip://h:/x",
		"tpip://[::1/x", "tpip://[]:1/x", "tpip://[::1]x/x", "tpip://[zz::1]/x",
		"tpip://[fe80::1%]/x", "tpip://[127.0.0.1]/x", "tpip://a b/x", "tpip://a%b/x",
		"tpip://999.1.1.1/x", "tpip://1.2.3/x", "tpip://h/a b",
	};
	char host[TPW_TPIP_HOST_MAX + 1], reason[160], a[TPW_TPIP_HOST_MAX + 16];
	const char *name;
	uint16_t port;

	for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
		ck_assert_msg(tpw_tpip_parse(good[i].a, 7420, host, &port, &name, reason,
					     sizeof(reason)) == 0, "'%s' refused: %s", good[i].a, reason);
		ck_assert_str_eq(host, good[i].host);
		ck_assert_str_eq(name, good[i].name);
		ck_assert_uint_eq(port, good[i].port);
	}
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		reason[0] = '\0';
		ck_assert_msg(tpw_tpip_parse(bad[i], 7420, host, &port, &name, reason, sizeof(reason)) ==
			      -EINVAL, "'%s' accepted", bad[i]);
		ck_assert_msg(reason[0], "'%s': no reason", bad[i]);
	}
	/* The host limit, just below and just above. */
	memcpy(a, "tpip://", 7);
	memset(a + 7, 'h', TPW_TPIP_HOST_MAX);
	memcpy(a + 7 + TPW_TPIP_HOST_MAX, "/x", 3);
	ck_assert_int_eq(tpw_tpip_parse(a, 1, host, &port, &name, NULL, 0), 0);
	ck_assert_uint_eq(strlen(host), TPW_TPIP_HOST_MAX);
	memset(a + 7, 'h', TPW_TPIP_HOST_MAX + 1);
	memcpy(a + 8 + TPW_TPIP_HOST_MAX, "/x", 3);
	ck_assert_int_eq(tpw_tpip_parse(a, 1, host, &port, &name, NULL, 0), -EINVAL);
}
END_TEST

/* ---- daemon -> client ---------------------------------------------------------------------- */

struct dmsg {
	Tpw__V1__DaemonMsg m;
	Tpw__V1__Descriptor d;
	Tpw__V1__PayloadDesc p[NSEG];
	Tpw__V1__TensorDesc t[NSEG];
	Tpw__V1__PayloadDesc *pp[NSEG];
	Tpw__V1__TensorDesc *tp[NSEG];
	Tpw__V1__Device dev;
};

static void dmsg_init(struct dmsg *x, size_t np, size_t nt, uint64_t len, bool eager)
{
	memset(x, 0, sizeof(*x));
	tpw__v1__daemon_msg__init(&x->m);
	tpw__v1__descriptor__init(&x->d);
	for (size_t i = 0; i < NSEG; i++) {
		tpw__v1__payload_desc__init(&x->p[i]);
		tpw__v1__tensor_desc__init(&x->t[i]);
		x->p[i].length = len;
		x->t[i].length = len;
		x->pp[i] = &x->p[i];
		x->tp[i] = &x->t[i];
	}
	x->d.n_payloads = np;
	x->d.payloads = x->pp;
	x->d.n_tensors = nt;
	x->d.tensors = x->tp;
	x->d.eager = eager;
	x->m.body_case = TPW__V1__DAEMON_MSG__BODY_DESCRIPTOR;
	x->m.descriptor = &x->d;
}

START_TEST(test_validate_eager_descriptor_tail_matches)
{
	struct dmsg x;

	dmsg_init(&x, 2, 1, 10, true);
	ck_assert_int_eq(vd(&x.m, 0, 30), 0);
	ck_assert_int_eq(vd(&x.m, 0, 29), -EBADMSG);
	ck_assert_int_eq(vd(&x.m, 0, 31), -EBADMSG);
	dmsg_init(&x, 0, 0, 0, true);
	ck_assert_int_eq(vd(&x.m, 0, 0), 0);
	dmsg_init(&x, 1, 1, 1000, false);
	ck_assert_int_eq(vd(&x.m, 0, 0), 0);
	ck_assert_int_eq(vd(&x.m, 0, 1), -EBADMSG);
}
END_TEST

START_TEST(test_validate_descriptor_limits)
{
	struct dmsg x;

	dmsg_init(&x, 2, 2, 0, false);
	ck_assert_int_eq(vd(&x.m, 0, 0), 0);
	dmsg_init(&x, 3, 2, 0, false);
	ck_assert_int_eq(vd(&x.m, 0, 0), -E2BIG);
	dmsg_init(&x, 2, 0, UINT64_MAX, false);
	ck_assert_int_eq(vd(&x.m, 0, 0), -EBADMSG); /* lengths overflow */
	dmsg_init(&x, 1, 1, UINT64_MAX, true);
	ck_assert_int_eq(vd(&x.m, 0, 0), -EBADMSG);
	dmsg_init(&x, 0, 1, 1, false);
	tpw__v1__device__init(&x.dev);
	x.t[0].device = &x.dev;
	x.dev.type = TPW__V1__DEVICE_TYPE__DEVICE_UNSPECIFIED;
	ck_assert_int_eq(vd(&x.m, 0, 0), -EBADMSG);
	x.dev.type = TPW__V1__DEVICE_TYPE__DEVICE_CUDA;
	ck_assert_int_eq(vd(&x.m, 0, 0), 0);
}
END_TEST

START_TEST(test_validate_daemon_frames_carry_no_fds_or_stray_tail)
{
	Tpw__V1__DaemonMsg m = TPW__V1__DAEMON_MSG__INIT;
	Tpw__V1__WriteDone wd = TPW__V1__WRITE_DONE__INIT;
	struct dmsg x;

	m.body_case = TPW__V1__DAEMON_MSG__BODY_WRITE_DONE;
	m.write_done = &wd;
	ck_assert_int_eq(vd(&m, 0, 0), 0);
	ck_assert_int_eq(vd(&m, 1, 0), -EBADMSG);
	ck_assert_int_eq(vd(&m, 0, 1), -EBADMSG);
	dmsg_init(&x, 1, 0, 4, true);
	ck_assert_int_eq(vd(&x.m, 1, 4), -EBADMSG);
}
END_TEST

/* FlowCredit returns room for at least one message and at most what that many frames carry. */
START_TEST(test_validate_flow_credit_bounded)
{
	Tpw__V1__DaemonMsg m = TPW__V1__DAEMON_MSG__INIT;
	Tpw__V1__FlowCredit fc = TPW__V1__FLOW_CREDIT__INIT;

	m.body_case = TPW__V1__DAEMON_MSG__BODY_FLOW_CREDIT;
	m.flow_credit = &fc;
	fc.pipe_id = 1;
	fc.messages = 1;
	ck_assert_int_eq(vd(&m, 0, 0), 0);
	fc.bytes = TPW_FRAME_MAX_HARD;
	ck_assert_int_eq(vd(&m, 0, 0), 0);
	fc.bytes++;
	ck_assert_int_eq(vd(&m, 0, 0), -EBADMSG);
	fc.messages = UINT32_MAX;
	fc.bytes = (uint64_t)UINT32_MAX * TPW_FRAME_MAX_HARD;
	ck_assert_int_eq(vd(&m, 0, 0), 0);
	fc.messages = 0;
	fc.bytes = 0;
	ck_assert_int_eq(vd(&m, 0, 0), -EBADMSG);
	fc.messages = 1;
	ck_assert_int_eq(vd(&m, 0, 4), -EBADMSG); /* no data tail */
}
END_TEST

/* ---- CUDA references ------------------------------------------------------------------------ */

static uint8_t handle_bytes[64];

static void set_cuda(Tpw__V1__Segment *s, Tpw__V1__CudaRef *c, uint64_t off, uint64_t len,
		     uint64_t alloc)
{
	tpw__v1__cuda_ref__init(c);
	c->mem_handle = (ProtobufCBinaryData){ 64, handle_bytes };
	c->event_handle = (ProtobufCBinaryData){ 64, handle_bytes };
	c->offset = off;
	c->alloc_size = alloc;
	c->pci_bus_id = "0000:3b:00.0";
	s->loc_case = TPW__V1__SEGMENT__LOC_CUDA;
	s->cuda = c;
	s->length = len;
}

START_TEST(test_validate_cuda_reference)
{
	struct wmsg x;
	Tpw__V1__CudaRef c;

	wmsg_init(&x, 0, 1);
	set_device(&x, 0, TPW__V1__DEVICE_TYPE__DEVICE_CUDA, TPW__V1__DEVICE_TYPE__DEVICE_CUDA);
	set_cuda(&x.seg[NSEG], &c, 100, 900, 1000);
	ck_assert_int_eq(vc(&x.m, 0, 0), 0);
	c.event_handle.len = 0; /* no event: allowed */
	ck_assert_int_eq(vc(&x.m, 0, 0), 0);
	c.event_handle.len = 10;
	ck_assert_int_eq(vc(&x.m, 0, 0), -EBADMSG);
	c.event_handle.len = 64;
	c.mem_handle.len = 63;
	ck_assert_int_eq(vc(&x.m, 0, 0), -EBADMSG);
	c.mem_handle.len = 64;
	c.offset = 101; /* one byte past the allocation */
	ck_assert_int_eq(vc(&x.m, 0, 0), -EBADMSG);
	c.offset = UINT64_MAX - 10; /* wraps */
	ck_assert_int_eq(vc(&x.m, 0, 0), -EBADMSG);
	c.offset = 0;
	c.pci_bus_id = "";
	ck_assert_int_eq(vc(&x.m, 0, 0), -EBADMSG);
	c.pci_bus_id = "0000:3b:00.0; rm -rf";
	ck_assert_int_eq(vc(&x.m, 0, 0), -EBADMSG);
	c.pci_bus_id = "0000:3b:00.0";
	x.seg[NSEG].cuda = NULL;
	ck_assert_int_eq(vc(&x.m, 0, 0), -EBADMSG);
}
END_TEST

/* The device's UUID is optional, and 16 bytes when present (just below and above refused). */
START_TEST(test_validate_cuda_uuid_is_empty_or_16_bytes)
{
	struct wmsg x;
	Tpw__V1__CudaRef c;

	wmsg_init(&x, 0, 1);
	set_device(&x, 0, TPW__V1__DEVICE_TYPE__DEVICE_CUDA, TPW__V1__DEVICE_TYPE__DEVICE_CUDA);
	set_cuda(&x.seg[NSEG], &c, 0, 10, 10);
	c.gpu_uuid = (ProtobufCBinaryData){ 16, handle_bytes };
	ck_assert_int_eq(vc(&x.m, 0, 0), 0);
	c.gpu_uuid.len = 15;
	ck_assert_int_eq(vc(&x.m, 0, 0), -EBADMSG);
	c.gpu_uuid.len = 17;
	ck_assert_int_eq(vc(&x.m, 0, 0), -EBADMSG);
	c.gpu_uuid.len = 0;
	ck_assert_int_eq(vc(&x.m, 0, 0), 0);
}
END_TEST

START_TEST(test_validate_cuda_memory_matches_device)
{
	struct wmsg x;
	struct rmsg r;
	Tpw__V1__CudaRef c;

	/* A CPU tensor cannot point at CUDA memory, nor a CUDA tensor at CPU memory. */
	wmsg_init(&x, 0, 1);
	set_device(&x, 0, TPW__V1__DEVICE_TYPE__DEVICE_CPU, TPW__V1__DEVICE_TYPE__DEVICE_CPU);
	set_cuda(&x.seg[NSEG], &c, 0, 10, 10);
	ck_assert_int_eq(vc(&x.m, 0, 0), -EBADMSG);
	set_device(&x, 0, TPW__V1__DEVICE_TYPE__DEVICE_CUDA, TPW__V1__DEVICE_TYPE__DEVICE_CPU);
	set_inline(&x.seg[NSEG], 0, 10);
	ck_assert_int_eq(vc(&x.m, 0, 10), -EBADMSG);
	/* Payloads are CPU memory, in writes and reads. */
	wmsg_init(&x, 1, 0);
	set_cuda(&x.seg[0], &c, 0, 10, 10);
	ck_assert_int_eq(vc(&x.m, 0, 0), -EBADMSG);
	rmsg_init(&r, 1, 1);
	set_cuda(&r.seg[NSEG], &c, 0, 10, 10);
	ck_assert_int_eq(vc(&r.m, 0, 0), 0);
	set_cuda(&r.seg[0], &c, 0, 10, 10);
	ck_assert_int_eq(vc(&r.m, 0, 0), -EBADMSG);
}
END_TEST

START_TEST(test_validate_cuda_release)
{
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__CudaRelease cr = TPW__V1__CUDA_RELEASE__INIT;

	m.body_case = TPW__V1__CLIENT_MSG__BODY_CUDA_RELEASE;
	m.cuda_release = &cr;
	cr.mem_handle = (ProtobufCBinaryData){ 64, handle_bytes };
	ck_assert_int_eq(vc(&m, 0, 0), 0);
	ck_assert_int_eq(vc(&m, 1, 0), -EBADMSG);
	cr.mem_handle.len = 0;
	ck_assert_int_eq(vc(&m, 0, 0), -EBADMSG);
}
END_TEST

/* CudaDmabuf (issue 28, item 4): exactly one fd, a 64-byte handle, a size; no data tail. */
START_TEST(test_validate_cuda_dmabuf)
{
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__CudaDmabuf db = TPW__V1__CUDA_DMABUF__INIT;

	m.body_case = TPW__V1__CLIENT_MSG__BODY_CUDA_DMABUF;
	m.cuda_dmabuf = &db;
	db.mem_handle = (ProtobufCBinaryData){ 64, handle_bytes };
	db.size = 4096;
	ck_assert_int_eq(vc(&m, 1, 0), 0);
	ck_assert_int_eq(vc(&m, 0, 0), -EBADMSG); /* its fd is missing */
	ck_assert_int_eq(vc(&m, 2, 0), -EBADMSG);
	ck_assert_int_eq(vc(&m, 1, 1), -EBADMSG); /* a data tail */
	db.size = 0;
	ck_assert_int_eq(vc(&m, 1, 0), -EBADMSG);
	db.size = 4096;
	db.mem_handle.len = 63;
	ck_assert_int_eq(vc(&m, 1, 0), -EBADMSG);
}
END_TEST

/* ---- peer messages of cuda_gdr --------------------------------------------------------------- */

static int vp(const Tpw__V1__PeerMsg *m)
{
	struct tpw_hdr h = hdr(0, 0);

	return tpw_peer_msg_validate(m, &h, &lim, why, sizeof(why));
}

START_TEST(test_validate_peer_rdma_setup)
{
	uint8_t rec[TPW_RDMA_QP_RECORD_BYTES + 1] = { 0 };
	ProtobufCBinaryData qps[2] = { { TPW_RDMA_QP_RECORD_BYTES, rec },
				       { TPW_RDMA_QP_RECORD_BYTES, rec } };
	Tpw__V1__PeerRdma r = TPW__V1__PEER_RDMA__INIT;
	Tpw__V1__PeerMsg m = TPW__V1__PEER_MSG__INIT;

	m.body_case = TPW__V1__PEER_MSG__BODY_RDMA;
	m.rdma = &r;
	r.ports = TPW_RDMA_PORTS_MAX;
	ck_assert_int_eq(vp(&m), 0);
	r.ports = TPW_RDMA_PORTS_MAX + 1;
	ck_assert_int_eq(vp(&m), -EBADMSG);
	r.ports = 0;
	r.n_qps = 2;
	r.qps = qps;
	ck_assert_int_eq(vp(&m), 0);
	qps[1].len = TPW_RDMA_QP_RECORD_BYTES + 1;
	ck_assert_int_eq(vp(&m), -EBADMSG);
	ck_assert_ptr_nonnull(strstr(why, "queue-pair record"));
	qps[1].len = 0;
	ck_assert_int_eq(vp(&m), -EBADMSG);
	r.n_qps = TPW_RDMA_PORTS_MAX * TPW_RDMA_PORTS_MAX + 1;
	ck_assert_int_eq(vp(&m), -E2BIG);
}
END_TEST

/* Rails come one per announced port, each TPW_RDMA_RAIL_BYTES long. */
START_TEST(test_validate_peer_rdma_rails)
{
	uint8_t rail[TPW_RDMA_RAIL_BYTES + 1] = { 0 };
	ProtobufCBinaryData rails[3] = { { TPW_RDMA_RAIL_BYTES, rail },
					 { TPW_RDMA_RAIL_BYTES, rail },
					 { TPW_RDMA_RAIL_BYTES, rail } };
	Tpw__V1__PeerRdma r = TPW__V1__PEER_RDMA__INIT;
	Tpw__V1__PeerMsg m = TPW__V1__PEER_MSG__INIT;

	m.body_case = TPW__V1__PEER_MSG__BODY_RDMA;
	m.rdma = &r;
	r.ports = 2;
	r.rails = rails;
	r.n_rails = 2;
	ck_assert_int_eq(vp(&m), 0);
	r.n_rails = 3;
	ck_assert_int_eq(vp(&m), -EBADMSG);
	ck_assert_str_eq(why, "3 rails for 2 ports");
	r.n_rails = 1;
	ck_assert_int_eq(vp(&m), -EBADMSG);
	r.n_rails = 2;
	rails[1].len = TPW_RDMA_RAIL_BYTES + 1;
	ck_assert_int_eq(vp(&m), -EBADMSG);
	ck_assert_str_eq(why, "rail of 17 bytes");
	rails[1].len = TPW_RDMA_RAIL_BYTES - 1;
	ck_assert_int_eq(vp(&m), -EBADMSG);
}
END_TEST

START_TEST(test_validate_peer_read_req_offer_bounded)
{
	Tpw__V1__PeerRdmaRegion reg = TPW__V1__PEER_RDMA_REGION__INIT;
	Tpw__V1__PeerRdmaRegion *regs[5] = { &reg, &reg, &reg, &reg, &reg };
	Tpw__V1__PeerReadReq rr = TPW__V1__PEER_READ_REQ__INIT;
	Tpw__V1__PeerMsg m = TPW__V1__PEER_MSG__INIT;

	m.body_case = TPW__V1__PEER_MSG__BODY_READ_REQ;
	m.read_req = &rr;
	ck_assert_int_eq(vp(&m), 0);
	rr.rdma = regs;
	rr.n_rdma = lim.segments_max;
	ck_assert_int_eq(vp(&m), 0);
	rr.n_rdma = lim.segments_max + 1;
	ck_assert_int_eq(vp(&m), -E2BIG);
}
END_TEST

/* A peer's connect wait is bounded: TPW_PEER_WAIT_MS_MAX passes, one more closes the link. */
/* A group over several hosts: member hosts, host addresses and token are bounded (issue 24). */
START_TEST(test_validate_group_hosts)
{
	Tpw__V1__GroupJoined j = TPW__V1__GROUP_JOINED__INIT;
	Tpw__V1__DaemonMsg m = TPW__V1__DAEMON_MSG__INIT;
	Tpw__V1__PeerGroupJoined pj = TPW__V1__PEER_GROUP_JOINED__INIT;
	Tpw__V1__PeerGroupMember mv[2] = { TPW__V1__PEER_GROUP_MEMBER__INIT,
					   TPW__V1__PEER_GROUP_MEMBER__INIT };
	Tpw__V1__PeerGroupMember *mp[2] = { &mv[0], &mv[1] };
	Tpw__V1__PeerMsg pm = TPW__V1__PEER_MSG__INIT;
	uint32_t hosts[2] = { 0, 1 };
	uint8_t token[TPW_GROUP_TOKEN_BYTES + 1] = { 0 };
	char longaddr[TPW_GROUP_ADDR_MAX + 2];
	char *addrs[2] = { "", "10.0.0.2:7420" };

	m.body_case = TPW__V1__DAEMON_MSG__BODY_GROUP_JOINED;
	m.group_joined = &j;
	j.size = 2;
	j.hosts = 2;
	j.n_member_hosts = 2;
	j.member_hosts = hosts;
	j.n_host_addrs = 2;
	j.host_addrs = addrs;
	j.token.data = token;
	j.token.len = TPW_GROUP_TOKEN_BYTES;
	ck_assert_int_eq(vd(&m, 0, 0), 0);
	j.token.len = TPW_GROUP_TOKEN_BYTES + 1;
	ck_assert_int_eq(vd(&m, 0, 0), -EBADMSG);
	j.token.len = TPW_GROUP_TOKEN_BYTES;
	hosts[1] = 2; /* no host 2 of 2 */
	ck_assert_int_eq(vd(&m, 0, 0), -EBADMSG);
	hosts[1] = 1;
	j.n_member_hosts = 1;
	ck_assert_int_eq(vd(&m, 0, 0), -EBADMSG);
	j.n_member_hosts = 2;
	j.n_host_addrs = 1;
	ck_assert_int_eq(vd(&m, 0, 0), -EBADMSG);
	j.n_host_addrs = 2;
	memset(longaddr, 'a', sizeof(longaddr) - 1);
	longaddr[sizeof(longaddr) - 1] = '\0';
	addrs[1] = longaddr;
	ck_assert_int_eq(vd(&m, 0, 0), -EBADMSG);
	longaddr[TPW_GROUP_ADDR_MAX] = '\0';
	ck_assert_int_eq(vd(&m, 0, 0), 0);

	pm.body_case = TPW__V1__PEER_MSG__BODY_GROUP_JOINED;
	pm.group_joined = &pj;
	pj.status = TPW__V1__STATUS__STATUS_OK;
	pj.message = "";
	pj.size = 2;
	pj.local_size = 1;
	pj.hosts = 2;
	pj.n_members = 2;
	pj.members = mp;
	mv[1].rank = 1;
	mv[1].host_index = 1;
	mv[0].host = mv[1].host = "h";
	pj.n_host_addrs = 2;
	pj.host_addrs = addrs;
	pj.token.data = token;
	pj.token.len = TPW_GROUP_TOKEN_BYTES;
	ck_assert_int_eq(vp(&pm), 0);
	pj.n_host_addrs = 3;
	ck_assert_int_eq(vp(&pm), -EBADMSG);
	pj.n_host_addrs = 2;
	pj.token.len = 3;
	ck_assert_int_eq(vp(&pm), -EBADMSG);
}
END_TEST

/* A coordinator's answer adds up as the coordinator computes it: hosts numbered by their lowest
 * rank, the member's rank on its own host, its local size and rank those of that host (an
 * answer that did not gave a member a rank of another host, or a local rank taken twice). */
/* A group's remote access, in a client's GroupJoin and a peer's PeerGroupJoin, as a
 * listener's: a known mode, 1..TPW_REMOTE_PEERS_MAX identities with PEERS and only with it. */
START_TEST(test_validate_group_remote_access_and_peer_count)
{
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__GroupJoin j = TPW__V1__GROUP_JOIN__INIT;
	Tpw__V1__PeerMsg pm = TPW__V1__PEER_MSG__INIT;
	Tpw__V1__PeerGroupJoin pj = TPW__V1__PEER_GROUP_JOIN__INIT;
	char *peers[TPW_REMOTE_PEERS_MAX + 1];

	for (size_t i = 0; i <= TPW_REMOTE_PEERS_MAX; i++)
		peers[i] = "cert:gn02";
	j.name = pj.name = "g";
	j.size = pj.size = 2;
	j.rank = pj.rank = -1;
	j.bootstrap = TPW__V1__GROUP_BOOTSTRAP__GROUP_BOOTSTRAP_COORDINATOR;
	j.coordinator = "tpip://gn01";
	m.body_case = TPW__V1__CLIENT_MSG__BODY_GROUP_JOIN;
	m.group_join = &j;
	pm.body_case = TPW__V1__PEER_MSG__BODY_GROUP_JOIN;
	pm.group_join = &pj;
	for (int a = 0; a <= TPW__V1__REMOTE_ACCESS__REMOTE_ANY_PEER; a++) {
		j.remote = pj.remote = a;
		ck_assert_int_eq(vc(&m, 0, 0), 0);
		ck_assert_int_eq(vp(&pm), 0);
	}
	j.remote = pj.remote = enum_max(&tpw__v1__remote_access__descriptor) + 1;
	ck_assert_int_eq(vc(&m, 0, 0), -EBADMSG);
	ck_assert_int_eq(vp(&pm), -EBADMSG);
	j.remote = pj.remote = TPW__V1__REMOTE_ACCESS__REMOTE_PEERS;
	ck_assert_int_eq(vc(&m, 0, 0), -EBADMSG); /* PEERS without a peer */
	ck_assert_int_eq(vp(&pm), -EBADMSG);
	j.remote_peers = pj.remote_peers = peers;
	j.n_remote_peers = pj.n_remote_peers = TPW_REMOTE_PEERS_MAX;
	ck_assert_int_eq(vc(&m, 0, 0), 0);
	ck_assert_int_eq(vp(&pm), 0);
	j.n_remote_peers = pj.n_remote_peers = TPW_REMOTE_PEERS_MAX + 1;
	ck_assert_int_eq(vc(&m, 0, 0), -EBADMSG);
	ck_assert_int_eq(vp(&pm), -EBADMSG);
	j.n_remote_peers = pj.n_remote_peers = 1;
	j.remote = pj.remote = TPW__V1__REMOTE_ACCESS__REMOTE_ANY_PEER;
	ck_assert_int_eq(vc(&m, 0, 0), -EBADMSG); /* peers only with PEERS */
	ck_assert_int_eq(vp(&pm), -EBADMSG);
	j.remote = pj.remote = TPW__V1__REMOTE_ACCESS__REMOTE_PEERS;
	peers[0] = "";
	ck_assert_int_eq(vc(&m, 0, 0), -EBADMSG);
	ck_assert_int_eq(vp(&pm), -EBADMSG);
}
END_TEST

START_TEST(test_validate_peer_group_joined_adds_up)
{
	Tpw__V1__PeerGroupJoined pj = TPW__V1__PEER_GROUP_JOINED__INIT;
	Tpw__V1__PeerGroupMember mv[4];
	Tpw__V1__PeerGroupMember *mp[4] = { &mv[0], &mv[1], &mv[2], &mv[3] };
	Tpw__V1__PeerMsg pm = TPW__V1__PEER_MSG__INIT;
	static const uint32_t host_of[4] = { 0, 1, 0, 1 };

	for (unsigned i = 0; i < 4; i++) {
		tpw__v1__peer_group_member__init(&mv[i]);
		mv[i].rank = i;
		mv[i].host_index = host_of[i];
		mv[i].host = "h";
	}
	pm.body_case = TPW__V1__PEER_MSG__BODY_GROUP_JOINED;
	pm.group_joined = &pj;
	pj.status = TPW__V1__STATUS__STATUS_OK;
	pj.message = "";
	pj.size = 4;
	pj.hosts = 2;
	pj.n_members = 4;
	pj.members = mp;
	pj.rank = 3; /* host 1's second member: local rank 1 of 2 */
	pj.host_index = 1;
	pj.local_rank = 1;
	pj.local_size = 2;
	ck_assert_int_eq(vp(&pm), 0);
	pj.local_rank = 0; /* rank 1's place */
	ck_assert_int_eq(vp(&pm), -EBADMSG);
	ck_assert_ptr_nonnull(strstr(why, "does not add up"));
	pj.local_rank = 1;
	pj.local_size = 3; /* host 1 has 2 members */
	ck_assert_int_eq(vp(&pm), -EBADMSG);
	pj.local_size = 2;
	pj.host_index = 0; /* rank 3 is on host 1 */
	ck_assert_int_eq(vp(&pm), -EBADMSG);
	pj.host_index = 1;
	mv[0].host_index = 1; /* host 1 before host 0 */
	mv[1].host_index = 0;
	mv[2].host_index = 1;
	mv[3].host_index = 0;
	ck_assert_int_eq(vp(&pm), -EBADMSG);
	mv[0].host_index = 0;
	mv[1].host_index = mv[2].host_index = mv[3].host_index = 1;
	pj.local_rank = 2;
	pj.local_size = 3;
	ck_assert_int_eq(vp(&pm), 0);
	pj.hosts = 3; /* a host without members */
	ck_assert_int_eq(vp(&pm), -EBADMSG);
	pj.hosts = 2;
	pj.status = TPW__V1__STATUS__STATUS_LIMIT; /* a refusal carries no membership */
	pj.size = 0;
	ck_assert_int_eq(vp(&pm), 0);
}
END_TEST

/* A Hello's frame_max: unsaid (0) or at least TPW_FRAME_MAX_MIN. */
START_TEST(test_validate_peer_hello_frame_max_bounded)
{
	Tpw__V1__PeerHello h = TPW__V1__PEER_HELLO__INIT;
	Tpw__V1__PeerMsg m = TPW__V1__PEER_MSG__INIT;

	m.body_case = TPW__V1__PEER_MSG__BODY_HELLO;
	m.hello = &h;
	h.host = "h";
	ck_assert_int_eq(vp(&m), 0);
	h.frame_max = TPW_FRAME_MAX_MIN;
	ck_assert_int_eq(vp(&m), 0);
	h.frame_max = TPW_FRAME_MAX_MIN - 1;
	ck_assert_int_eq(vp(&m), -EBADMSG);
	ck_assert_ptr_nonnull(strstr(why, "frame max of 4095 bytes"));
	h.frame_max = 1;
	ck_assert_int_eq(vp(&m), -EBADMSG);
}
END_TEST

START_TEST(test_validate_peer_connect_wait_bounded)
{
	Tpw__V1__PeerConnect c = TPW__V1__PEER_CONNECT__INIT;
	Tpw__V1__PeerMsg m = TPW__V1__PEER_MSG__INIT;

	m.body_case = TPW__V1__PEER_MSG__BODY_CONNECT;
	m.connect = &c;
	c.name = "trainer0";
	c.wait_ms = TPW_PEER_WAIT_MS_MAX;
	ck_assert_int_eq(vp(&m), 0);
	c.wait_ms = TPW_PEER_WAIT_MS_MAX + 1;
	ck_assert_int_eq(vp(&m), -EBADMSG);
	ck_assert_ptr_nonnull(strstr(why, "connect wait"));
}
END_TEST

/* ---- channels and work queues across hosts (issue 25 part xhost) ----------------------------- */

static int vpt(const Tpw__V1__PeerMsg *m, uint32_t data_len)
{
	struct tpw_hdr h = hdr(0, data_len);

	return tpw_peer_msg_validate(m, &h, &lim, why, sizeof(why));
}

/* A client may open and unlink "tpip://HOST[:PORT]/NAME"; a peer names a plain name, never an
 * address, and its write's items add up to the tail as a client's do. */
START_TEST(test_validate_peer_chan_op)
{
	Tpw__V1__ChanOp o = TPW__V1__CHAN_OP__INIT;
	Tpw__V1__PeerChanOp po = TPW__V1__PEER_CHAN_OP__INIT;
	Tpw__V1__PeerMsg m = TPW__V1__PEER_MSG__INIT;
	Tpw__V1__ClientMsg cm = TPW__V1__CLIENT_MSG__INIT;
	uint64_t lens[2] = { 3, 4 };

	cm.body_case = TPW__V1__CLIENT_MSG__BODY_CHAN_OP;
	cm.chan_op = &o;
	o.op = TPW__V1__CHAN_OP_KIND__CHAN_OP_OPEN;
	o.name = "tpip://hostb:7420/work";
	ck_assert_int_eq(vc(&cm, 0, 0), 0);
	o.name = "tpip://hostb:7420/";
	ck_assert_int_eq(vc(&cm, 0, 0), -EBADMSG);
	m.body_case = TPW__V1__PEER_MSG__BODY_CHAN_OP;
	m.chan_op = &po;
	ck_assert_int_eq(vpt(&m, 0), -EBADMSG); /* no op */
	po.op = &o;
	o.name = "tpip://hostb:7420/work";
	ck_assert_int_eq(vpt(&m, 0), -EBADMSG);
	o.name = "work";
	ck_assert_int_eq(vpt(&m, 0), 0);
	o.op = TPW__V1__CHAN_OP_KIND__CHAN_OP_UNLINK; /* peer minor 6: the host decides */
	ck_assert_int_eq(vpt(&m, 0), 0);
	o.name = "tpip://hostb:7420/work"; /* an address never crosses a link */
	ck_assert_int_eq(vpt(&m, 0), -EBADMSG);
	ck_assert_int_eq(vc(&cm, 0, 0), 0); /* a client's unlink of an address is forwarded */
	o.name = "work";
	o.op = TPW__V1__CHAN_OP_KIND__CHAN_OP_READ;
	ck_assert_int_eq(vpt(&m, 0), 0);
	ck_assert_int_eq(vpt(&m, 1), -EBADMSG); /* a tail on a read */
	o.op = TPW__V1__CHAN_OP_KIND__CHAN_OP_WRITE;
	o.n_lengths = 2;
	o.lengths = lens;
	ck_assert_int_eq(vpt(&m, 7), 0);
	ck_assert_int_eq(vpt(&m, 8), -EBADMSG);
	ck_assert_int_eq(vpt(&m, 6), -EBADMSG);
	o.n_lengths = lim.segments_max + 1;
	ck_assert_int_eq(vpt(&m, 7), -E2BIG);
}
END_TEST

/* Large items across hosts (peer minor 6): a peer's WRITE marks the streamed items, one flag per
 * item, and its tail holds the others only; a READ's transfer comes with its room; none of it
 * from a client; answers: an item copied (one length, no tail), held (no length), or a transfer
 * id (no item); PeerMsg.chan_xfer_end. */
START_TEST(test_validate_peer_chan_streamed)
{
	Tpw__V1__ChanOp o = TPW__V1__CHAN_OP__INIT;
	Tpw__V1__PeerChanOp po = TPW__V1__PEER_CHAN_OP__INIT;
	Tpw__V1__PeerMsg m = TPW__V1__PEER_MSG__INIT;
	Tpw__V1__ClientMsg cm = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__ChanReply r = TPW__V1__CHAN_REPLY__INIT;
	Tpw__V1__PeerChanReply pr = TPW__V1__PEER_CHAN_REPLY__INIT;
	Tpw__V1__PeerXferEnd xe = TPW__V1__PEER_XFER_END__INIT;
	uint64_t lens[2] = { 3, 16u << 20 }, one = 16u << 20;
	protobuf_c_boolean streamed[2] = { false, true };

	cm.body_case = TPW__V1__CLIENT_MSG__BODY_CHAN_OP;
	cm.chan_op = &o;
	m.body_case = TPW__V1__PEER_MSG__BODY_CHAN_OP;
	m.chan_op = &po;
	po.op = &o;
	o.op = TPW__V1__CHAN_OP_KIND__CHAN_OP_WRITE;
	o.n_lengths = 2;
	o.lengths = lens;
	o.n_streamed = 2;
	o.streamed = streamed;
	ck_assert_int_eq(vpt(&m, 3), 0);
	ck_assert_int_eq(vpt(&m, 4), -EBADMSG); /* the streamed item is not in the tail */
	ck_assert_int_eq(vc(&cm, 0, 3), -EBADMSG); /* never from a client */
	o.n_streamed = 1;
	ck_assert_int_eq(vpt(&m, 3), -EBADMSG); /* one flag per item */
	o.n_streamed = 0;
	o.n_lengths = 0;
	o.lengths = NULL;
	o.op = TPW__V1__CHAN_OP_KIND__CHAN_OP_READ;
	o.xfer_id = 9;
	ck_assert_int_eq(vpt(&m, 0), -EBADMSG); /* a transfer without room */
	o.room = 1u << 20;
	ck_assert_int_eq(vpt(&m, 0), 0);
	o.take_held = true;
	ck_assert_int_eq(vpt(&m, 0), 0);
	ck_assert_int_eq(vc(&cm, 0, 0), -EBADMSG);
	o.take_held = false;
	o.xfer_id = 0;
	ck_assert_int_eq(vpt(&m, 0), -EBADMSG); /* room without a transfer */
	o.room = 0;
	m.body_case = TPW__V1__PEER_MSG__BODY_CHAN_REPLY;
	m.chan_reply = &pr;
	pr.reply = &r;
	r.copied = true;
	r.n_lengths = 1;
	r.lengths = &one;
	ck_assert_int_eq(vpt(&m, 0), 0);
	ck_assert_int_eq(vpt(&m, 5), -EBADMSG);
	r.copied = false;
	r.n_lengths = 0;
	r.held_len = one;
	ck_assert_int_eq(vpt(&m, 0), 0);
	r.held_len = 0;
	r.xfer_id = 3;
	ck_assert_int_eq(vpt(&m, 0), 0);
	r.n_lengths = 1;
	ck_assert_int_eq(vpt(&m, 0), -EBADMSG); /* a transfer id with an item */
	r.n_lengths = 0;
	r.xfer_id = 0;
	r.remote_refs = true;
	ck_assert_int_eq(vpt(&m, 0), -EBADMSG); /* the client's flag, never from a peer */
	m.body_case = TPW__V1__PEER_MSG__BODY_CHAN_XFER_END;
	m.chan_xfer_end = &xe;
	xe.xfer_id = 3;
	ck_assert_int_eq(vpt(&m, 0), 0);
	ck_assert_int_eq(vpt(&m, 1), -EBADMSG); /* no tail */
}
END_TEST


/* A peer's answer: its item matches the tail; no tail without an item. A batch (peer minor
 * 10): inline byte items only, none empty, adding up to the tail exactly, at most segments_max
 * of them (just at and just above). */
START_TEST(test_validate_peer_chan_reply)
{
	Tpw__V1__ChanReply r = TPW__V1__CHAN_REPLY__INIT;
	Tpw__V1__PeerChanReply pr = TPW__V1__PEER_CHAN_REPLY__INIT;
	Tpw__V1__PeerMsg m = TPW__V1__PEER_MSG__INIT;
	uint64_t lens[2] = { 5, 5 }, *many = calloc(lim.segments_max + 1, sizeof(*many));

	m.body_case = TPW__V1__PEER_MSG__BODY_CHAN_REPLY;
	m.chan_reply = &pr;
	ck_assert_int_eq(vpt(&m, 0), -EBADMSG); /* no reply */
	pr.reply = &r;
	ck_assert_int_eq(vpt(&m, 0), 0);
	ck_assert_int_eq(vpt(&m, 5), -EBADMSG);
	r.n_lengths = 1;
	r.lengths = lens;
	ck_assert_int_eq(vpt(&m, 5), 0);
	ck_assert_int_eq(vpt(&m, 4), -EBADMSG);
	r.n_lengths = 2;
	ck_assert_int_eq(vpt(&m, 10), 0);
	ck_assert_int_eq(vpt(&m, 9), -EBADMSG);
	ck_assert_int_eq(vpt(&m, 11), -EBADMSG);
	lens[0] = 0; /* an empty item */
	ck_assert_int_eq(vpt(&m, 5), -EBADMSG);
	lens[0] = UINT64_MAX - 2; /* wrapping to the tail */
	ck_assert_int_eq(vpt(&m, 2), -EBADMSG);
	lens[0] = 5;
	r.held_len = 7; /* a batch is inline items only */
	ck_assert_int_eq(vpt(&m, 10), -EBADMSG);
	r.held_len = 0;
	r.msg_taken = true;
	ck_assert_int_eq(vpt(&m, 10), -EBADMSG);
	r.msg_taken = false;
	r.copied = true;
	ck_assert_int_eq(vpt(&m, 10), -EBADMSG);
	r.copied = false;
	ck_assert_ptr_nonnull(many);
	for (size_t i = 0; i <= lim.segments_max; i++)
		many[i] = 1;
	r.lengths = many;
	r.n_lengths = lim.segments_max;
	ck_assert_int_eq(vpt(&m, lim.segments_max), 0);
	r.n_lengths = lim.segments_max + 1;
	ck_assert_int_eq(vpt(&m, lim.segments_max + 1), -EBADMSG);
	free(many);
}
END_TEST

/* A channel write by segment (client minor 7): one segment per item and of its length; inline
 * ones back to back in order covering the tail exactly; shared-buffer ranges with a reference
 * and addresses that do not wrap; no CUDA memory; never from a peer daemon. */
START_TEST(test_validate_chan_segments)
{
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__ChanOp o = TPW__V1__CHAN_OP__INIT;
	Tpw__V1__ShmRef ref = TPW__V1__SHM_REF__INIT;
	Tpw__V1__Segment g[3], *gp[3] = { &g[0], &g[1], &g[2] };
	Tpw__V1__PeerChanOp po = TPW__V1__PEER_CHAN_OP__INIT;
	Tpw__V1__PeerMsg pm = TPW__V1__PEER_MSG__INIT;
	uint64_t lens[3] = { 3, 1u << 30, 4 };

	for (size_t i = 0; i < 3; i++)
		tpw__v1__segment__init(&g[i]);
	m.body_case = TPW__V1__CLIENT_MSG__BODY_CHAN_OP;
	m.chan_op = &o;
	o.op = TPW__V1__CHAN_OP_KIND__CHAN_OP_WRITE;
	o.n_lengths = 3;
	o.lengths = lens;
	o.n_segments = 3;
	o.segments = gp;
	g[0] = (Tpw__V1__Segment)TPW__V1__SEGMENT__INIT;
	g[0].length = 3;
	g[0].loc_case = TPW__V1__SEGMENT__LOC_INLINE_OFF;
	g[1].length = 1u << 30; /* far above the inline limit: by reference */
	g[1].loc_case = TPW__V1__SEGMENT__LOC_SHM;
	g[1].shm = &ref;
	g[2].length = 4;
	g[2].loc_case = TPW__V1__SEGMENT__LOC_INLINE_OFF;
	g[2].inline_off = 3;
	ck_assert_int_eq(vc(&m, 0, 7), 0);
	ck_assert_int_eq(vc(&m, 0, 8), -EBADMSG); /* the tail is more than the inline items */
	ck_assert_int_eq(vc(&m, 0, 6), -EBADMSG);
	g[2].inline_off = 4; /* not back to back */
	ck_assert_int_eq(vc(&m, 0, 8), -EBADMSG);
	g[2].inline_off = 3;
	g[1].shm = NULL;
	ck_assert_int_eq(vc(&m, 0, 7), -EBADMSG);
	g[1].loc_case = TPW__V1__SEGMENT__LOC_CMA_ADDR;
	g[1].cma_addr = UINT64_MAX - (1u << 30) + 1; /* just wraps */
	ck_assert_int_eq(vc(&m, 0, 7), -EBADMSG);
	g[1].cma_addr = UINT64_MAX - (1u << 30); /* just does not */
	ck_assert_int_eq(vc(&m, 0, 7), 0);
	g[1].loc_case = TPW__V1__SEGMENT__LOC_CUDA;
	ck_assert_int_eq(vc(&m, 0, 7), -EBADMSG);
	g[1].loc_case = TPW__V1__SEGMENT__LOC_CMA_ADDR;
	g[1].length = lens[1] - 1; /* not the item's length */
	ck_assert_int_eq(vc(&m, 0, 7), -EBADMSG);
	g[1].length = lens[1];
	o.n_segments = 2; /* not one per item */
	ck_assert_int_eq(vc(&m, 0, 7), -EBADMSG);
	o.n_segments = 3;
	lens[1] = g[1].length = (1ull << 40) + 1; /* above the item bound */
	ck_assert_int_eq(vc(&m, 0, 7), -EBADMSG);
	lens[1] = g[1].length = 1ull << 40; /* at it */
	g[1].cma_addr = 0;
	ck_assert_int_eq(vc(&m, 0, 7), 0);
	pm.body_case = TPW__V1__PEER_MSG__BODY_CHAN_OP;
	pm.chan_op = &po;
	po.op = &o;
	ck_assert_int_eq(vpt(&pm, 7), -EBADMSG); /* never from a peer */
	o.op = TPW__V1__CHAN_OP_KIND__CHAN_OP_CLOSE; /* segments on an op without items */
	o.n_lengths = 0;
	ck_assert_int_eq(vc(&m, 0, 0), -EBADMSG);
}
END_TEST

/* A channel read (client minor 7): at most one destination, a shared-buffer range or an
 * address, not empty, required by take_held, never with a batch; max_items up to segments_max;
 * read fields on other ops refused; none of it from a peer but a batch read (peer minor 10),
 * whose size this daemon cuts to its own limit when it serves it, never into one transfer. */
START_TEST(test_validate_chan_read_fields)
{
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__ChanOp o = TPW__V1__CHAN_OP__INIT;
	Tpw__V1__Segment g = TPW__V1__SEGMENT__INIT, *gp[2] = { &g, &g };
	Tpw__V1__PeerChanOp po = TPW__V1__PEER_CHAN_OP__INIT;
	Tpw__V1__PeerMsg pm = TPW__V1__PEER_MSG__INIT;

	m.body_case = TPW__V1__CLIENT_MSG__BODY_CHAN_OP;
	m.chan_op = &o;
	o.op = TPW__V1__CHAN_OP_KIND__CHAN_OP_READ;
	o.max_items = lim.segments_max; /* just at */
	ck_assert_int_eq(vc(&m, 0, 0), 0);
	o.max_items = lim.segments_max + 1; /* just above */
	ck_assert_int_eq(vc(&m, 0, 0), -E2BIG);
	o.max_items = 0;
	o.take_held = true; /* without a destination */
	ck_assert_int_eq(vc(&m, 0, 0), -EBADMSG);
	o.n_segments = 1;
	o.segments = gp;
	g.loc_case = TPW__V1__SEGMENT__LOC_CMA_ADDR;
	g.cma_addr = 4096;
	ck_assert_int_eq(vc(&m, 0, 0), -EBADMSG); /* empty */
	g.length = 1;
	ck_assert_int_eq(vc(&m, 0, 0), 0);
	g.loc_case = TPW__V1__SEGMENT__LOC_INLINE_OFF;
	ck_assert_int_eq(vc(&m, 0, 0), -EBADMSG);
	g.loc_case = TPW__V1__SEGMENT__LOC_CMA_ADDR;
	o.max_items = 2; /* a batch into one destination */
	ck_assert_int_eq(vc(&m, 0, 0), -EBADMSG);
	o.max_items = 0;
	o.n_segments = 2;
	ck_assert_int_eq(vc(&m, 0, 0), -EBADMSG);
	o.n_segments = 1;
	pm.body_case = TPW__V1__PEER_MSG__BODY_CHAN_OP;
	pm.chan_op = &po;
	po.op = &o;
	ck_assert_int_eq(vpt(&pm, 0), -EBADMSG);
	o.n_segments = 0;
	o.take_held = false;
	o.max_items = 2;
	ck_assert_int_eq(vpt(&pm, 0), 0);
	o.max_items = lim.segments_max + 1; /* served as segments_max */
	ck_assert_int_eq(vpt(&pm, 0), 0);
	o.xfer_id = 9;
	o.room = 4096;
	ck_assert_int_eq(vpt(&pm, 0), -EBADMSG); /* a batch into one transfer */
	o.pack_peer = true; /* ... packed within it: a peer's packed read */
	ck_assert_int_eq(vpt(&pm, 0), 0);
	o.msg = true;
	ck_assert_int_eq(vpt(&pm, 0), -EBADMSG);
	o.msg = false;
	o.xfer_id = 0;
	o.room = 0;
	ck_assert_int_eq(vpt(&pm, 0), -EBADMSG); /* packed without a transfer */
	ck_assert_int_eq(vc(&m, 0, 0), -EBADMSG); /* never from a client */
	o.pack_peer = false;
	o.max_items = 0;
	o.inline_only = true;
	ck_assert_int_eq(vc(&m, 0, 0), 0);
	o.op = TPW__V1__CHAN_OP_KIND__CHAN_OP_CLOSE;
	ck_assert_int_eq(vc(&m, 0, 0), -EBADMSG);
}
END_TEST

/* A packed batch read (ChanOp.pack, tp_chan_read_many_into()): exactly one destination, not
 * empty and at most the largest item (just at and just above), a batch up to segments_max
 * into it; not with msg, take_held or map_done; not on another op; never from a peer. */
START_TEST(test_validate_chan_read_packed)
{
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__ChanOp o = TPW__V1__CHAN_OP__INIT;
	Tpw__V1__Segment g = TPW__V1__SEGMENT__INIT, *gp[2] = { &g, &g };
	Tpw__V1__PeerChanOp po = TPW__V1__PEER_CHAN_OP__INIT;
	Tpw__V1__PeerMsg pm = TPW__V1__PEER_MSG__INIT;

	m.body_case = TPW__V1__CLIENT_MSG__BODY_CHAN_OP;
	m.chan_op = &o;
	o.op = TPW__V1__CHAN_OP_KIND__CHAN_OP_READ;
	o.pack = true;
	o.max_items = lim.segments_max;
	ck_assert_int_eq(vc(&m, 0, 0), -EBADMSG); /* no destination */
	o.n_segments = 1;
	o.segments = gp;
	g.loc_case = TPW__V1__SEGMENT__LOC_CMA_ADDR;
	g.cma_addr = 4096;
	ck_assert_int_eq(vc(&m, 0, 0), -EBADMSG); /* an empty one */
	g.length = 1ull << 40; /* the largest item: just at */
	ck_assert_int_eq(vc(&m, 0, 0), 0);
	g.length = (1ull << 40) + 1; /* just above */
	ck_assert_int_eq(vc(&m, 0, 0), -EBADMSG);
	g.length = 4096;
	o.max_items = lim.segments_max + 1;
	ck_assert_int_eq(vc(&m, 0, 0), -E2BIG);
	o.max_items = 0; /* one item, packed: allowed */
	ck_assert_int_eq(vc(&m, 0, 0), 0);
	o.max_items = 2;
	o.pack = false; /* the same batch unpacked */
	ck_assert_int_eq(vc(&m, 0, 0), -EBADMSG);
	o.pack = true;
	o.n_segments = 2;
	ck_assert_int_eq(vc(&m, 0, 0), -EBADMSG);
	o.n_segments = 1;
	o.msg = true;
	ck_assert_int_eq(vc(&m, 0, 0), -EBADMSG);
	o.msg = false;
	o.take_held = true;
	ck_assert_int_eq(vc(&m, 0, 0), -EBADMSG);
	o.take_held = false;
	o.map_done = true;
	ck_assert_int_eq(vc(&m, 0, 0), -EBADMSG);
	o.map_done = false;
	o.map_ok = true; /* a large first item may be read by mapping */
	ck_assert_int_eq(vc(&m, 0, 0), 0);
	o.map_ok = false;
	o.pack_copied = true; /* large items copied to their packed places */
	ck_assert_int_eq(vc(&m, 0, 0), 0);
	o.pack = false; /* not without pack */
	o.max_items = 0;
	ck_assert_int_eq(vc(&m, 0, 0), -EBADMSG);
	o.pack = true;
	o.max_items = 2;
	pm.body_case = TPW__V1__PEER_MSG__BODY_CHAN_OP;
	pm.chan_op = &po;
	po.op = &o;
	o.n_segments = 0;
	ck_assert_int_eq(vpt(&pm, 0), -EBADMSG); /* never from a peer */
	o.pack = false;
	o.max_items = 0;
	ck_assert_int_eq(vpt(&pm, 0), -EBADMSG); /* pack_copied alone neither */
	o.pack_copied = false;
	o.pack = true;
	o.max_items = 2;
	o.n_segments = 1;
	o.pack_mapped = true; /* several items by mapping: only with map_ok */
	ck_assert_int_eq(vc(&m, 0, 0), -EBADMSG);
	o.map_ok = true;
	ck_assert_int_eq(vc(&m, 0, 0), 0);
	o.pack = false; /* not without pack */
	o.max_items = 0;
	ck_assert_int_eq(vc(&m, 0, 0), -EBADMSG);
	o.n_segments = 0;
	ck_assert_int_eq(vpt(&pm, 0), -EBADMSG); /* never from a peer */
	o.pack_mapped = false;
	o.map_ok = false;
	o.pack = true;
	o.max_items = 2;
	o.op = TPW__V1__CHAN_OP_KIND__CHAN_OP_CLOSE;
	o.max_items = 0;
	ck_assert_int_eq(vc(&m, 0, 0), -EBADMSG); /* nor on another op */
}
END_TEST

/* A channel item's message descriptor (client minor 8; the daemon's handler checks it): up to
 * segments_max payloads and tensors and metadata_max metadata bytes in all, just at and just
 * above; lengths adding up to the item exactly, without wrapping; known devices; no pipe
 * fields. The frame: messages one per item on a WRITE only (empty items then allowed), a take
 * with several destinations only for a message read, a drop only of a take. */
START_TEST(test_validate_chan_msg)
{
	Tpw__V1__PayloadDesc pd[5], *pp[5];
	Tpw__V1__TensorDesc td = TPW__V1__TENSOR_DESC__INIT, *tp = &td;
	Tpw__V1__Device dev = TPW__V1__DEVICE__INIT;
	Tpw__V1__Descriptor d = TPW__V1__DESCRIPTOR__INIT, *dp = &d;
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__ChanOp o = TPW__V1__CHAN_OP__INIT;
	Tpw__V1__Segment g = TPW__V1__SEGMENT__INIT, *gp[2] = { &g, &g };
	uint8_t *meta = meta_bytes;
	uint64_t len0 = 0;

	for (int i = 0; i < 5; i++) {
		tpw__v1__payload_desc__init(&pd[i]);
		pd[i].length = 1;
		pp[i] = &pd[i];
	}
	d.payloads = pp;
	d.n_payloads = lim.segments_max; /* just at */
	ck_assert_int_eq(tpw_chan_msg_check(&d, lim.segments_max, &lim, why, sizeof(why)), 0);
	ck_assert_int_eq(tpw_chan_msg_check(&d, lim.segments_max + 1, &lim, why, sizeof(why)),
			 -EINVAL);
	d.n_payloads = lim.segments_max + 1; /* just above */
	ck_assert_int_eq(tpw_chan_msg_check(&d, lim.segments_max + 1, &lim, why, sizeof(why)),
			 -E2BIG);
	d.n_payloads = lim.segments_max;
	d.n_tensors = 1;
	d.tensors = &tp;
	ck_assert_int_eq(tpw_chan_msg_check(&d, lim.segments_max, &lim, why, sizeof(why)), -E2BIG);
	d.n_payloads = 1;
	td.length = 1;
	dev.type = TPW__V1__DEVICE_TYPE__DEVICE_CUDA;
	td.device = &dev;
	ck_assert_int_eq(tpw_chan_msg_check(&d, 2, &lim, why, sizeof(why)), 0);
	dev.type = 9;
	ck_assert_int_eq(tpw_chan_msg_check(&d, 2, &lim, why, sizeof(why)), -EINVAL);
	dev.type = TPW__V1__DEVICE_TYPE__DEVICE_CPU;
	pd[0].length = UINT64_MAX; /* wraps to 0 with the tensor's byte */
	ck_assert_int_eq(tpw_chan_msg_check(&d, 0, &lim, why, sizeof(why)), -EINVAL);
	pd[0].length = 1;
	d.metadata = (ProtobufCBinaryData){ lim.metadata_max - 1, meta };
	pd[0].metadata = (ProtobufCBinaryData){ 1, meta };
	ck_assert_int_eq(tpw_chan_msg_check(&d, 2, &lim, why, sizeof(why)), 0);
	td.metadata = (ProtobufCBinaryData){ 1, meta };
	ck_assert_int_eq(tpw_chan_msg_check(&d, 2, &lim, why, sizeof(why)), -EMSGSIZE);
	td.metadata = (ProtobufCBinaryData){ 0, NULL };
	d.eager = true;
	ck_assert_int_eq(tpw_chan_msg_check(&d, 2, &lim, why, sizeof(why)), -EINVAL);
	d.eager = false;
	/* The frame. */
	m.body_case = TPW__V1__CLIENT_MSG__BODY_CHAN_OP;
	m.chan_op = &o;
	o.op = TPW__V1__CHAN_OP_KIND__CHAN_OP_WRITE;
	o.n_lengths = 1;
	o.lengths = &len0;
	ck_assert_int_eq(vc(&m, 0, 0), -EBADMSG); /* an empty byte item */
	o.n_msgs = 1;
	o.msgs = &dp;
	ck_assert_int_eq(vc(&m, 0, 0), 0); /* an empty message item */
	o.op = TPW__V1__CHAN_OP_KIND__CHAN_OP_READ;
	o.n_lengths = 0;
	ck_assert_int_eq(vc(&m, 0, 0), -EBADMSG); /* messages on a read */
	o.n_msgs = 0;
	o.msg = true;
	ck_assert_int_eq(vc(&m, 0, 0), 0);
	g.length = 1;
	g.loc_case = TPW__V1__SEGMENT__LOC_CMA_ADDR;
	g.cma_addr = 4096;
	o.n_segments = 2;
	o.segments = gp;
	ck_assert_int_eq(vc(&m, 0, 0), -EBADMSG); /* slots without a take */
	o.take_held = true;
	ck_assert_int_eq(vc(&m, 0, 0), 0);
	o.msg_drop = true;
	ck_assert_int_eq(vc(&m, 0, 0), -EBADMSG); /* a drop with slots */
	o.n_segments = 0;
	ck_assert_int_eq(vc(&m, 0, 0), 0);
	o.take_held = false;
	ck_assert_int_eq(vc(&m, 0, 0), -EBADMSG); /* a drop without a take */
	o.op = TPW__V1__CHAN_OP_KIND__CHAN_OP_CLOSE;
	o.msg_drop = false;
	ck_assert_int_eq(vc(&m, 0, 0), -EBADMSG); /* read fields on a close */
}
END_TEST

/* A channel answer from the daemon: a batch's items add up to the tail, none empty, at most
 * segments_max; an item copied into the read's allocation has no tail, and so have a packed
 * read's items copied (up to segments_max, none empty); a held item has no length and no
 * tail. */
START_TEST(test_validate_chan_reply_batch)
{
	Tpw__V1__DaemonMsg m = TPW__V1__DAEMON_MSG__INIT;
	Tpw__V1__ChanReply r = TPW__V1__CHAN_REPLY__INIT;
	uint64_t lens[5] = { 3, 4, 1, 1, 1 };

	m.body_case = TPW__V1__DAEMON_MSG__BODY_CHAN_REPLY;
	m.chan_reply = &r;
	r.n_lengths = 2;
	r.lengths = lens;
	ck_assert_int_eq(vd(&m, 0, 7), 0);
	ck_assert_int_eq(vd(&m, 0, 8), -EBADMSG);
	r.n_lengths = lim.segments_max; /* just at */
	ck_assert_int_eq(vd(&m, 0, 9), 0);
	r.n_lengths = lim.segments_max + 1; /* just above */
	ck_assert_int_eq(vd(&m, 0, 10), -EBADMSG);
	lens[1] = 0; /* an empty item in a batch */
	r.n_lengths = 2;
	ck_assert_int_eq(vd(&m, 0, 3), -EBADMSG);
	r.n_lengths = 1;
	r.copied = true;
	ck_assert_int_eq(vd(&m, 0, 0), 0);
	ck_assert_int_eq(vd(&m, 0, 3), -EBADMSG); /* a tail with it */
	lens[1] = 4;
	r.n_lengths = 2; /* a packed read's items copied (ChanOp.pack_copied) */
	ck_assert_int_eq(vd(&m, 0, 0), 0);
	ck_assert_int_eq(vd(&m, 0, 7), -EBADMSG); /* a tail with them */
	r.n_lengths = lim.segments_max; /* just at */
	ck_assert_int_eq(vd(&m, 0, 0), 0);
	r.n_lengths = lim.segments_max + 1; /* just above */
	ck_assert_int_eq(vd(&m, 0, 0), -EBADMSG);
	lens[1] = 0; /* an empty one */
	r.n_lengths = 2;
	ck_assert_int_eq(vd(&m, 0, 0), -EBADMSG);
	lens[1] = 4;
	r.msg_taken = true; /* a message's take is one item */
	ck_assert_int_eq(vd(&m, 0, 0), -EBADMSG);
	r.msg_taken = false;
	r.n_lengths = 0; /* copied, but nothing */
	ck_assert_int_eq(vd(&m, 0, 0), -EBADMSG);
	r.held_len = 1; /* and held */
	r.n_lengths = 1;
	ck_assert_int_eq(vd(&m, 0, 0), -EBADMSG);
	r.copied = false;
	r.n_lengths = 0;
	r.held_len = 1 << 20;
	ck_assert_int_eq(vd(&m, 0, 0), 0);
	ck_assert_int_eq(vd(&m, 0, 1), -EBADMSG);
	r.n_lengths = 1;
	ck_assert_int_eq(vd(&m, 0, 0), -EBADMSG);
}
END_TEST

/* Lent items (issue 25 part private): ChanOp.lend only on a write by segment, never from a
 * peer; an answer carries at most TPW_CHAN_RELEASED_MAX released buffer ids (just at and just
 * above), and lent only on an answer without items. */
START_TEST(test_validate_chan_lend)
{
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__ChanOp o = TPW__V1__CHAN_OP__INIT;
	Tpw__V1__ShmRef ref = TPW__V1__SHM_REF__INIT;
	Tpw__V1__Segment g = TPW__V1__SEGMENT__INIT, *gp[1] = { &g };
	Tpw__V1__PeerChanOp po = TPW__V1__PEER_CHAN_OP__INIT;
	Tpw__V1__PeerMsg pm = TPW__V1__PEER_MSG__INIT;
	Tpw__V1__DaemonMsg dm = TPW__V1__DAEMON_MSG__INIT;
	Tpw__V1__ChanReply r = TPW__V1__CHAN_REPLY__INIT;
	static uint64_t ids[TPW_CHAN_RELEASED_MAX + 1];
	uint64_t len = 1 << 20;

	m.body_case = TPW__V1__CLIENT_MSG__BODY_CHAN_OP;
	m.chan_op = &o;
	o.op = TPW__V1__CHAN_OP_KIND__CHAN_OP_WRITE;
	o.n_lengths = 1;
	o.lengths = &len;
	o.n_segments = 1;
	o.segments = gp;
	g.length = len;
	g.loc_case = TPW__V1__SEGMENT__LOC_SHM;
	g.shm = &ref;
	o.lend = true;
	ck_assert_int_eq(vc(&m, 0, 0), 0);
	pm.body_case = TPW__V1__PEER_MSG__BODY_CHAN_OP;
	pm.chan_op = &po;
	po.op = &o;
	ck_assert_int_eq(vpt(&pm, 0), -EBADMSG); /* never from a peer */
	o.n_segments = 0; /* a write of inline items */
	o.segments = NULL;
	ck_assert_int_eq(vc(&m, 0, 1 << 20), -EBADMSG);
	o.n_lengths = 0;
	o.op = TPW__V1__CHAN_OP_KIND__CHAN_OP_READ;
	ck_assert_int_eq(vc(&m, 0, 0), -EBADMSG);
	o.op = TPW__V1__CHAN_OP_KIND__CHAN_OP_CLOSE;
	ck_assert_int_eq(vc(&m, 0, 0), -EBADMSG);
	o.lend = false;
	ck_assert_int_eq(vc(&m, 0, 0), 0);

	dm.body_case = TPW__V1__DAEMON_MSG__BODY_CHAN_REPLY;
	dm.chan_reply = &r;
	r.req_id = 5; /* a write's answer */
	r.released = ids;
	r.n_released = TPW_CHAN_RELEASED_MAX; /* just at */
	r.lent = true;
	ck_assert_int_eq(vd(&dm, 0, 0), 0);
	r.n_released = TPW_CHAN_RELEASED_MAX + 1; /* just above */
	ck_assert_int_eq(vd(&dm, 0, 0), -EBADMSG);
	r.n_released = 0;
	r.n_lengths = 1; /* lent with an item */
	r.lengths = &len;
	ck_assert_int_eq(vd(&dm, 0, 1 << 20), -EBADMSG);
	r.lent = false;
	ck_assert_int_eq(vd(&dm, 0, 1 << 20), 0);
}
END_TEST

/* Lent items read by mapping (issue 25 part map): a READ's mapping fields only on a read, never
 * from a peer, at most TPW_CHAN_MAPPED_MAX keys (just at and just above), an acknowledgement
 * alone (no destination, no take); an answer by mapping names one item inside its buffer (just
 * at its end and a byte past it), no tail, an fd only with a key; none from a peer. */
START_TEST(test_validate_chan_map)
{
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__ChanOp o = TPW__V1__CHAN_OP__INIT;
	Tpw__V1__ShmRef ref = TPW__V1__SHM_REF__INIT;
	Tpw__V1__Segment g = TPW__V1__SEGMENT__INIT, *gp[1] = { &g };
	Tpw__V1__PeerChanOp po = TPW__V1__PEER_CHAN_OP__INIT;
	Tpw__V1__PeerChanReply pr = TPW__V1__PEER_CHAN_REPLY__INIT;
	Tpw__V1__PeerMsg pm = TPW__V1__PEER_MSG__INIT;
	Tpw__V1__DaemonMsg dm = TPW__V1__DAEMON_MSG__INIT;
	Tpw__V1__ChanReply r = TPW__V1__CHAN_REPLY__INIT;
	uint64_t keys[TPW_CHAN_MAPPED_MAX + 1] = { 0 }, len = 1 << 20;

	m.body_case = TPW__V1__CLIENT_MSG__BODY_CHAN_OP;
	m.chan_op = &o;
	o.op = TPW__V1__CHAN_OP_KIND__CHAN_OP_READ;
	o.map_ok = true;
	o.mapped = keys;
	o.n_mapped = TPW_CHAN_MAPPED_MAX; /* just at */
	ck_assert_int_eq(vc(&m, 0, 0), 0);
	o.n_mapped = TPW_CHAN_MAPPED_MAX + 1; /* just above */
	ck_assert_int_eq(vc(&m, 0, 0), -EBADMSG);
	o.n_mapped = 1;
	g.length = len;
	g.loc_case = TPW__V1__SEGMENT__LOC_SHM;
	g.shm = &ref;
	o.n_segments = 1; /* with a destination for the copy it may take instead */
	o.segments = gp;
	ck_assert_int_eq(vc(&m, 0, 0), 0);
	pm.body_case = TPW__V1__PEER_MSG__BODY_CHAN_OP;
	pm.chan_op = &po;
	po.op = &o;
	o.n_segments = 0;
	ck_assert_int_eq(vpt(&pm, 0), -EBADMSG); /* never from a peer */
	o.map_ok = false;
	o.n_mapped = 0;
	ck_assert_int_eq(vpt(&pm, 0), 0);
	o.map_ok = true;
	o.n_mapped = 1;
	o.n_segments = 1;
	o.map_done = true; /* an acknowledgement is alone */
	ck_assert_int_eq(vc(&m, 0, 0), -EBADMSG);
	o.map_ok = false;
	o.n_mapped = 0;
	ck_assert_int_eq(vc(&m, 0, 0), -EBADMSG);
	o.n_segments = 0;
	o.segments = NULL;
	ck_assert_int_eq(vc(&m, 0, 0), 0);
	o.map_fail = true;
	ck_assert_int_eq(vc(&m, 0, 0), 0);
	o.map_done = false; /* a failure that acknowledges nothing */
	ck_assert_int_eq(vc(&m, 0, 0), -EBADMSG);
	o.map_fail = false;
	o.n_mapped = 1; /* keys without map_ok */
	ck_assert_int_eq(vc(&m, 0, 0), -EBADMSG);
	o.n_mapped = 0;
	o.map_ok = true;
	o.op = TPW__V1__CHAN_OP_KIND__CHAN_OP_CLOSE; /* on an op that is no read */
	ck_assert_int_eq(vc(&m, 0, 0), -EBADMSG);

	dm.body_case = TPW__V1__DAEMON_MSG__BODY_CHAN_REPLY;
	dm.chan_reply = &r;
	r.map_key = 3;
	r.map_size = 4 << 20;
	r.map_off = (4 << 20) - len; /* just at the end */
	r.n_lengths = 1;
	r.lengths = &len;
	r.map_fd = true;
	ck_assert_int_eq(vd(&dm, 0, 0), 0);
	ck_assert_int_eq(vd(&dm, 0, 1), -EBADMSG); /* a tail with it */
	r.map_off++; /* a byte past it */
	ck_assert_int_eq(vd(&dm, 0, 0), -EBADMSG);
	r.map_off = UINT64_MAX; /* wrapping */
	ck_assert_int_eq(vd(&dm, 0, 0), -EBADMSG);
	r.map_off = 0;
	r.map_key = 0; /* an fd without a key */
	ck_assert_int_eq(vd(&dm, 0, 0), -EBADMSG);
	r.map_key = 3;
	r.copied = true;
	ck_assert_int_eq(vd(&dm, 0, 0), -EBADMSG);
	r.copied = false;
	r.n_lengths = 0;
	ck_assert_int_eq(vd(&dm, 0, 0), -EBADMSG);
	r.n_lengths = 1;
	/* several items of one buffer (ChanOp.pack_mapped): one offset each, the first map_off */
	{
		uint64_t lens2[5] = { len, len, len, len, len }, offs[5] = { 0, len, 2 * len,
									  3 * len, 4 * len };

		r.lengths = lens2;
		r.map_offs = offs;
		r.n_lengths = 2;
		r.n_map_offs = 2;
		ck_assert_int_eq(vd(&dm, 0, 0), 0);
		r.n_map_offs = 1; /* an offset missing */
		ck_assert_int_eq(vd(&dm, 0, 0), -EBADMSG);
		r.n_map_offs = 2;
		offs[0] = len; /* the first not at map_off */
		ck_assert_int_eq(vd(&dm, 0, 0), -EBADMSG);
		offs[0] = 0;
		offs[1] = (4 << 20) - len + 1; /* the second a byte past the buffer */
		ck_assert_int_eq(vd(&dm, 0, 0), -EBADMSG);
		offs[1] = len;
		lens2[1] = 0; /* an empty one */
		ck_assert_int_eq(vd(&dm, 0, 0), -EBADMSG);
		lens2[1] = len;
		r.n_lengths = lim.segments_max; /* just at */
		r.n_map_offs = lim.segments_max;
		ck_assert_int_eq(vd(&dm, 0, 0), 0);
		r.n_lengths = lim.segments_max + 1; /* just above */
		r.n_map_offs = lim.segments_max + 1;
		ck_assert_int_eq(vd(&dm, 0, 0), -EBADMSG);
		r.n_lengths = 1; /* one item with offsets */
		ck_assert_int_eq(vd(&dm, 0, 0), -EBADMSG);
		r.map_key = 0; /* offsets without a key */
		r.map_fd = false;
		ck_assert_int_eq(vd(&dm, 0, 0), -EBADMSG);
		r.map_key = 3;
		r.map_fd = true;
		r.n_map_offs = 0;
		r.map_offs = NULL;
		r.lengths = &len;
	}
	pm.body_case = TPW__V1__PEER_MSG__BODY_CHAN_REPLY;
	pm.chan_reply = &pr;
	pr.reply = &r;
	r.map_fd = false;
	ck_assert_int_eq(vpt(&pm, 1 << 20), -EBADMSG); /* never from a peer */
	r.map_key = 0;
	r.map_size = 0;
	ck_assert_int_eq(vpt(&pm, 1 << 20), 0);
}
END_TEST

/* A notice of retired buffers (ChanReply.retired, client minor 12): keys only, at most
 * TPW_CHAN_RETIRED_MAX, answering no request, carrying nothing else; never from a peer. */
START_TEST(test_validate_chan_retired)
{
	Tpw__V1__DaemonMsg dm = TPW__V1__DAEMON_MSG__INIT;
	Tpw__V1__ChanReply r = TPW__V1__CHAN_REPLY__INIT;
	Tpw__V1__PeerChanReply pr = TPW__V1__PEER_CHAN_REPLY__INIT;
	Tpw__V1__PeerMsg pm = TPW__V1__PEER_MSG__INIT;
	uint64_t keys[TPW_CHAN_RETIRED_MAX + 1] = { 0 }, len = 1;

	for (unsigned i = 0; i <= TPW_CHAN_RETIRED_MAX; i++)
		keys[i] = UINT64_MAX - i; /* values are the library's to match, not bounds */
	dm.body_case = TPW__V1__DAEMON_MSG__BODY_CHAN_REPLY;
	dm.chan_reply = &r;
	r.chan_id = 7;
	r.retired = keys;
	r.n_retired = TPW_CHAN_RETIRED_MAX; /* just at */
	ck_assert_int_eq(vd(&dm, 0, 0), 0);
	r.n_retired = TPW_CHAN_RETIRED_MAX + 1; /* just above */
	ck_assert_int_eq(vd(&dm, 0, 0), -EBADMSG);
	r.n_retired = 1;
	ck_assert_int_eq(vd(&dm, 0, 1), -EBADMSG); /* a tail with it */
	r.req_id = 3; /* in an answer */
	ck_assert_int_eq(vd(&dm, 0, 0), -EBADMSG);
	r.req_id = 0;
	r.n_lengths = 1; /* with an item */
	r.lengths = &len;
	ck_assert_int_eq(vd(&dm, 0, 0), -EBADMSG);
	r.n_lengths = 0;
	r.map_key = 3; /* with an item to map */
	ck_assert_int_eq(vd(&dm, 0, 0), -EBADMSG);
	r.map_key = 0;
	r.n_released = 1; /* with a writer's buffers */
	r.released = keys;
	ck_assert_int_eq(vd(&dm, 0, 0), -EBADMSG);
	r.n_released = 0;
	ck_assert_int_eq(vd(&dm, 0, 0), 0);
	pm.body_case = TPW__V1__PEER_MSG__BODY_CHAN_REPLY;
	pm.chan_reply = &pr;
	pr.reply = &r;
	ck_assert_int_eq(vpt(&pm, 0), -EBADMSG); /* never from a peer */
	r.n_retired = 0;
	ck_assert_int_eq(vpt(&pm, 0), 0);
}
END_TEST

/* A notice of lent buffers given back (ChanReply.released with req_id 0, client minor 13):
 * ids only, at most TPW_CHAN_RELEASED_MAX, carrying nothing else (no item, no tail, no lent,
 * no mapping, no retired keys). */
START_TEST(test_validate_chan_released_notice)
{
	Tpw__V1__DaemonMsg dm = TPW__V1__DAEMON_MSG__INIT;
	Tpw__V1__ChanReply r = TPW__V1__CHAN_REPLY__INIT;
	static uint64_t ids[TPW_CHAN_RELEASED_MAX + 1];
	uint64_t len = 1;

	for (unsigned i = 0; i <= TPW_CHAN_RELEASED_MAX; i++)
		ids[i] = UINT64_MAX - i; /* values are the library's to match, not bounds */
	dm.body_case = TPW__V1__DAEMON_MSG__BODY_CHAN_REPLY;
	dm.chan_reply = &r;
	r.chan_id = 7;
	r.released = ids;
	r.n_released = TPW_CHAN_RELEASED_MAX; /* just at */
	ck_assert_int_eq(vd(&dm, 0, 0), 0);
	r.n_released = TPW_CHAN_RELEASED_MAX + 1; /* just above */
	ck_assert_int_eq(vd(&dm, 0, 0), -EBADMSG);
	r.n_released = 1;
	ck_assert_int_eq(vd(&dm, 0, 1), -EBADMSG); /* a tail with it */
	r.n_lengths = 1; /* with an item */
	r.lengths = &len;
	ck_assert_int_eq(vd(&dm, 0, 1), -EBADMSG);
	r.n_lengths = 0;
	r.lent = true; /* lent: a write's answer only */
	ck_assert_int_eq(vd(&dm, 0, 0), -EBADMSG);
	r.lent = false;
	r.map_key = 3; /* with an item to map */
	ck_assert_int_eq(vd(&dm, 0, 0), -EBADMSG);
	r.map_key = 0;
	r.held_len = 9; /* with an item held */
	ck_assert_int_eq(vd(&dm, 0, 0), -EBADMSG);
	r.held_len = 0;
	r.n_retired = 1; /* with retired keys */
	r.retired = ids;
	ck_assert_int_eq(vd(&dm, 0, 0), -EBADMSG);
	r.n_retired = 0;
	ck_assert_int_eq(vd(&dm, 0, 0), 0);
	r.req_id = 4; /* the same ids in a write's answer */
	r.lent = true;
	ck_assert_int_eq(vd(&dm, 0, 0), 0);
}
END_TEST

/* Work queue ops from a peer: plain names, payloads only on submit and reply, remote peers on a
 * creating open only; answers' payloads match the tail. Remote access options are checked as a listener's. */
START_TEST(test_validate_peer_wq_msgs)
{
	Tpw__V1__WqOp o = TPW__V1__WQ_OP__INIT;
	Tpw__V1__PeerWqOp po = TPW__V1__PEER_WQ_OP__INIT;
	Tpw__V1__WqReply r = TPW__V1__WQ_REPLY__INIT;
	Tpw__V1__PeerWqReply pr = TPW__V1__PEER_WQ_REPLY__INIT;
	Tpw__V1__PeerMsg m = TPW__V1__PEER_MSG__INIT;
	Tpw__V1__ClientMsg cm = TPW__V1__CLIENT_MSG__INIT;
	char *peers[TPW_REMOTE_PEERS_MAX + 1];

	for (size_t i = 0; i <= TPW_REMOTE_PEERS_MAX; i++)
		peers[i] = "psk";
	cm.body_case = TPW__V1__CLIENT_MSG__BODY_WQ_OP;
	cm.wq_op = &o;
	o.op = TPW__V1__WQ_OP_KIND__WQ_OP_OPEN;
	o.name = "jobs";
	o.remote = TPW__V1__REMOTE_ACCESS__REMOTE_PEERS;
	o.remote_peers = peers;
	o.n_remote_peers = TPW_REMOTE_PEERS_MAX;
	ck_assert_int_eq(vc(&cm, 0, 0), 0);
	o.n_remote_peers = TPW_REMOTE_PEERS_MAX + 1;
	ck_assert_int_eq(vc(&cm, 0, 0), -EBADMSG);
	o.n_remote_peers = 0;
	ck_assert_int_eq(vc(&cm, 0, 0), -EBADMSG); /* PEERS without peers */
	o.remote = TPW__V1__REMOTE_ACCESS__REMOTE_PEERS + 1;
	ck_assert_int_eq(vc(&cm, 0, 0), -EBADMSG);
	o.remote = TPW__V1__REMOTE_ACCESS__REMOTE_ANY_PEER;
	m.body_case = TPW__V1__PEER_MSG__BODY_WQ_OP;
	m.wq_op = &po;
	po.op = &o;
	ck_assert_int_eq(vpt(&m, 0), 0);
	/* remote peers cross with a creation only (peer minor 7) */
	o.remote = TPW__V1__REMOTE_ACCESS__REMOTE_PEERS;
	o.n_remote_peers = 1;
	ck_assert_int_eq(vpt(&m, 0), -EBADMSG);
	o.create = true;
	ck_assert_int_eq(vpt(&m, 0), 0);
	o.op = TPW__V1__WQ_OP_KIND__WQ_OP_TAKE;
	ck_assert_int_eq(vpt(&m, 0), -EBADMSG);
	o.op = TPW__V1__WQ_OP_KIND__WQ_OP_OPEN;
	o.create = false;
	o.remote = TPW__V1__REMOTE_ACCESS__REMOTE_ANY_PEER;
	o.n_remote_peers = 0;
	o.name = "tpip://hostb/jobs";
	ck_assert_int_eq(vpt(&m, 0), -EBADMSG);
	o.op = TPW__V1__WQ_OP_KIND__WQ_OP_REPLY;
	ck_assert_int_eq(vpt(&m, 4), 0);
	ck_assert_int_eq(vpt(&m, 0), -EBADMSG); /* an empty payload */
	o.op = TPW__V1__WQ_OP_KIND__WQ_OP_TAKE;
	ck_assert_int_eq(vpt(&m, 4), -EBADMSG);
	m.body_case = TPW__V1__PEER_MSG__BODY_WQ_REPLY;
	m.wq_reply = &pr;
	ck_assert_int_eq(vpt(&m, 0), -EBADMSG);
	pr.reply = &r;
	r.length = 4;
	ck_assert_int_eq(vpt(&m, 4), 0);
	ck_assert_int_eq(vpt(&m, 3), -EBADMSG);
}
END_TEST

/* Work queue messages by reference across hosts (peer minor 11): a streamed submit or reply is a
 * message's, with no tail and at most an item's bytes, never from a client; a read's transfer
 * comes with its room on a message read only; a peer's answer admitting a transfer carries
 * nothing else, one copied says its bytes, and a client is never sent either. */
START_TEST(test_validate_peer_wq_stream)
{
	Tpw__V1__WqOp o = TPW__V1__WQ_OP__INIT;
	Tpw__V1__PeerWqOp po = TPW__V1__PEER_WQ_OP__INIT;
	Tpw__V1__WqReply r = TPW__V1__WQ_REPLY__INIT;
	Tpw__V1__PeerWqReply pr = TPW__V1__PEER_WQ_REPLY__INIT;
	Tpw__V1__PeerMsg m = TPW__V1__PEER_MSG__INIT;
	Tpw__V1__ClientMsg cm = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__DaemonMsg dm = TPW__V1__DAEMON_MSG__INIT;
	Tpw__V1__Descriptor d = TPW__V1__DESCRIPTOR__INIT;

	m.body_case = TPW__V1__PEER_MSG__BODY_WQ_OP;
	m.wq_op = &po;
	po.op = &o;
	o.op = TPW__V1__WQ_OP_KIND__WQ_OP_REPLY;
	o.question_id = 3;
	o.msg_desc = &d;
	o.stream_len = 16u << 20;
	ck_assert_int_eq(vpt(&m, 0), 0);
	ck_assert_int_eq(vpt(&m, 4), -EBADMSG); /* bytes inline too */
	o.stream_len = (1ull << 40) + 1;
	ck_assert_int_eq(vpt(&m, 0), -EBADMSG); /* above an item's limit */
	o.stream_len = 16u << 20;
	o.msg_desc = NULL;
	ck_assert_int_eq(vpt(&m, 0), -EBADMSG); /* no message's */
	o.msg_desc = &d;
	o.op = TPW__V1__WQ_OP_KIND__WQ_OP_SUBMIT;
	ck_assert_int_eq(vpt(&m, 0), 0);
	cm.body_case = TPW__V1__CLIENT_MSG__BODY_WQ_OP;
	cm.wq_op = &o;
	ck_assert_int_eq(vc(&cm, 0, 0), -EBADMSG); /* never from a client */
	o.stream_len = 0;
	o.msg_desc = NULL;
	o.op = TPW__V1__WQ_OP_KIND__WQ_OP_TAKE;
	o.msg_read = true;
	o.xfer_id = 9;
	o.room = 100;
	ck_assert_int_eq(vpt(&m, 0), 0);
	ck_assert_int_eq(vc(&cm, 0, 0), -EBADMSG);
	o.room = 0;
	ck_assert_int_eq(vpt(&m, 0), -EBADMSG); /* a transfer without room */
	o.room = 100;
	o.msg_read = false;
	o.msg = true;
	ck_assert_int_eq(vpt(&m, 0), -EBADMSG); /* no read */
	m.body_case = TPW__V1__PEER_MSG__BODY_WQ_REPLY;
	m.wq_reply = &pr;
	pr.reply = &r;
	r.xfer_id = 7;
	ck_assert_int_eq(vpt(&m, 0), -EBADMSG); /* an admission is a success */
	r.status = TPW__V1__STATUS__STATUS_OK;
	ck_assert_int_eq(vpt(&m, 0), 0);
	ck_assert_int_eq(vpt(&m, 4), -EBADMSG);
	r.msg_copied = true;
	ck_assert_int_eq(vpt(&m, 0), -EBADMSG); /* an admission and a copy at once */
	r.xfer_id = 0;
	ck_assert_int_eq(vpt(&m, 0), -EBADMSG); /* copied: its bytes say how many */
	r.msg_len = 1000;
	ck_assert_int_eq(vpt(&m, 0), 0);
	r.remote_refs = true;
	ck_assert_int_eq(vpt(&m, 0), -EBADMSG); /* the forwarding daemon's word, not a peer's */
	r.remote_refs = false;
	dm.body_case = TPW__V1__DAEMON_MSG__BODY_WQ_REPLY;
	dm.wq_reply = &r;
	ck_assert_int_eq(vd(&dm, 0, 0), -EBADMSG); /* a client gets no length with its copy */
	r.msg_len = 0;
	ck_assert_int_eq(vd(&dm, 0, 0), 0);
	r.xfer_id = 7;
	r.msg_copied = false;
	ck_assert_int_eq(vd(&dm, 0, 0), -EBADMSG);
}
END_TEST

static Suite *validate_suite(void)
{
	Suite *s = suite_create("validate");
	TCase *w = tcase_create("write");
	TCase *r = tcase_create("read");
	TCase *o = tcase_create("other");
	TCase *d = tcase_create("daemon");

	tcase_add_test(w, test_validate_accepts_plain_write);
	tcase_add_test(w, test_validate_limits_segment_count);
	tcase_add_test(w, test_validate_limits_metadata_sum);
	tcase_add_test(w, test_validate_limits_message_bytes);
	tcase_add_test(w, test_validate_message_bytes_sum_does_not_wrap);
	tcase_add_test(w, test_validate_limits_inline_tail);
	tcase_add_test(w, test_validate_inline_range_edges);
	tcase_add_test(w, test_validate_inline_range_does_not_wrap);
	tcase_add_test(w, test_validate_cma_range_does_not_wrap);
	tcase_add_test(w, test_validate_ring_addr_range_does_not_wrap);
	tcase_add_test(w, test_validate_ring_offer);
	tcase_add_test(w, test_validate_segment_without_location);
	tcase_add_test(w, test_validate_rejects_empty_shm_reference);
	tcase_add_test(w, test_validate_checks_tensor_devices);
	tcase_add_test(w, test_validate_cuda_reference);
	tcase_add_test(w, test_validate_cuda_uuid_is_empty_or_16_bytes);
	tcase_add_test(w, test_validate_cuda_memory_matches_device);
	tcase_add_test(o, test_validate_cuda_release);
	tcase_add_test(o, test_validate_cuda_dmabuf);
	suite_add_tcase(s, w);

	tcase_add_test(r, test_validate_read_rejects_inline_destination);
	tcase_add_test(r, test_validate_read_ack_and_discard_take_no_segments);
	tcase_add_test(r, test_validate_read_limits);
	suite_add_tcase(s, r);

	tcase_add_test(o, test_validate_fd_count_per_message_type);
	tcase_add_test(o, test_validate_buffer_register_needs_size);
	tcase_add_test(o, test_validate_data_tail_only_on_write);
	tcase_add_test(o, test_validate_rejects_message_without_body);
	tcase_add_test(o, test_validate_hello_roles_and_name);
	tcase_add_test(o, test_validate_listen_name_and_access);
	tcase_add_test(o, test_validate_listen_remote_access_and_peer_count);
	tcase_add_test(o, test_validate_connect_pipe_id_range);
	tcase_add_test(o, test_validate_connect_expected_peers);
	tcase_add_test(o, test_validate_connect_address_length);
	tcase_add_test(o, test_validate_ctl_what_range);
	tcase_add_test(o, test_validate_cancel_kind_and_ids);
	tcase_add_test(o, test_validate_name_rules);
	tcase_add_test(o, test_validate_tpip_address);
	suite_add_tcase(s, o);

	tcase_add_test(d, test_validate_eager_descriptor_tail_matches);
	tcase_add_test(d, test_validate_descriptor_limits);
	tcase_add_test(d, test_validate_daemon_frames_carry_no_fds_or_stray_tail);
	tcase_add_test(d, test_validate_flow_credit_bounded);
	tcase_add_test(d, test_validate_peer_rdma_setup);
	tcase_add_test(d, test_validate_peer_rdma_rails);
	tcase_add_test(d, test_validate_peer_read_req_offer_bounded);
	tcase_add_test(d, test_validate_peer_connect_wait_bounded);
	tcase_add_test(d, test_validate_peer_hello_frame_max_bounded);
	tcase_add_test(d, test_validate_group_hosts);
	tcase_add_test(d, test_validate_peer_group_joined_adds_up);
	tcase_add_test(d, test_validate_group_remote_access_and_peer_count);
	tcase_add_test(d, test_validate_peer_chan_op);
	tcase_add_test(d, test_validate_peer_chan_streamed);
	tcase_add_test(d, test_validate_chan_segments);
	tcase_add_test(d, test_validate_chan_read_fields);
	tcase_add_test(d, test_validate_chan_read_packed);
	tcase_add_test(d, test_validate_chan_msg);
	tcase_add_test(d, test_validate_chan_reply_batch);
	tcase_add_test(d, test_validate_chan_lend);
	tcase_add_test(d, test_validate_chan_map);
	tcase_add_test(d, test_validate_chan_retired);
	tcase_add_test(d, test_validate_chan_released_notice);
	tcase_add_test(d, test_validate_peer_chan_reply);
	tcase_add_test(d, test_validate_peer_wq_msgs);
	tcase_add_test(d, test_validate_peer_wq_stream);
	suite_add_tcase(s, d);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(validate_suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
