/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Unit tests of the frame codec (proto/frame.c): header parse and pack, every header check at
 * and just past its limit, pack/unpack round trips of client and daemon messages, rejection of
 * truncated and garbage protobuf bytes, and the unpack allocation budget. Message validation is
 * tested in test_validate.c.
 */
#include <check.h>
#include <errno.h>
#include <malloc.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include "frame.h"

static const uint8_t pattern[] = { 0xde, 0xad, 0xbe, 0xef, 0x00, 0x01, 0x02 };

static void hdr_bytes(uint8_t *buf, uint32_t magic, uint16_t version, uint16_t nfds,
		      uint32_t msg_len, uint32_t data_len)
{
	struct tpw_hdr h = { magic, version, nfds, msg_len, data_len, 7 };

	tpw_hdr_pack(&h, buf);
}

START_TEST(test_frame_header_round_trips)
{
	struct tpw_hdr h = {
		.magic = TPW_MAGIC, .version = TPW_WIRE_VERSION, .nfds = 3,
		.msg_len = 0x01020304, .data_len = 0x0a0b0c0d, .seq = 0x1122334455667788ull,
	};
	struct tpw_hdr got;
	uint8_t buf[TPW_HDR_SIZE];

	tpw_hdr_pack(&h, buf);
	ck_assert_int_eq(tpw_hdr_parse(buf, UINT32_MAX, &got), 0);
	ck_assert_uint_eq(got.magic, h.magic);
	ck_assert_uint_eq(got.version, h.version);
	ck_assert_uint_eq(got.nfds, h.nfds);
	ck_assert_uint_eq(got.msg_len, h.msg_len);
	ck_assert_uint_eq(got.data_len, h.data_len);
	ck_assert_uint_eq(got.seq, h.seq);
}
END_TEST

START_TEST(test_frame_header_is_little_endian)
{
	uint8_t buf[TPW_HDR_SIZE];
	static const uint8_t want[TPW_HDR_SIZE] = {
		'T', 'P', 'W', '1', 0x01, 0x00, 0x02, 0x00, 0x04, 0x03, 0x02, 0x01,
		0x08, 0x07, 0x06, 0x05, 0x10, 0x0f, 0x0e, 0x0d, 0x0c, 0x0b, 0x0a, 0x09,
	};
	struct tpw_hdr h = { TPW_MAGIC, 1, 2, 0x01020304, 0x05060708, 0x090a0b0c0d0e0f10ull };

	tpw_hdr_pack(&h, buf);
	ck_assert_mem_eq(buf, want, TPW_HDR_SIZE);
}
END_TEST

START_TEST(test_frame_rejects_bad_magic)
{
	uint8_t buf[TPW_HDR_SIZE];
	struct tpw_hdr got = { .seq = 42 };

	hdr_bytes(buf, TPW_MAGIC ^ 1, TPW_WIRE_VERSION, 0, 10, 0);
	ck_assert_int_eq(tpw_hdr_parse(buf, 1024, &got), -EBADMSG);
	hdr_bytes(buf, 0, TPW_WIRE_VERSION, 0, 10, 0);
	ck_assert_int_eq(tpw_hdr_parse(buf, 1024, &got), -EBADMSG);
	ck_assert_uint_eq(got.seq, 42); /* written only on success */
}
END_TEST

START_TEST(test_frame_rejects_other_wire_version)
{
	static const uint16_t bad[] = { 0, TPW_WIRE_VERSION + 1, 0xffff };
	uint8_t buf[TPW_HDR_SIZE];
	struct tpw_hdr got;

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		hdr_bytes(buf, TPW_MAGIC, bad[i], 0, 10, 0);
		ck_assert_int_eq(tpw_hdr_parse(buf, 1024, &got), -EPROTONOSUPPORT);
	}
}
END_TEST

START_TEST(test_frame_rejects_empty_message)
{
	uint8_t buf[TPW_HDR_SIZE];
	struct tpw_hdr got;

	hdr_bytes(buf, TPW_MAGIC, TPW_WIRE_VERSION, 0, 0, 0);
	ck_assert_int_eq(tpw_hdr_parse(buf, 1024, &got), -EBADMSG);
	hdr_bytes(buf, TPW_MAGIC, TPW_WIRE_VERSION, 0, 0, 10);
	ck_assert_int_eq(tpw_hdr_parse(buf, 1024, &got), -EBADMSG);
	hdr_bytes(buf, TPW_MAGIC, TPW_WIRE_VERSION, 0, 1, 0);
	ck_assert_int_eq(tpw_hdr_parse(buf, 1024, &got), 0);
}
END_TEST

START_TEST(test_frame_rejects_too_many_fds)
{
	uint8_t buf[TPW_HDR_SIZE];
	struct tpw_hdr got;

	hdr_bytes(buf, TPW_MAGIC, TPW_WIRE_VERSION, TPW_FDS_MAX, 10, 0);
	ck_assert_int_eq(tpw_hdr_parse(buf, 1024, &got), 0);
	ck_assert_uint_eq(got.nfds, TPW_FDS_MAX);
	hdr_bytes(buf, TPW_MAGIC, TPW_WIRE_VERSION, TPW_FDS_MAX + 1, 10, 0);
	ck_assert_int_eq(tpw_hdr_parse(buf, 1024, &got), -EBADMSG);
	hdr_bytes(buf, TPW_MAGIC, TPW_WIRE_VERSION, 0xffff, 10, 0);
	ck_assert_int_eq(tpw_hdr_parse(buf, 1024, &got), -EBADMSG);
}
END_TEST

START_TEST(test_frame_rejects_oversize)
{
	const uint32_t max = 4096;
	uint8_t buf[TPW_HDR_SIZE];
	struct tpw_hdr got;

	hdr_bytes(buf, TPW_MAGIC, TPW_WIRE_VERSION, 0, 100, max - 100);
	ck_assert_int_eq(tpw_hdr_parse(buf, max, &got), 0);
	hdr_bytes(buf, TPW_MAGIC, TPW_WIRE_VERSION, 0, 100, max - 99);
	ck_assert_int_eq(tpw_hdr_parse(buf, max, &got), -EMSGSIZE);
	hdr_bytes(buf, TPW_MAGIC, TPW_WIRE_VERSION, 0, max, 0);
	ck_assert_int_eq(tpw_hdr_parse(buf, max, &got), 0);
	hdr_bytes(buf, TPW_MAGIC, TPW_WIRE_VERSION, 0, max + 1, 0);
	ck_assert_int_eq(tpw_hdr_parse(buf, max, &got), -EMSGSIZE);
}
END_TEST

START_TEST(test_frame_size_sum_does_not_wrap)
{
	uint8_t buf[TPW_HDR_SIZE];
	struct tpw_hdr got;

	/* 0xffffffff + 2 wraps to 1 in 32 bits; it must still count as too big. */
	hdr_bytes(buf, TPW_MAGIC, TPW_WIRE_VERSION, 0, UINT32_MAX, 2);
	ck_assert_int_eq(tpw_hdr_parse(buf, UINT32_MAX, &got), -EMSGSIZE);
	hdr_bytes(buf, TPW_MAGIC, TPW_WIRE_VERSION, 0, 1, UINT32_MAX);
	ck_assert_int_eq(tpw_hdr_parse(buf, UINT32_MAX, &got), -EMSGSIZE);
	hdr_bytes(buf, TPW_MAGIC, TPW_WIRE_VERSION, 0, TPW_FRAME_MAX_HARD, 0);
	ck_assert_int_eq(tpw_hdr_parse(buf, TPW_FRAME_MAX_HARD, &got), 0);
}
END_TEST

/* A Write with metadata, two payloads (inline and shm) and one tensor (cma, CUDA target). */
static size_t pack_write(uint8_t *buf, size_t cap)
{
	Tpw__V1__ShmRef shm = TPW__V1__SHM_REF__INIT;
	Tpw__V1__Segment s0 = TPW__V1__SEGMENT__INIT, s1 = TPW__V1__SEGMENT__INIT;
	Tpw__V1__Segment s2 = TPW__V1__SEGMENT__INIT;
	Tpw__V1__Payload p0 = TPW__V1__PAYLOAD__INIT, p1 = TPW__V1__PAYLOAD__INIT;
	Tpw__V1__Tensor t0 = TPW__V1__TENSOR__INIT;
	Tpw__V1__Device dev = TPW__V1__DEVICE__INIT, tgt = TPW__V1__DEVICE__INIT;
	Tpw__V1__Payload *ps[] = { &p0, &p1 };
	Tpw__V1__Tensor *ts[] = { &t0 };
	Tpw__V1__Write w = TPW__V1__WRITE__INIT;
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	size_t n;

	s0.length = 7;
	s0.loc_case = TPW__V1__SEGMENT__LOC_INLINE_OFF;
	s0.inline_off = 3;
	shm.buf_id = 5;
	shm.gen = 6;
	shm.offset = 4096;
	s1.length = 1ull << 40;
	s1.loc_case = TPW__V1__SEGMENT__LOC_SHM;
	s1.shm = &shm;
	s2.length = 12345;
	s2.loc_case = TPW__V1__SEGMENT__LOC_CMA_ADDR;
	s2.cma_addr = 0x7fff00001000ull;
	p0.data = &s0;
	p0.metadata = (ProtobufCBinaryData){ sizeof(pattern), (uint8_t *)pattern };
	p1.data = &s1;
	dev.type = TPW__V1__DEVICE_TYPE__DEVICE_CPU;
	tgt.type = TPW__V1__DEVICE_TYPE__DEVICE_CUDA;
	tgt.index = 3;
	t0.data = &s2;
	t0.device = &dev;
	t0.target = &tgt;
	w.pipe_id = 9;
	w.write_id = UINT64_MAX;
	w.metadata = (ProtobufCBinaryData){ 3, (uint8_t *)"abc" };
	w.n_payloads = 2;
	w.payloads = ps;
	w.n_tensors = 1;
	w.tensors = ts;
	m.body_case = TPW__V1__CLIENT_MSG__BODY_WRITE;
	m.write = &w;
	ck_assert_uint_le(tpw_frame_size(&m.base), cap);
	n = tpw_frame_pack(&m.base, 10, 0, 77, buf);
	ck_assert_uint_eq(n, tpw_frame_size(&m.base));
	return n;
}

static void check_unpacked_write(const Tpw__V1__ClientMsg *m)
{
	const Tpw__V1__Write *w;

	ck_assert_int_eq(m->body_case, TPW__V1__CLIENT_MSG__BODY_WRITE);
	w = m->write;
	ck_assert_uint_eq(w->pipe_id, 9);
	ck_assert_uint_eq(w->write_id, UINT64_MAX);
	ck_assert_uint_eq(w->metadata.len, 3);
	ck_assert_mem_eq(w->metadata.data, "abc", 3);
	ck_assert_uint_eq(w->n_payloads, 2);
	ck_assert_uint_eq(w->payloads[0]->data->loc_case, TPW__V1__SEGMENT__LOC_INLINE_OFF);
	ck_assert_uint_eq(w->payloads[0]->data->inline_off, 3);
	ck_assert_uint_eq(w->payloads[0]->data->length, 7);
	ck_assert_uint_eq(w->payloads[0]->metadata.len, sizeof(pattern));
	ck_assert_mem_eq(w->payloads[0]->metadata.data, pattern, sizeof(pattern));
	ck_assert_uint_eq(w->payloads[1]->data->loc_case, TPW__V1__SEGMENT__LOC_SHM);
	ck_assert_uint_eq(w->payloads[1]->data->shm->buf_id, 5);
	ck_assert_uint_eq(w->payloads[1]->data->shm->gen, 6);
	ck_assert_uint_eq(w->payloads[1]->data->shm->offset, 4096);
	ck_assert_uint_eq(w->payloads[1]->data->length, 1ull << 40);
	ck_assert_uint_eq(w->n_tensors, 1);
	ck_assert_uint_eq(w->tensors[0]->data->loc_case, TPW__V1__SEGMENT__LOC_CMA_ADDR);
	ck_assert_uint_eq(w->tensors[0]->data->cma_addr, 0x7fff00001000ull);
	ck_assert_uint_eq(w->tensors[0]->data->length, 12345);
	ck_assert_int_eq(w->tensors[0]->device->type, TPW__V1__DEVICE_TYPE__DEVICE_CPU);
	ck_assert_int_eq(w->tensors[0]->target->type, TPW__V1__DEVICE_TYPE__DEVICE_CUDA);
	ck_assert_uint_eq(w->tensors[0]->target->index, 3);
}

START_TEST(test_frame_client_msg_round_trips)
{
	uint8_t buf[512];
	struct tpw_hdr h;
	Tpw__V1__ClientMsg *m = NULL;
	size_t n = pack_write(buf, sizeof(buf));

	ck_assert_int_eq(tpw_hdr_parse(buf, 1u << 20, &h), 0);
	ck_assert_uint_eq(h.msg_len, n - TPW_HDR_SIZE);
	ck_assert_uint_eq(h.data_len, 10);
	ck_assert_uint_eq(h.nfds, 0);
	ck_assert_uint_eq(h.seq, 77);
	ck_assert_int_eq(tpw_client_msg_unpack(buf + TPW_HDR_SIZE, h.msg_len, &m), 0);
	check_unpacked_write(m);
	tpw_client_msg_free(m);
}
END_TEST

START_TEST(test_frame_daemon_msg_round_trips)
{
	Tpw__V1__PayloadDesc pd = TPW__V1__PAYLOAD_DESC__INIT;
	Tpw__V1__TensorDesc td = TPW__V1__TENSOR_DESC__INIT;
	Tpw__V1__PayloadDesc *pds[] = { &pd };
	Tpw__V1__TensorDesc *tds[] = { &td };
	Tpw__V1__Descriptor d = TPW__V1__DESCRIPTOR__INIT;
	Tpw__V1__DaemonMsg m = TPW__V1__DAEMON_MSG__INIT, *got = NULL;
	uint8_t buf[256];
	struct tpw_hdr h;
	size_t n;

	pd.length = 5;
	pd.metadata = (ProtobufCBinaryData){ 2, (uint8_t *)"pm" };
	td.length = 6;
	d.pipe_id = 1ull << 63;
	d.msg_id = 1000;
	d.eager = true;
	d.n_payloads = 1;
	d.payloads = pds;
	d.n_tensors = 1;
	d.tensors = tds;
	m.body_case = TPW__V1__DAEMON_MSG__BODY_DESCRIPTOR;
	m.descriptor = &d;
	n = tpw_frame_pack(&m.base, 11, 0, 1, buf);
	ck_assert_int_eq(tpw_hdr_parse(buf, 1 << 20, &h), 0);
	ck_assert_uint_eq(h.msg_len + TPW_HDR_SIZE, n);
	ck_assert_int_eq(tpw_daemon_msg_unpack(buf + TPW_HDR_SIZE, h.msg_len, &got), 0);
	ck_assert_int_eq(got->body_case, TPW__V1__DAEMON_MSG__BODY_DESCRIPTOR);
	ck_assert_uint_eq(got->descriptor->pipe_id, 1ull << 63);
	ck_assert_uint_eq(got->descriptor->msg_id, 1000);
	ck_assert(got->descriptor->eager);
	ck_assert_uint_eq(got->descriptor->n_payloads, 1);
	ck_assert_uint_eq(got->descriptor->payloads[0]->length, 5);
	ck_assert_mem_eq(got->descriptor->payloads[0]->metadata.data, "pm", 2);
	ck_assert_uint_eq(got->descriptor->n_tensors, 1);
	ck_assert_uint_eq(got->descriptor->tensors[0]->length, 6);
	tpw_daemon_msg_free(got);
}
END_TEST

START_TEST(test_frame_hello_reply_round_trips)
{
	Tpw__V1__Limits lim = TPW__V1__LIMITS__INIT;
	Tpw__V1__HelloReply r = TPW__V1__HELLO_REPLY__INIT;
	Tpw__V1__DaemonMsg m = TPW__V1__DAEMON_MSG__INIT, *got = NULL;
	uint8_t buf[256];

	lim.frame_max = 1 << 22;
	lim.message_bytes_max = 16ull << 30;
	r.status = TPW__V1__STATUS__STATUS_OK;
	r.session_id = 12;
	r.cma_ok = true;
	r.limits = &lim;
	r.daemon_version = "0.1.0";
	m.body_case = TPW__V1__DAEMON_MSG__BODY_HELLO_REPLY;
	m.hello_reply = &r;
	ck_assert_uint_le(tpw_frame_size(&m.base), sizeof(buf));
	tpw_frame_pack(&m.base, 0, 0, 1, buf);
	ck_assert_int_eq(tpw_daemon_msg_unpack(buf + TPW_HDR_SIZE,
					       tpw_frame_size(&m.base) - TPW_HDR_SIZE, &got), 0);
	ck_assert_int_eq(got->body_case, TPW__V1__DAEMON_MSG__BODY_HELLO_REPLY);
	ck_assert_uint_eq(got->hello_reply->session_id, 12);
	ck_assert(got->hello_reply->cma_ok);
	ck_assert_uint_eq(got->hello_reply->limits->frame_max, 1 << 22);
	ck_assert_uint_eq(got->hello_reply->limits->message_bytes_max, 16ull << 30);
	ck_assert_str_eq(got->hello_reply->daemon_version, "0.1.0");
	tpw_daemon_msg_free(got);
}
END_TEST

START_TEST(test_frame_rejects_truncated_message)
{
	uint8_t buf[512];
	size_t n = pack_write(buf, sizeof(buf)) - TPW_HDR_SIZE;
	Tpw__V1__ClientMsg *m = NULL;

	/* The Write is one length-delimited field: every strict prefix is malformed. */
	for (size_t len = 1; len < n; len++) {
		int r = tpw_client_msg_unpack(buf + TPW_HDR_SIZE, len, &m);
		ck_assert_msg(r == -EBADMSG, "prefix of %zu/%zu bytes: %d", len, n, r);
	}
}
END_TEST

START_TEST(test_frame_rejects_garbage_protobuf)
{
	static const struct {
		uint8_t b[8];
		size_t n;
	} garbage[] = {
		{ { 0xff }, 1 },		    /* wire type 7 */
		{ { 0x3a, 0x80 }, 2 },		    /* field 7, length varint cut */
		{ { 0x3a, 0x05, 0x01 }, 3 },	    /* field 7, 5 bytes announced, 1 present */
		{ { 0x3a, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff }, 8 }, /* endless varint */
		{ { 0x0a, 0x02, 0x08 }, 3 },	    /* hello, inner varint missing */
		{ { 0x08, 0x80, 0x80 }, 3 },	    /* field 1 as varint, cut */
	};
	Tpw__V1__ClientMsg *m = NULL;
	Tpw__V1__DaemonMsg *d = NULL;

	for (size_t i = 0; i < sizeof(garbage) / sizeof(garbage[0]); i++) {
		ck_assert_msg(tpw_client_msg_unpack(garbage[i].b, garbage[i].n, &m) == -EBADMSG,
			      "client garbage %zu accepted", i);
		ck_assert_msg(tpw_daemon_msg_unpack(garbage[i].b, garbage[i].n, &d) == -EBADMSG,
			      "daemon garbage %zu accepted", i);
	}
	ck_assert_ptr_null(m);
	ck_assert_ptr_null(d);
}
END_TEST

/* Builds a Write whose tensors field repeats @count empty Tensor submessages (2 bytes each). */
static uint8_t *many_empty_tensors(size_t count, size_t *ret_len)
{
	size_t body = count * 2, len;
	uint8_t *buf = malloc(body + 16);
	size_t i = 0, v;

	ck_assert_ptr_nonnull(buf);
	buf[i++] = 0x3a; /* ClientMsg.write, length-delimited */
	for (v = body; v >= 0x80; v >>= 7)
		buf[i++] = (uint8_t)(v | 0x80);
	buf[i++] = (uint8_t)v;
	for (size_t k = 0; k < count; k++) {
		buf[i++] = 0x2a; /* Write.tensors (field 5) */
		buf[i++] = 0x00;
	}
	len = i;
	*ret_len = len;
	return buf;
}

START_TEST(test_frame_unpack_allocation_stays_bounded)
{
	static const size_t counts[] = { 1, 100, 2000, 100000, 1000000 };

	for (size_t k = 0; k < sizeof(counts) / sizeof(counts[0]); k++) {
		size_t len;
		uint8_t *buf = many_empty_tensors(counts[k], &len);
		Tpw__V1__ClientMsg *m = NULL;
		struct mallinfo2 before = mallinfo2(), after;
		int r = tpw_client_msg_unpack(buf, len, &m);

		after = mallinfo2();
		if (r == 0) {
			size_t used = after.uordblks - before.uordblks;
			ck_assert_uint_eq(m->write->n_tensors, counts[k]);
			/* budget: 32 bytes per input byte + 4 KiB, plus malloc headers */
			ck_assert_msg(used <= len * 48 + 8192, "%zu tensors (%zu bytes) kept %zu",
				      counts[k], len, used);
			tpw_client_msg_free(m);
		} else {
			ck_assert_int_eq(r, -EBADMSG);
		}
		free(buf);
	}
}
END_TEST

START_TEST(test_frame_unpack_refuses_amplifying_frame)
{
	size_t len;
	uint8_t *buf = many_empty_tensors(1000000, &len);
	Tpw__V1__ClientMsg *m = NULL;

	/* 2 MB of input would become about 72 MB of Tensor structs and pointers. */
	ck_assert_int_eq(tpw_client_msg_unpack(buf, len, &m), -EBADMSG);
	free(buf);
}
END_TEST

START_TEST(test_frame_unpack_accepts_empty_message)
{
	Tpw__V1__ClientMsg *m = NULL;
	uint8_t none = 0;

	/* Zero bytes decode to a message with no body; validation rejects it later. */
	ck_assert_int_eq(tpw_client_msg_unpack(&none, 0, &m), 0);
	ck_assert_int_eq(m->body_case, TPW__V1__CLIENT_MSG__BODY__NOT_SET);
	tpw_client_msg_free(m);
	tpw_client_msg_free(NULL);
	tpw_daemon_msg_free(NULL);
}
END_TEST

static Suite *frame_suite(void)
{
	Suite *s = suite_create("frame");
	TCase *hdr = tcase_create("header");
	TCase *msg = tcase_create("message");

	tcase_add_test(hdr, test_frame_header_round_trips);
	tcase_add_test(hdr, test_frame_header_is_little_endian);
	tcase_add_test(hdr, test_frame_rejects_bad_magic);
	tcase_add_test(hdr, test_frame_rejects_other_wire_version);
	tcase_add_test(hdr, test_frame_rejects_empty_message);
	tcase_add_test(hdr, test_frame_rejects_too_many_fds);
	tcase_add_test(hdr, test_frame_rejects_oversize);
	tcase_add_test(hdr, test_frame_size_sum_does_not_wrap);
	suite_add_tcase(s, hdr);

	tcase_add_test(msg, test_frame_client_msg_round_trips);
	tcase_add_test(msg, test_frame_daemon_msg_round_trips);
	tcase_add_test(msg, test_frame_hello_reply_round_trips);
	tcase_add_test(msg, test_frame_rejects_truncated_message);
	tcase_add_test(msg, test_frame_rejects_garbage_protobuf);
	tcase_add_test(msg, test_frame_unpack_allocation_stays_bounded);
	tcase_add_test(msg, test_frame_unpack_refuses_amplifying_frame);
	tcase_add_test(msg, test_frame_unpack_accepts_empty_message);
	tcase_set_timeout(msg, 30);
	suite_add_tcase(s, msg);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(frame_suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
