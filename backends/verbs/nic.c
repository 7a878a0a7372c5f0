/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Finding RDMA ports: every device ibv_get_device_list() reports, every port it has, kept when
 * the port is active and addressable (a LID on InfiniBand, a RoCE GID on Ethernet, preferring
 * RoCE v2 with an IPv4-mapped address), with its PCI address and NUMA node from sysfs and the
 * network it sits on (its rail: the InfiniBand subnet prefix, or the IP network of its RoCE
 * GID, with the netmask of the interface that holds the address). Also the
 * probe built on it. Choosing among the ports is topo.c's job; opening one is ctx.c's.
 */
#include <errno.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "tpv-int.h"

#define GID_TABLE_MAX 256 /* entries looked at per port */

int tpv_verbs_rc(int r)
{
	if (r > 0)
		return -r;
	if (r < 0)
		return errno > 0 ? -errno : -EIO;
	return 0;
}

int tpv_verbs_errno(int fallback)
{
	return errno > 0 ? -errno : fallback;
}

void tpv_why_add(char *why, size_t why_len, const char *fmt, ...)
{
	size_t used;
	va_list ap;

	if (!why || !why_len)
		return;
	used = strnlen(why, why_len);
	if (used && used + 2 < why_len) {
		memcpy(why + used, "; ", 3);
		used += 2;
	}
	if (used + 1 >= why_len)
		return;
	va_start(ap, fmt);
	vsnprintf(why + used, why_len - used, fmt, ap);
	va_end(ap);
}

const char *tpv_link_name(enum tpv_link link)
{
	return link == TPV_LINK_ETH ? "Ethernet" : "InfiniBand";
}

/* How good a RoCE GID is for reaching another host; 0 for unusable. */
static int gid_score(const struct ibv_gid_entry *e)
{
	static const uint8_t zero[TPV_GID_BYTES];
	static const uint8_t v4mapped[12] = { [10] = 0xff, [11] = 0xff };
	const uint8_t *g = e->gid.raw;
	bool link_local = g[0] == 0xfe && (g[1] & 0xc0) == 0x80;

	if (!memcmp(g, zero, sizeof(zero)))
		return 0;
	if (e->gid_type == IBV_GID_TYPE_ROCE_V2) {
		if (!memcmp(g, v4mapped, sizeof(v4mapped)))
			return 4;
		return link_local ? 1 : 3;
	}
	return e->gid_type == IBV_GID_TYPE_ROCE_V1 ? 2 : 0;
}

/* Sets @nic's GID: the best RoCE entry on Ethernet, entry 0 on InfiniBand. */
static int port_pick_gid(const struct tpv_ops *ops, struct ibv_context *verbs,
			 const struct ibv_port_attr *pa, struct tpv_nic *nic)
{
	int i, n = TPU_MIN(pa->gid_tbl_len, GID_TABLE_MAX), best = 0;
	struct ibv_gid_entry e;

	nic->gid_index = -1;
	for (i = 0; i < n; i++) {
		int score;

		memset(&e, 0, sizeof(e));
		if (ops->query_gid_ex(verbs, nic->port, (uint32_t)i, &e))
			continue; /* ENODATA: an empty slot */
		score = nic->link == TPV_LINK_IB ? 1 : gid_score(&e);
		if (score > best) {
			best = score;
			nic->gid_index = i;
			memcpy(nic->gid, e.gid.raw, TPV_GID_BYTES);
		}
		if (nic->link == TPV_LINK_IB)
			break;
	}
	return nic->gid_index >= 0 ? 0 : -ENOENT;
}

/* Prefix length of the local interface holding IPv4 address @a (network order), or -1. */
static int ipv4_prefix(const uint8_t a[4])
{
	struct ifaddrs *ifs, *i;
	int len = -1;

	if (getifaddrs(&ifs) < 0)
		return -1;
	for (i = ifs; i && len < 0; i = i->ifa_next) {
		const struct sockaddr_in *sa = (const void *)i->ifa_addr;
		const struct sockaddr_in *nm = (const void *)i->ifa_netmask;

		if (!sa || !nm || sa->sin_family != AF_INET || memcmp(&sa->sin_addr, a, 4))
			continue;
		len = __builtin_popcount(nm->sin_addr.s_addr);
	}
	freeifaddrs(ifs);
	return len;
}

/*
 * Sets @nic->rail from its link and GID: InfiniBand, the subnet prefix (the GID's top 64 bits);
 * RoCE with an IPv4-mapped GID, the IPv4 network (prefix length of the interface holding the
 * address, /16 if none here does); other RoCE GIDs, their /64.
 */
static void port_rail(struct tpv_nic *nic)
{
	static const uint8_t v4mapped[12] = { [10] = 0xff, [11] = 0xff };
	uint8_t *k = nic->rail;
	int bits;

	memset(k, 0, TPV_RAIL_BYTES);
	if (nic->link == TPV_LINK_IB || memcmp(nic->gid, v4mapped, sizeof(v4mapped))) {
		k[0] = nic->link == TPV_LINK_IB ? 1 : 3;
		k[1] = 64;
		memcpy(k + 2, nic->gid, 8);
		return;
	}
	bits = ipv4_prefix(nic->gid + 12);
	bits = bits < 0 ? 16 : bits;
	k[0] = 2;
	k[1] = (uint8_t)bits;
	for (int i = 0; i < 4; i++) {
		int keep = TPU_MIN(TPU_MAX(bits - 8 * i, 0), 8);

		k[2 + i] = (uint8_t)(nic->gid[12 + i] & (uint8_t)(0xff00u >> keep));
	}
}

/*
 * Fills @nic for port @port of @dev. Return: 1 usable, 0 not active (no reason: the device's
 * "no active port" covers it), -ENODEV active but unusable (reason added to @why).
 */
static int port_fill(const struct tpv_ops *ops, struct ibv_context *verbs, const char *dev,
		     uint8_t port, struct tpv_nic *nic, char *why, size_t why_len)
{
	struct ibv_port_attr pa;
	char eb[64];
	int r;

	memset(&pa, 0, sizeof(pa));
	r = tpv_verbs_rc(ops->query_port(verbs, port, &pa));
	if (r < 0) {
		tpv_why_add(why, why_len, "%s port %u: ibv_query_port: %s", dev, port,
			    tpu_strerror(r, eb, sizeof(eb)));
		return -ENODEV;
	}
	if (pa.state != IBV_PORT_ACTIVE)
		return 0;
	memset(nic, 0, sizeof(*nic));
	snprintf(nic->dev, sizeof(nic->dev), "%s", dev);
	nic->port = port;
	nic->link = pa.link_layer == IBV_LINK_LAYER_ETHERNET ? TPV_LINK_ETH : TPV_LINK_IB;
	nic->mtu = pa.active_mtu;
	nic->lid = pa.lid;
	nic->max_msg_sz = pa.max_msg_sz;
	nic->numa_node = -1;
	if (port_pick_gid(ops, verbs, &pa, nic) < 0 && nic->link == TPV_LINK_ETH) {
		tpv_why_add(why, why_len, "%s port %u: no usable RoCE GID", dev, port);
		return -ENODEV;
	}
	if (nic->link == TPV_LINK_IB && !nic->lid) {
		tpv_why_add(why, why_len, "%s port %u: no LID (is a subnet manager running?)", dev,
			    port);
		return -ENODEV;
	}
	port_rail(nic);
	return 1;
}

/* PCI address and NUMA node of @nic's device, from @root/class/infiniband/<dev>/device. */
static void nic_sysfs(const char *root, struct tpv_nic *nic)
{
	_cleanup_free_ char *rel = NULL, *path = NULL;
	const char *base;

	if (asprintf(&rel, "class/infiniband/%s/device", nic->dev) < 0)
		return;
	path = tpv_sysfs_realpath(root, rel);
	if (!path)
		return;
	base = strrchr(path, '/');
	snprintf(nic->pci, sizeof(nic->pci), "%s", base ? base + 1 : path);
	nic->numa_node = tpv_sysfs_numa(path);
}

struct nic_vec {
	struct tpv_nic *v;
	size_t n, cap;
};

static int vec_push(struct nic_vec *vec, const struct tpv_nic *nic)
{
	if (vec->n == vec->cap) {
		size_t cap = vec->cap ? vec->cap * 2 : 4;
		struct tpv_nic *v = reallocarray(vec->v, cap, sizeof(*v));

		if (!v)
			return -ENOMEM;
		vec->v = v;
		vec->cap = cap;
	}
	vec->v[vec->n++] = *nic;
	return 0;
}

/* Appends the usable ports of @dev to @vec. Return: 0 or -ENOMEM. */
static int device_ports(const struct tpv_ops *ops, struct ibv_device *dev, const char *root,
			struct nic_vec *vec, char *why, size_t why_len)
{
	struct ibv_device_attr da;
	struct ibv_context *verbs;
	int r, usable = 0, unusable = 0;
	struct tpv_nic nic;
	char eb[64];

	verbs = ops->open_device(dev);
	if (!verbs) {
		tpv_why_add(why, why_len, "%s: ibv_open_device: %s", dev->name,
			    tpu_strerror(tpv_verbs_errno(-ENODEV), eb, sizeof(eb)));
		return 0;
	}
	memset(&da, 0, sizeof(da));
	r = tpv_verbs_rc(ops->query_device(verbs, &da));
	if (r < 0) {
		tpv_why_add(why, why_len, "%s: ibv_query_device: %s", dev->name,
			    tpu_strerror(r, eb, sizeof(eb)));
		da.phys_port_cnt = 0;
		unusable = 1;
		r = 0;
	}
	for (unsigned int p = 1; r >= 0 && p <= da.phys_port_cnt; p++) {
		int k = port_fill(ops, verbs, dev->name, (uint8_t)p, &nic, why, why_len);

		unusable += k < 0;
		if (k <= 0)
			continue;
		nic_sysfs(root, &nic);
		r = vec_push(vec, &nic);
		usable++;
	}
	if (r >= 0 && !usable && !unusable)
		tpv_why_add(why, why_len, "%s: no active port", dev->name);
	ops->close_device(verbs);
	return r;
}

int tpv_nics_list(const struct tpv_ops *ops, const char *sysfs_root, struct tpv_nic **ret,
		  size_t *ret_n, char *why, size_t why_len)
{
	struct nic_vec vec = { 0 };
	struct ibv_device **list;
	int i, n = 0, r = 0;
	char eb[64];

	if (why && why_len)
		why[0] = '\0';
	errno = 0;
	list = ops->get_device_list(&n);
	if (!list) {
		tpv_why_add(why, why_len, "no RDMA device (ibv_get_device_list: %s)",
			    tpu_strerror(tpv_verbs_errno(-ENODEV), eb, sizeof(eb)));
		n = 0;
	} else if (n <= 0) {
		tpv_why_add(why, why_len, "no RDMA device (ibv_get_device_list found none)");
	}
	for (i = 0; i < n && r >= 0; i++)
		r = device_ports(ops, list[i], sysfs_root, &vec, why, why_len);
	if (list)
		ops->free_device_list(list);
	if (r < 0) {
		free(vec.v);
		return r;
	}
	*ret = vec.v;
	*ret_n = vec.n;
	return 0;
}

/* Queries GID entry @index of @nic's port on its device. Return: 0 or -errno (@why). */
static int nic_query_gid(const struct tpv_ops *ops, const struct tpv_nic *nic, int index,
			 struct ibv_gid_entry *e, char *why, size_t why_len)
{
	struct ibv_context *verbs = NULL;
	struct ibv_device **list;
	int i, n = 0, r;
	char eb[64];

	errno = 0;
	list = ops->get_device_list(&n);
	for (i = 0; list && i < n && !verbs; i++)
		if (!strcmp(list[i]->name, nic->dev))
			verbs = ops->open_device(list[i]);
	if (list)
		ops->free_device_list(list);
	if (!verbs)
		return tpu_why(-ENODEV, why, why_len, "%s: cannot open the device", nic->dev);
	memset(e, 0, sizeof(*e));
	r = tpv_verbs_rc(ops->query_gid_ex(verbs, nic->port, (uint32_t)index, e));
	ops->close_device(verbs);
	if (r < 0)
		return tpu_why(r == -EINVAL ? -ENODATA : r, why, why_len,
			       "%s port %u: GID index %d: %s", nic->dev, nic->port, index,
			       tpu_strerror(r, eb, sizeof(eb)));
	return 0;
}

int tpv_nic_use_gid(const struct tpv_ops *ops, struct tpv_nic *nic, int index, char *why,
		    size_t why_len)
{
	struct ibv_gid_entry e;
	int r;

	if (index < 0 || index >= GID_TABLE_MAX)
		return tpu_why(-ENODATA, why, why_len, "GID index %d out of range", index);
	r = nic_query_gid(ops, nic, index, &e, why, why_len);
	if (r < 0)
		return r;
	if (nic->link == TPV_LINK_ETH ? !gid_score(&e) : !memcmp(e.gid.raw,
			(uint8_t[TPV_GID_BYTES]){ 0 }, TPV_GID_BYTES))
		return tpu_why(-ENODATA, why, why_len, "%s port %u: GID index %d is not usable",
			       nic->dev, nic->port, index);
	nic->gid_index = index;
	memcpy(nic->gid, e.gid.raw, TPV_GID_BYTES);
	port_rail(nic);
	return 0;
}

int tpv_probe(const struct tpv_ops *ops, char *why, size_t why_len)
{
	_cleanup_free_ struct tpv_nic *nics = NULL;
	size_t n = 0;

	if (tpv_nics_list(ops, TPV_SYSFS_ROOT, &nics, &n, why, why_len) < 0)
		return tpu_why(0, why, why_len, "out of memory listing RDMA devices");
	if (!n)
		return 0;
	return tpu_why(1, why, why_len, "%s port %u (%s)%s", nics[0].dev, nics[0].port,
		       tpv_link_name(nics[0].link), n > 1 ? " and more" : "");
}
