/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * NIC locality: which RDMA port sits nearest a GPU. sysfs names every PCI device by its path
 * through the PCIe hierarchy (/sys/devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0/...), so the
 * real paths behind /sys/bus/pci/devices/<gpu> and /sys/class/infiniband/<dev>/device share a
 * longer prefix the closer the two devices are: same PCIe switch beats same root port beats
 * same root complex. Equal paths fall back to the NUMA node, then round-robin. The sysfs root is
 * a parameter so tests build a fake tree; nothing here talks to verbs or CUDA.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "tpv-int.h"

char *tpv_sysfs_realpath(const char *root, const char *rel)
{
	_cleanup_free_ char *path = NULL;

	if (asprintf(&path, "%s/%s", root, rel) < 0)
		return NULL;
	return realpath(path, NULL);
}

int tpv_sysfs_numa(const char *devpath)
{
	_cleanup_free_ char *path = NULL;
	FILE *f;
	int node;

	if (asprintf(&path, "%s/numa_node", devpath) < 0)
		return -1;
	f = fopen(path, "re");
	if (!f)
		return -1;
	if (fscanf(f, "%d", &node) != 1 || node < 0)
		node = -1;
	fclose(f);
	return node;
}

/* Number of leading '/'-separated components @a and @b share. */
static int common_components(const char *a, const char *b)
{
	int n = 0;

	for (;;) {
		size_t la, lb;

		while (*a == '/')
			a++;
		while (*b == '/')
			b++;
		la = strcspn(a, "/");
		lb = strcspn(b, "/");
		if (!la || la != lb || memcmp(a, b, la))
			return n;
		n++;
		a += la;
		b += lb;
	}
}

/* The real sysfs path of the PCI device @bus_id, in any case or domain width CUDA prints. */
static char *gpu_path(const char *root, const char *bus_id)
{
	unsigned int dom, bus, dev, fn;
	char rel[64];
	int end = 0;

	if (!bus_id || bus_id[strspn(bus_id, "0123456789abcdefABCDEF:.")] ||
	    sscanf(bus_id, "%x:%x:%x.%x%n", &dom, &bus, &dev, &fn, &end) != 4 ||
	    bus_id[end] || bus > 0xff || dev > 0x1f || fn > 7)
		return NULL;
	snprintf(rel, sizeof(rel), "bus/pci/devices/%04x:%02x:%02x.%x", dom, bus, dev, fn);
	return tpv_sysfs_realpath(root, rel);
}

struct nic_rank {
	int prefix; /* components shared with the GPU's path; 0 if either is unknown */
	bool same_node;
};

static struct nic_rank nic_rank(const struct tpv_nic *nic, const char *root, const char *gpu,
				int gpu_node)
{
	_cleanup_free_ char *rel = NULL, *path = NULL;
	struct nic_rank rank = { 0 };

	if (!gpu || asprintf(&rel, "class/infiniband/%s/device", nic->dev) < 0)
		return rank;
	path = tpv_sysfs_realpath(root, rel);
	if (!path)
		return rank;
	rank.prefix = common_components(gpu, path);
	rank.same_node = gpu_node >= 0 && tpv_sysfs_numa(path) == gpu_node;
	return rank;
}

static int rank_cmp(struct nic_rank a, struct nic_rank b)
{
	if (a.prefix != b.prefix)
		return a.prefix > b.prefix ? 1 : -1;
	return (int)a.same_node - (int)b.same_node;
}

int tpv_nic_choose(const struct tpv_nic *nics, size_t n, const char *sysfs_root,
		   const char *gpu_bus_id, unsigned int *rr)
{
	_cleanup_free_ struct nic_rank *ranks = NULL;
	_cleanup_free_ char *gpu = NULL;
	struct nic_rank best = { -1, false };
	size_t i, ties = 0, pick;
	int gpu_node;

	if (!n)
		return -ENOENT;
	ranks = calloc(n, sizeof(*ranks));
	if (!ranks)
		return (int)((*rr)++ % n); /* no memory to rank: plain round-robin */
	gpu = gpu_path(sysfs_root, gpu_bus_id);
	gpu_node = gpu ? tpv_sysfs_numa(gpu) : -1;
	for (i = 0; i < n; i++) {
		ranks[i] = nic_rank(&nics[i], sysfs_root, gpu, gpu_node);
		if (rank_cmp(ranks[i], best) > 0) {
			best = ranks[i];
			ties = 0;
		}
		ties += rank_cmp(ranks[i], best) == 0;
	}
	pick = (*rr)++ % ties;
	for (i = 0; i < n; i++) {
		if (rank_cmp(ranks[i], best) == 0 && pick-- == 0)
			break;
	}
	return (int)i;
}
