/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Frame header codec and bounded protobuf-c unpacking. See frame.h for the layout.
 */
#include <endian.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include "frame.h"

/* Unpacking may allocate at most this many bytes per byte of input, plus a floor. */
#define UNPACK_BUDGET_FACTOR 32
#define UNPACK_BUDGET_FLOOR 4096

static uint32_t get_le32(const uint8_t *p)
{
	uint32_t v;
	memcpy(&v, p, 4);
	return le32toh(v);
}

static uint16_t get_le16(const uint8_t *p)
{
	uint16_t v;
	memcpy(&v, p, 2);
	return le16toh(v);
}

static uint64_t get_le64(const uint8_t *p)
{
	uint64_t v;
	memcpy(&v, p, 8);
	return le64toh(v);
}

int tpw_hdr_parse(const uint8_t *buf, uint32_t frame_max, struct tpw_hdr *ret)
{
	struct tpw_hdr h = {
		.magic = get_le32(buf),
		.version = get_le16(buf + 4),
		.nfds = get_le16(buf + 6),
		.msg_len = get_le32(buf + 8),
		.data_len = get_le32(buf + 12),
		.seq = get_le64(buf + 16),
	};

	if (h.magic != TPW_MAGIC)
		return -EBADMSG;
	if (h.version != TPW_WIRE_VERSION)
		return -EPROTONOSUPPORT;
	if (h.msg_len == 0 || h.nfds > TPW_FDS_MAX)
		return -EBADMSG;
	if ((uint64_t)h.msg_len + h.data_len > frame_max)
		return -EMSGSIZE;
	*ret = h;
	return 0;
}

void tpw_hdr_pack(const struct tpw_hdr *h, uint8_t *buf)
{
	uint32_t v32;
	uint16_t v16;
	uint64_t v64;

	v32 = htole32(h->magic);
	memcpy(buf, &v32, 4);
	v16 = htole16(h->version);
	memcpy(buf + 4, &v16, 2);
	v16 = htole16(h->nfds);
	memcpy(buf + 6, &v16, 2);
	v32 = htole32(h->msg_len);
	memcpy(buf + 8, &v32, 4);
	v32 = htole32(h->data_len);
	memcpy(buf + 12, &v32, 4);
	v64 = htole64(h->seq);
	memcpy(buf + 16, &v64, 8);
}

size_t tpw_frame_size(const ProtobufCMessage *msg)
{
	return TPW_HDR_SIZE + protobuf_c_message_get_packed_size(msg);
}

size_t tpw_frame_pack(const ProtobufCMessage *msg, uint32_t data_len, uint16_t nfds, uint64_t seq,
		      uint8_t *buf)
{
	size_t n = protobuf_c_message_pack(msg, buf + TPW_HDR_SIZE);
	struct tpw_hdr h = {
		.magic = TPW_MAGIC,
		.version = TPW_WIRE_VERSION,
		.nfds = nfds,
		.msg_len = (uint32_t)n,
		.data_len = data_len,
		.seq = seq,
	};

	tpw_hdr_pack(&h, buf);
	return TPW_HDR_SIZE + n;
}

struct budget {
	size_t left;
};

static void *budget_alloc(void *data, size_t size)
{
	struct budget *b = data;

	if (size > b->left)
		return NULL;
	b->left -= size;
	return malloc(size);
}

static void plain_free(void *data, void *ptr)
{
	free(ptr);
}

static void *plain_alloc(void *data, size_t size)
{
	return malloc(size);
}

static ProtobufCAllocator free_allocator = {
	.alloc = plain_alloc,
	.free = plain_free,
	.allocator_data = NULL,
};

static ProtobufCMessage *unpack_bounded(const ProtobufCMessageDescriptor *desc, const uint8_t *buf,
					size_t len)
{
	struct budget b = { .left = len * UNPACK_BUDGET_FACTOR + UNPACK_BUDGET_FLOOR };
	ProtobufCAllocator alloc = {
		.alloc = budget_alloc,
		.free = plain_free,
		.allocator_data = &b,
	};

	return protobuf_c_message_unpack(desc, &alloc, len, buf);
}

int tpw_client_msg_unpack(const uint8_t *buf, size_t len, Tpw__V1__ClientMsg **ret)
{
	ProtobufCMessage *m = unpack_bounded(&tpw__v1__client_msg__descriptor, buf, len);

	if (!m)
		return -EBADMSG;
	*ret = (Tpw__V1__ClientMsg *)m;
	return 0;
}

int tpw_daemon_msg_unpack(const uint8_t *buf, size_t len, Tpw__V1__DaemonMsg **ret)
{
	ProtobufCMessage *m = unpack_bounded(&tpw__v1__daemon_msg__descriptor, buf, len);

	if (!m)
		return -EBADMSG;
	*ret = (Tpw__V1__DaemonMsg *)m;
	return 0;
}

int tpw_peer_msg_unpack(const uint8_t *buf, size_t len, Tpw__V1__PeerMsg **ret)
{
	ProtobufCMessage *m = unpack_bounded(&tpw__v1__peer_msg__descriptor, buf, len);

	if (!m)
		return -EBADMSG;
	*ret = (Tpw__V1__PeerMsg *)m;
	return 0;
}

void tpw_peer_msg_free(Tpw__V1__PeerMsg *m)
{
	if (m)
		protobuf_c_message_free_unpacked(&m->base, &free_allocator);
}

void tpw_client_msg_free(Tpw__V1__ClientMsg *m)
{
	if (m)
		protobuf_c_message_free_unpacked(&m->base, &free_allocator);
}

void tpw_daemon_msg_free(Tpw__V1__DaemonMsg *m)
{
	if (m)
		protobuf_c_message_free_unpacked(&m->base, &free_allocator);
}
