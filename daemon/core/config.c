/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Defaults, config file and flags for tpipd, from one option table. See config.h.
 */
#include <getopt.h>
#include <ini.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <unistd.h>
#include "addr.h"
#include "config.h"
#include "quota.h"
#include "ring.h"
#include "tpb.h"
#include "tpconfig.h"

/* K_FLAG: a bool set by a flag without argument (--name), 'name = yes|no' in the file. */
enum kind { K_U32, K_U64, K_SIZE32, K_SIZE64, K_PATH, K_STR, K_LOG, K_BOOL, K_NOBOOL, K_FLAG };

struct opt {
	const char *name;    /* flag --name and key name */
	const char *section; /* INI section */
	enum kind kind;
	size_t off;
	uint64_t min, max;
	bool live;	     /* a reload applies it without restart */
	const char *arg, *help;
};

#define OFF(f) offsetof(struct tpd_config, f)
#define MiB (1ull << 20)

static const struct opt opts[] = {
	{ "socket", "daemon", K_PATH, OFF(socket_path), 0, sizeof(((struct tpd_config *)0)->socket_path),
	  false, "PATH",
	  "control socket (default: $TPIPD_SOCKET, /run/tpipd/tpipd.sock as root,\n"
	  "                            else $XDG_RUNTIME_DIR/tpipd.sock)" },
	{ "log-level", "daemon", K_LOG, OFF(log_level), 0, 0, true, "LEVEL",
	  "err, warning, notice, info (default), debug" },
	{ "copy-threads", "daemon", K_U32, OFF(copy_threads), 1, 64, false, "N",
	  "copy threads (default 2)" },
	{ "drain-ms", "daemon", K_U32, OFF(drain_ms), 0, 600000, true, "MS",
	  "on stop, wait this long for copies in flight (default 5000)" },
	{ "ring-max", "daemon", K_SIZE32, OFF(ring_max), 0, TPU_RING_MAX, true, "BYTES",
	  "largest shared-memory control ring a client may set up, per direction;\n"
	  "                            0 keeps every client on the socket (default 4M)" },
	{ "spin-us", "daemon", K_U32, OFF(spin_us), 0, 100000, true, "US",
	  "poll busy control rings this long before sleeping; 0 never spins (default 100)" },
	{ "admin-gid", "daemon", K_U32, OFF(admin_gid), 0, UINT32_MAX, true, "GID",
	  "members of this group may use admin control requests (default: root only)" },
	{ "metrics-listen", "daemon", K_STR, OFF(metrics_listen), 0,
	  sizeof(((struct tpd_config *)0)->metrics_listen), false, "ADDR:PORT",
	  "serve Prometheus metrics over HTTP on a local address (default: off)" },
	{ "metrics-allow-remote", "daemon", K_FLAG, OFF(metrics_allow_remote), 0, 0, false, "",
	  "let --metrics-listen be a non-loopback address: other hosts then read the\n"
	  "                            page, unauthenticated (default: loopback only)" },
	{ "sessions-max", "limits", K_U32, OFF(sessions_max), 1, 1u << 20, true, "N",
	  "attached clients (default 1024)" },
	{ "sessions-per-uid", "limits", K_U32, OFF(sessions_per_uid), 1, 1u << 20, true, "N",
	  "attached clients per uid; root is exempt (default 128)" },
	{ "groups-per-uid", "limits", K_U32, OFF(groups_per_uid), 1, 1u << 16, true, "N",
	  "collective groups of one uid, joining or formed (default 16)" },
	{ "group-members-max", "limits", K_U32, OFF(group_members_max), 1, 4096, true, "N",
	  "members of one collective group (default 256)" },
	{ "group-peer-groups-max", "limits", K_U32, OFF(group_peer_groups_max), 1, 1u << 16, true,
	  "N", "groups this daemon coordinates with members over one peer link (default 64)" },
	{ "group-bytes-per-uid", "limits", K_SIZE64, OFF(group_bytes_per_uid), 0, UINT64_MAX,
	  true, "BYTES", "shared-memory arena bytes of one uid's groups (default 1G)" },
	{ "group-chunk", "limits", K_SIZE32, OFF(group_chunk), 65536, 64u << 20, true, "BYTES",
	  "bytes of a group's shared-memory slot, up to 8 members; larger groups get\n"
	  "                            8x this divided by their size (default 1M)" },
	{ "chans-per-uid", "limits", K_U32, OFF(chans_per_uid), 1, 1u << 16, true, "N",
	  "named channels one uid may create (default 64)" },
	{ "chan-items-max", "limits", K_U32, OFF(chan_items_max), 1, 1u << 24, true, "N",
	  "items one channel holds; its capacity may be lower (default 4096)" },
	{ "chan-bytes-max", "limits", K_SIZE64, OFF(chan_bytes_max), 1, UINT64_MAX, true, "BYTES",
	  "item bytes one channel holds; its capacity may be lower (default 64M)" },
	{ "chan-bytes-per-uid", "limits", K_SIZE64, OFF(chan_bytes_per_uid), 1, UINT64_MAX, true,
	  "BYTES", "item bytes held in the channels one uid created, and buffers its\n"
	  "                            writers lend to channels (default 256M)" },
	{ "wqs-per-uid", "limits", K_U32, OFF(wqs_per_uid), 1, 1u << 16, true, "N",
	  "work queues one uid may create (default 64)" },
	{ "wq-questions-max", "limits", K_U32, OFF(wq_questions_max), 1, 1u << 24, true, "N",
	  "questions one work queue holds, from submit until its answer is received (default 4096)" },
	{ "wq-bytes-max", "limits", K_SIZE64, OFF(wq_bytes_max), 1, UINT64_MAX, true, "BYTES",
	  "question bytes one work queue holds (default 64M)" },
	{ "wq-answer-bytes-max", "limits", K_SIZE64, OFF(wq_answer_bytes_max), 1, UINT64_MAX, true,
	  "BYTES", "answer bytes one work queue holds for its owner (default 64M)" },
	{ "chan-peer-ops-max", "limits", K_U32, OFF(chan_peer_ops_max), 1, 1u << 20, true, "N",
	  "channel and queue ops over one peer link waiting: forwarded and not answered yet,\n"
	  "                            or hosted and waiting for items or room (default 1024)" },
	{ "chan-peer-ops-per-uid", "limits", K_U32, OFF(chan_peer_ops_per_uid), 0, 1u << 20, true,
	  "N", "of the ops forwarded over one peer link, those one local uid may have waiting\n"
	  "                            (root: no share; 0: a quarter of chan-peer-ops-max; default 0)" },
	{ "chan-peer-bytes-max", "limits", K_SIZE64, OFF(chan_peer_bytes_max), 1, UINT64_MAX,
	  true, "BYTES", "channel item bytes arriving over one peer link at once, a write's\n"
	  "                            included (large items across hosts; default 1G)" },
	{ "chan-remote-create-uid", "limits", K_U32, OFF(chan_remote_create_uid), 0,
	  UINT32_MAX - 1, true, "UID",
	  "local uid that owns the channels authenticated peer daemons create and may unlink\n"
	  "                            here (tp_chan_open of tpip://...); 0, the default: none" },
	{ "chan-remote-create-per-peer", "limits", K_U32, OFF(chan_remote_create_per_peer), 1,
	  1u << 16, true, "N", "channels one far daemon may have created here at once, and work\n"
	  "                            queues as many (within chans-per-uid, wqs-per-uid; default 16)" },
	{ "chan-remote-bytes-per-peer", "limits", K_SIZE64, OFF(chan_remote_bytes_per_peer), 1,
	  UINT64_MAX, true, "BYTES", "item bytes held in the channels one far daemon created here\n"
	  "                            (within chan-bytes-per-uid; default 64M)" },
	{ "sessions-reserved", "limits", K_U32, OFF(sessions_reserved), 0, 1u << 20, true, "N",
	  "of sessions-max, slots only root and the admin group may use (default 8)" },
	{ "hello-timeout", "limits", K_U32, OFF(hello_timeout_ms), 100, 600000, true, "MS",
	  "a client that has not said Hello within this is closed (default 5000)" },
	{ "hello-frame-max", "limits", K_SIZE32, OFF(hello_frame_max), 1024, TPW_FRAME_MAX_HARD,
	  true, "BYTES", "largest frame accepted before Hello (default 4K)" },
	{ "input-bytes-per-uid", "limits", K_SIZE64, OFF(input_bytes_per_uid), 0, UINT64_MAX,
	  true, "BYTES", "partial frames held for the clients of one uid (default 64M)" },
	{ "input-bytes-max", "limits", K_SIZE64, OFF(input_bytes_max), 0, UINT64_MAX, true,
	  "BYTES", "partial frames held for all clients together (default 512M)" },
	{ "client-queue-bytes-per-uid", "limits", K_SIZE64, OFF(outq_per_uid), MiB, UINT64_MAX,
	  true, "BYTES", "bytes queued towards the clients of one uid (default 1G)" },
	{ "client-queue-bytes-max", "limits", K_SIZE64, OFF(outq_total), MiB, UINT64_MAX, true,
	  "BYTES", "bytes queued towards all clients together (default 4G)" },
	{ "frame-max", "limits", K_SIZE32, OFF(wire.frame_max), TPW_FRAME_MAX_MIN,
	  TPW_FRAME_MAX_HARD, true, "BYTES", "largest frame accepted (default 4M, at most 64M)" },
	{ "inline-max", "limits", K_SIZE32, OFF(wire.inline_max), 0, TPW_FRAME_MAX_HARD, true,
	  "BYTES", "largest inline data per write (default 1M)" },
	{ "segments-max", "limits", K_U32, OFF(wire.segments_max), 0, 1u << 20, true, "N",
	  "payloads + tensors per message (default 1024)" },
	{ "metadata-max", "limits", K_SIZE32, OFF(wire.metadata_max), 0, TPW_FRAME_MAX_HARD, true,
	  "BYTES", "metadata bytes per message (default 1M)" },
	{ "message-bytes-max", "limits", K_SIZE64, OFF(wire.message_bytes_max), 0, UINT64_MAX,
	  true, "BYTES", "data bytes per message (default 16G)" },
	{ "pipes-max", "limits", K_U32, OFF(pipes_max), 1, 1u << 24, true, "N",
	  "pipes per client (default 4096)" },
	{ "pipe-queue-max", "limits", K_U32, OFF(pipe_queue_max), 1, 1u << 24, true, "N",
	  "unread messages per pipe direction (default 4096)" },
	{ "pipe-queue-bytes", "limits", K_SIZE64, OFF(pipe_queue_bytes), 0, UINT64_MAX, true,
	  "BYTES", "inline bytes held per pipe direction (default 64M)" },
	{ "pipe-queue-bytes-max", "limits", K_SIZE64, OFF(pipe_queue_bytes_total), 0, UINT64_MAX,
	  true, "BYTES", "bytes held for unread messages in all pipes: inline data and\n"
	  "                            bookkeeping (default 2G)" },
	{ "buffers-max", "limits", K_U32, OFF(buffers_max), 0, 1u << 20, true, "N",
	  "shared buffers per client (default 1024)" },
	{ "buffer-bytes-max", "limits", K_SIZE64, OFF(buffer_bytes_max), 0, UINT64_MAX, true,
	  "BYTES", "shared buffer bytes per client (default 64G)" },
	{ "buffer-bytes-per-uid", "limits", K_SIZE64, OFF(buffer_bytes_per_uid), 0, UINT64_MAX,
	  true, "BYTES", "shared buffer bytes of all clients of one uid; root is exempt (default "
	  "256G)" },
	{ "kept-fds-per-uid", "limits", K_U32, OFF(kept_fds_per_uid), 0, 1u << 20, true, "N",
	  "fds of clients' buffers the daemon keeps for one uid (channel buffers\n"
	  "                            readers map, CUDA dma-bufs); root is exempt (default 1024)" },
	{ "waits-per-uid", "limits", K_U32, OFF(waits_per_uid), 1, 1u << 24, true, "N",
	  "channel and work queue calls the clients of one uid may have waiting in the\n"
	  "                            daemon (reads, writes for room, takes, answer reads, drains);\n"
	  "                            root is exempt (default 4096)" },
	{ "kept-fds-max", "limits", K_U32, OFF(kept_fds_max), 0, 1u << 24, true, "N",
	  "such fds of all clients; must fit RLIMIT_NOFILE after the fds sessions,\n"
	  "                            peer links and rings need; 0 derives it (default 0)" },
	{ "bcast-pipes-max", "limits", K_U32, OFF(bcast_pipes_max), 0, TPW_BCAST_TARGETS_MAX, false,
	  "N", "pipes one daemon broadcast may name; 0: no daemon fan-out, clients\n"
	  "                            write to each pipe (default 1024)" },
	{ "bcast-stage-bytes-per-uid", "limits", K_SIZE64, OFF(bcast_stage_bytes_per_uid), 0,
	  UINT64_MAX, true, "BYTES", "private memory of one uid's broadcasts held in daemon\n"
	  "                            staging; above it readers read the writer (default 1G)" },
	{ "listeners-max", "limits", K_U32, OFF(listeners_max), 1, 1u << 20, true, "N",
	  "listeners per client (default 256)" },
	{ "cuda-mappings-max", "limits", K_U32, OFF(cuda_holds_max), 1, 1u << 20, true, "N",
	  "CUDA allocations a client keeps mapped, least recently used unmapped (default 256)" },
	{ "cuda-dmabufs-max", "limits", K_U32, OFF(cuda_dmabufs_max), 0, 1u << 16, true, "N",
	  "dma-bufs of CUDA allocations a client hands over for RDMA, least recently\n"
	  "                            handed over closed beyond it; 0 refuses them (default 64)" },
	{ "cuda-cache-mappings", "limits", K_BOOL, OFF(cuda_cache), 0, 0, true, "yes|no",
	  "keep clients' CUDA memory mapped between transfers\n"
	  "                            (default no: mapped for each transfer only)" },
	{ "client-queue-bytes", "limits", K_SIZE64, OFF(outq_max), MiB, UINT64_MAX, true, "BYTES",
	  "bytes queued towards a client that does not read before it is dropped (default 256M)" },
	{ "cma", "backends", K_NOBOOL, OFF(no_cma), 0, 0, false, "yes|no",
	  "never use cross-memory attach (file: [backends] cma = no)" },
	{ "shm", "backends", K_NOBOOL, OFF(no_shm), 0, 0, false, "yes|no",
	  "never copy between shared mappings (file: [backends] shm = no)" },
	{ "rdma", "backends", K_NOBOOL, OFF(no_rdma), 0, 0, false, "yes|no",
	  "never use RDMA between hosts: no rdma, no cuda_gdr (file: [backends] rdma = no)" },
	{ "rdma-cache", "backends", K_SIZE64, OFF(rdma_cache), 0, UINT64_MAX, true, "BYTES",
	  "memory kept registered for RDMA after its transfer, for the next ones;\n"
	  "                            0 registers every transfer anew (default 4G)" },
	{ "rdma-traffic-class", "backends", K_U32, OFF(rdma_traffic_class), 0, 255, false, "N",
	  "RoCE traffic class of RDMA queue pairs, e.g. a lossless one (default 0)" },
	{ "rdma-sl", "backends", K_U32, OFF(rdma_sl), 0, 15, false, "N",
	  "service level of RDMA queue pairs (default 0)" },
	{ "rdma-gid-index", "backends", K_U32, OFF(rdma_gid_index), 0, 255, false, "N",
	  "GID table entry of every RDMA port; ports where it is empty are left out\n"
	  "                            (default: first RoCE v2 IPv4-mapped; shown as 4294967295)" },
	{ "rdma-timeout", "backends", K_U32, OFF(rdma_timeout), 1, 31, false, "N",
	  "RDMA ACK timeout, 4.096 us * 2^N (default 14: about 67 ms)" },
	{ "rdma-retry", "backends", K_U32, OFF(rdma_retry), 1, 7, false, "N",
	  "retries of an unanswered RDMA write before it fails (default 7)" },
	{ "rdma-rebuild-ms", "backends", K_U32, OFF(rdma_rebuild_ms), 10, 600000, false, "MS",
	  "wait before a link whose RDMA write failed rebuilds its queue pairs;\n"
	  "                            doubles each time, at most 60000 (default 1000)" },
	{ "rdma-rebuild-max", "backends", K_U32, OFF(rdma_rebuild_max), 0, 1000, false, "N",
	  "rebuilds in a row without a write completing, then RDMA stays off on\n"
	  "                            that link; 0 never rebuilds (default 5)" },
	{ "pipe-ring", "backends", K_BOOL, OFF(pipe_ring), 0, 0, true, "yes|no",
	  "move private->private messages through a staging ring both clients map,\n"
	  "                            the bytes never through the daemon (default yes)" },
	{ "pipe-ring-min", "backends", K_SIZE64, OFF(pipe_ring_min), 0, UINT64_MAX, true, "BYTES",
	  "smallest message that goes through a pipe ring (default 64K)" },
	{ "pipe-ring-bytes-max", "backends", K_SIZE64, OFF(pipe_ring_bytes_max), 0, UINT64_MAX,
	  true, "BYTES", "pipe ring bytes of all pipes together (default 256M)" },
	{ "pipe-ring-bytes-per-uid", "backends", K_SIZE64, OFF(pipe_ring_bytes_per_uid), 0,
	  UINT64_MAX, true, "BYTES", "pipe ring bytes of the pipes one uid writes to (default 64M)" },
	{ "backend-priority", "backends", K_STR, OFF(backend_priority), 0,
	  sizeof(((struct tpd_config *)0)->backend_priority), false, "NAMES",
	  "channels to try first, in order, e.g. cma,shm (default: shm,cma,basic)" },
	/* [peer]: the file's keys drop the "peer-" prefix ("listen = ..."). */
	{ "peer-listen", "peer", K_STR, OFF(peer_listen), 0,
	  sizeof(((struct tpd_config *)0)->peer_listen), false, "ADDR:PORT|off",
	  "accept peer daemons on this TCP address (default *:7420: all, IPv4 and IPv6)" },
	{ "peer-host-name", "peer", K_STR, OFF(peer_host_name), 0,
	  sizeof(((struct tpd_config *)0)->peer_host_name), false, "NAME",
	  "the host name this daemon gives its peers (default: gethostname())" },
	{ "peer-port", "peer", K_U32, OFF(peer_port), 1, 65535, true, "PORT",
	  "port of tpip://HOST/NAME addresses without one (default 7420)" },
	{ "peer-data-conns", "peer", K_U32, OFF(peer_data_conns), 1, 16, true, "N",
	  "data connections per peer link, striped for large tensors (default 4)" },
	{ "peer-key-file", "peer", K_PATH, OFF(peer_key_file), 0,
	  sizeof(((struct tpd_config *)0)->peer_key_file), false, "PATH",
	  "pre-shared key: peers authenticate by TLS 1.3 with this PSK (default: none)" },
	{ "peer-cert", "peer", K_PATH, OFF(peer_cert), 0,
	  sizeof(((struct tpd_config *)0)->peer_cert), false, "PATH",
	  "this daemon's certificate chain (PEM) for mutual TLS with peers (default: none)" },
	{ "peer-cert-key", "peer", K_PATH, OFF(peer_cert_key), 0,
	  sizeof(((struct tpd_config *)0)->peer_cert_key), false, "PATH",
	  "the private key of --peer-cert (PEM)" },
	{ "peer-ca", "peer", K_PATH, OFF(peer_ca), 0, sizeof(((struct tpd_config *)0)->peer_ca),
	  false, "PATH", "the cluster CA (PEM) that must sign every peer's certificate" },
	{ "peer-data-encryption", "peer", K_BOOL, OFF(peer_data_encryption), 0, 0, false,
	  "yes|no", "encrypt tensor bytes on data connections (default yes; no: a trusted\n"
	  "                            fabric, still authenticated; both ends must agree)" },
	{ "peer-insecure", "peer", K_FLAG, OFF(peer_insecure), 0, 0, false, "",
	  "peer over plain TCP without authentication (test fabrics only; logged loudly)" },
	{ "peer-connect-timeout", "peer", K_U32, OFF(peer_connect_timeout_ms), 100, 600000, true,
	  "MS", "reach a peer, authenticate and be accepted within this (default 5000)" },
	{ "peer-timeout", "peer", K_U32, OFF(peer_timeout_ms), 300, 600000, true, "MS",
	  "a peer silent this long is dead; keepalives every third of it (default 6000)" },
	{ "peer-force-cross-host", "peer", K_FLAG, OFF(peer_force_cross_host), 0, 0, false, "",
	  "treat daemons on this host (same boot id) as other hosts" },
	{ "peer-chunk", "peer", K_SIZE32, OFF(peer_chunk), 4096, 16u << 20, true, "BYTES",
	  "striping unit of large tensors over data connections (default 1M)" },
	{ "peer-send-size", "peer", K_SIZE32, OFF(peer_send_size), 4096, 16u << 20, true, "BYTES",
	  "bytes per socket write on data connections (default 60K)" },
	{ "peer-pending-max", "peer", K_U32, OFF(peer_pending_max), 1, 1u << 20, true, "N",
	  "accepted peer connections that have not sent their first frame (default 128)" },
	{ "peer-pending-per-source", "peer", K_U32, OFF(peer_pending_per_source), 1, 1u << 20,
	  true, "N", "of those, from one address (default 32)" },
	{ "peer-links-max", "peer", K_U32, OFF(peer_links_max), 1, 1u << 20, true, "N",
	  "links other daemons open to this one, and links it dials\n"
	  "                            (default 128 each)" },
	{ "peer-links-per-source", "peer", K_U32, OFF(peer_links_per_source), 1, 1u << 20, true,
	  "N", "of those, from one address (default 8)" },
	{ "peer-connect-waits-max", "peer", K_U32, OFF(peer_connect_waits_max), 1, 1u << 24, true,
	  "N", "peers' connects waiting for a listener, all links together (default 4096)" },
	{ "peer-connect-waits-per-peer", "peer", K_U32, OFF(peer_connect_waits_per_peer), 0,
	  1u << 24, true, "N", "of those, one peer's, all its links together\n"
	  "                            (0: a quarter of peer-connect-waits-max; default 0)" },
	{ "peer-queue-bytes", "peer", K_SIZE64, OFF(peer_outq_max), MiB, UINT64_MAX, true, "BYTES",
	  "control bytes queued towards a peer daemon that does not read\n"
	  "                            before its link fails (default 256M)" },
	{ "peer-data-conns-max", "peer", K_U32, OFF(peer_data_conns_max), 1, 1u << 20, true, "N",
	  "data connections of all links together, two threads each (default 512)" },
};

/* Key of @o in the config file. */
static const char *ini_key(const struct opt *o)
{
	if (strcmp(o->section, "peer") == 0 && strncmp(o->name, "peer-", 5) == 0)
		return o->name + 5;
	return o->name;
}

/* The smallest file of a pipe ring (broker/pring.c: 8 chunks of 128 KiB and a header). */
#define PRING_FILE_MIN (1024ull << 10)

uint64_t tpd_config_fd_reserve(const struct tpd_config *c)
{
	return 256 + TPD_QUOTA_FDS_IN_FLIGHT + 3ull * c->sessions_max + 2ull * c->peer_links_max +
	       2ull * c->peer_data_conns_max + c->peer_pending_max +
	       c->pipe_ring_bytes_max / PRING_FILE_MIN;
}

/* The fds RLIMIT_NOFILE leaves for kept fds once tpd_config_fd_reserve() is set aside, and
 * that limit in @ret_nofile. */
static uint64_t fd_room(const struct tpd_config *c, uint64_t *ret_nofile)
{
	struct rlimit rl;
	uint64_t nofile = UINT32_MAX, reserve = tpd_config_fd_reserve(c);

	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
		nofile = rl.rlim_cur;
	*ret_nofile = nofile;
	return nofile > reserve ? nofile - reserve : 0;
}

/* The daemon-wide bound in force: kept-fds-max, or what RLIMIT_NOFILE leaves (fd_room()). */
static void set_kept_fds_cap(struct tpd_config *c)
{
	uint64_t nofile, room = fd_room(c, &nofile);

	if (room > 1u << 24)
		room = 1u << 24;
	c->kept_fds_cap = c->kept_fds_max ? c->kept_fds_max : (uint32_t)room;
}

void tpd_config_defaults(struct tpd_config *c)
{
	memset(c, 0, sizeof(*c));
	c->log_level = TPU_LOG_INFO;
	c->copy_threads = 2;
	tpw_limits_default(&c->wire);
	c->sessions_max = 1024;
	c->sessions_per_uid = 128;
	c->sessions_reserved = 8;
	c->hello_timeout_ms = 5000;
	c->hello_frame_max = 4096;
	c->input_bytes_per_uid = 64ull << 20;
	c->input_bytes_max = 512ull << 20;
	c->outq_per_uid = 1ull << 30;
	c->outq_total = 4ull << 30;
	c->pipes_max = 4096;
	c->pipe_queue_max = 4096;
	c->pipe_queue_bytes = 64ull << 20;
	c->pipe_queue_bytes_total = 2ull << 30;
	c->buffers_max = 1024;
	c->buffer_bytes_max = 64ull << 30;
	c->buffer_bytes_per_uid = 256ull << 30;
	c->kept_fds_per_uid = 1024;
	c->waits_per_uid = 4096;
	c->bcast_pipes_max = 1024;
	c->bcast_stage_bytes_per_uid = 1ull << 30;
	c->pipe_ring = true;
	c->pipe_ring_min = 64u << 10; /* every rendezvous message (eager ends at 64 KiB) */
	c->pipe_ring_bytes_max = 512ull << 20;  /* 511 rings of 1 MiB + 4 KiB */
	c->pipe_ring_bytes_per_uid = 128ull << 20; /* 127 */
	c->outq_max = 256ull << 20;
	c->listeners_max = 256;
	c->cuda_holds_max = TPD_DEVMEM_HOLDS;
	c->cuda_dmabufs_max = TPD_DEVMEM_DMABUFS;
	c->groups_per_uid = 16;
	c->group_members_max = 256;
	c->group_peer_groups_max = 64;
	c->group_bytes_per_uid = 1ull << 30;
	c->group_chunk = 1u << 20;
	c->chans_per_uid = 64;
	c->chan_items_max = 4096;
	c->chan_bytes_max = 64ull << 20;
	c->chan_bytes_per_uid = 256ull << 20;
	c->wqs_per_uid = 64;
	c->wq_questions_max = 4096;
	c->wq_bytes_max = 64ull << 20;
	c->wq_answer_bytes_max = 64ull << 20;
	c->chan_peer_ops_max = 1024;
	c->chan_peer_bytes_max = 1ull << 30;
	c->chan_remote_create_per_peer = 16;
	c->chan_remote_bytes_per_peer = 64ull << 20;
	c->drain_ms = 5000;
	c->rdma_cache = 4ull << 30;
	c->rdma_gid_index = UINT32_MAX; /* auto */
	c->rdma_timeout = 14;
	c->rdma_retry = 7;
	c->rdma_rebuild_ms = 1000;
	c->rdma_rebuild_max = 5;
	c->ring_max = 4u << 20;
	c->spin_us = 100;
	snprintf(c->peer_listen, sizeof(c->peer_listen), "*:7420");
	c->peer_port = 7420;
	c->peer_data_conns = 4;
	c->peer_data_encryption = true;
	c->peer_connect_timeout_ms = 5000;
	c->peer_timeout_ms = 6000;
	c->peer_chunk = 1u << 20;
	c->peer_send_size = 60u << 10;
	c->peer_pending_max = 128;
	c->peer_pending_per_source = 32;
	c->peer_links_max = 128;
	c->peer_links_per_source = 8;
	c->peer_data_conns_max = 512;
	c->peer_outq_max = 256ull << 20;
	c->peer_connect_waits_max = 4096;
	snprintf(c->config_path, sizeof(c->config_path), "%s", TPD_CONFIG_DEFAULT_PATH);
	set_kept_fds_cap(c);
}

static const struct opt *find_opt(const char *section, const char *name)
{
	for (size_t i = 0; i < TPU_ARRAY_SIZE(opts); i++)
		if (strcmp(ini_key(&opts[i]), name) == 0 &&
		    (!section || strcmp(opts[i].section, section) == 0))
			return &opts[i];
	return NULL;
}

static int parse_bool(const char *v, bool *ret)
{
	static const char *yes[] = { "1", "yes", "true", "on" }, *no[] = { "0", "no", "false", "off" };

	for (size_t i = 0; i < 4; i++) {
		if (strcasecmp(v, yes[i]) == 0) {
			*ret = true;
			return 0;
		}
		if (strcasecmp(v, no[i]) == 0) {
			*ret = false;
			return 0;
		}
	}
	return -EINVAL;
}

static int parse_number(const struct opt *o, const char *v, uint64_t *ret, char *err, size_t el)
{
	uint64_t n;
	bool sized = o->kind == K_SIZE32 || o->kind == K_SIZE64;
	int r = tpu_parse_size(v, &n);

	if (r == 0 && !sized && strspn(v, "0123456789") != strlen(v))
		r = -EINVAL;
	if (r < 0 || n < o->min || n > o->max) {
		snprintf(err, el, "%s: '%s' is not %s in [%llu, %llu]", o->name, v,
			 sized ? "a size" : "a number", (unsigned long long)o->min,
			 (unsigned long long)o->max);
		return -EINVAL;
	}
	*ret = n;
	return 0;
}

/* Applies value @v to option @o of @c. */
/* A host name a peer may be told: letters, digits, '-', '.' and '_', not empty. */
static bool host_name_ok(const char *v)
{
	if (!*v)
		return false;
	for (; *v; v++)
		if (!((*v >= 'a' && *v <= 'z') || (*v >= 'A' && *v <= 'Z') ||
		      (*v >= '0' && *v <= '9') || *v == '-' || *v == '.' || *v == '_'))
			return false;
	return true;
}

static int set_opt(struct tpd_config *c, const struct opt *o, const char *v, char *err, size_t el)
{
	char *field = (char *)c + o->off;
	uint64_t n;
	bool b;

	switch (o->kind) {
	case K_PATH:
	case K_STR: {
		size_t cap = (size_t)o->max;
		char bad[64];
		if (o->off == OFF(backend_priority) && tpb_priority_check(v, bad, sizeof(bad)) < 0) {
			snprintf(err, el, "%s: unknown channel '%s'", o->name, bad);
			return -EINVAL;
		}
		if (strlen(v) >= cap) {
			snprintf(err, el, "%s: value longer than %zu bytes", o->name, cap - 1);
			return -EINVAL;
		}
		if (o->off == OFF(peer_listen) && tpd_addr_peer_listen_check(v) < 0) {
			snprintf(err, el, "%s: '%s' is not ADDR:PORT, *:PORT, [V6ADDR]:PORT or off",
				 o->name, v);
			return -EINVAL;
		}
		if (o->off == OFF(peer_host_name) && !host_name_ok(v)) {
			snprintf(err, el, "%s: '%s' is not a host name (letters, digits, '-', '.' "
				 "and '_')", o->name, v);
			return -EINVAL;
		}
		/* loopback or not: check_metrics(), once every setting is known */
		if (o->off == OFF(metrics_listen) && v[0] &&
		    tpd_addr_metrics_listen_check(v, true) < 0) {
			snprintf(err, el, "%s: '%s' is not ADDR:PORT (127.0.0.1:PORT, [::1]:PORT, "
				 "localhost:PORT, port 1 to 65535)", o->name, v);
			return -EINVAL;
		}
		if (o->off == OFF(metrics_listen))
			c->metrics_listen_line = 0; /* a flag; the file's handler sets its line */
		memcpy(field, v, strlen(v) + 1);
		return 0;
	}
	case K_LOG:
		if (tpu_log_parse_level(v, (enum tpu_log_level *)field) < 0) {
			snprintf(err, el, "%s: unknown level '%s'", o->name, v);
			return -EINVAL;
		}
		return 0;
	case K_BOOL:
	case K_NOBOOL:
	case K_FLAG:
		if (parse_bool(v, &b) < 0) {
			snprintf(err, el, "%s: '%s' is not yes or no", o->name, v);
			return -EINVAL;
		}
		*(bool *)field = o->kind == K_NOBOOL ? !b : b;
		return 0;
	default:
		if (parse_number(o, v, &n, err, el) < 0)
			return -EINVAL;
		if (o->kind == K_U32 || o->kind == K_SIZE32)
			*(uint32_t *)field = (uint32_t)n;
		else
			*(uint64_t *)field = n;
		return 0;
	}
}

struct ini_ctx {
	struct tpd_config *c;
	FILE *f;
	int line;     /* of the line inih is handling: counted by ini_read_line() */
	int err_line; /* of the first value error */
	char err[256];
	bool failed;
};

/* inih reads through this, so the handler knows which line it is looking at. */
static char *ini_read_line(char *buf, int size, void *stream)
{
	struct ini_ctx *x = stream;
	char *r = fgets(buf, size, x->f);

	if (r)
		x->line++;
	return r;
}

static int ini_on_value(void *user, const char *section, const char *name, const char *value)
{
	struct ini_ctx *x = user;
	const struct opt *o = find_opt(section, name);

	if (x->failed)
		return 1; /* keep the first error */
	x->err_line = x->line;
	if (!o && !*section) {
		snprintf(x->err, sizeof(x->err), "key '%s' before any [section]", name);
		x->failed = true;
		return 0;
	}
	if (!o) {
		if (find_opt(NULL, name))
			snprintf(x->err, sizeof(x->err), "key '%s' belongs in section [%s], not [%s]",
				 name, find_opt(NULL, name)->section, section);
		else
			snprintf(x->err, sizeof(x->err), "unknown key '%s' in section [%s]", name,
				 section);
		x->failed = true;
		return 0;
	}
	if (set_opt(x->c, o, value, x->err, sizeof(x->err)) < 0) {
		x->failed = true;
		return 0;
	}
	if (o->off == OFF(metrics_listen))
		x->c->metrics_listen_line = x->line;
	return 1;
}

static int load_file(struct tpd_config *c, char *err, size_t el)
{
	struct ini_ctx x = { .c = c };
	int line;

	x.f = fopen(c->config_path, "re");
	if (!x.f) {
		int r = -errno;
		if (r == -ENOENT && !c->config_explicit)
			return 0; /* no file: defaults and flags */
		snprintf(err, el, "%s: %s", c->config_path, strerror(-r));
		return r;
	}
	line = ini_parse_stream(ini_read_line, &x, ini_on_value, &x);
	fclose(x.f);
	if (line == 0)
		return 0;
	/* inih reports the first bad line; it is ours only if the handler failed there. */
	if (x.failed && x.err_line == line)
		snprintf(err, el, "%s:%d: %s", c->config_path, line, x.err);
	else
		snprintf(err, el, "%s:%d: syntax error (expected [section] or key = value)",
			 c->config_path, line);
	return -EINVAL;
}

enum { OPT_CONFIG = 1000, OPT_CHECK, OPT_NO_CMA, OPT_NO_SHM, OPT_NO_RDMA, OPT_VERSION, OPT_HELP };
/* getopt_long() value of opts[i]: i + OPT_TABLE, never '?' (63) or ':' (58) however long the
 * table grows */
#define OPT_TABLE 2000

static void build_longopts(struct option *lo)
{
	size_t n = 0;

	for (size_t i = 0; i < TPU_ARRAY_SIZE(opts); i++)
		if (opts[i].kind != K_NOBOOL)
			lo[n++] = (struct option){ opts[i].name,
						   opts[i].kind == K_FLAG ? no_argument
									  : required_argument,
						   NULL, OPT_TABLE + (int)i };
	lo[n++] = (struct option){ "config", required_argument, NULL, OPT_CONFIG };
	lo[n++] = (struct option){ "check-config", no_argument, NULL, OPT_CHECK };
	lo[n++] = (struct option){ "no-cma", no_argument, NULL, OPT_NO_CMA };
	lo[n++] = (struct option){ "no-shm", no_argument, NULL, OPT_NO_SHM };
	lo[n++] = (struct option){ "no-rdma", no_argument, NULL, OPT_NO_RDMA };
	lo[n++] = (struct option){ "version", no_argument, NULL, OPT_VERSION };
	lo[n++] = (struct option){ "help", no_argument, NULL, OPT_HELP };
	lo[n] = (struct option){ 0 };
}

static void usage(FILE *f)
{
	fprintf(f, "Usage: tpipd [OPTIONS]\n"
		   "Move tensors between processes through a per-host daemon.\n\n"
		   "  --config PATH             configuration file (default %s;\n"
		   "                            a missing default file is not an error)\n"
		   "  --check-config            check the configuration, print it, and exit\n",
		TPD_CONFIG_DEFAULT_PATH);
	for (size_t i = 0; i < TPU_ARRAY_SIZE(opts); i++) {
		char left[64];
		if (opts[i].kind == K_NOBOOL)
			snprintf(left, sizeof(left), "--no-%s", opts[i].name);
		else if (opts[i].kind == K_FLAG)
			snprintf(left, sizeof(left), "--%s", opts[i].name);
		else
			snprintf(left, sizeof(left), "--%s %s", opts[i].name, opts[i].arg);
		fprintf(f, "  %-25s %s\n", left, opts[i].help);
	}
	fprintf(f, "  --version                 print the version and exit\n"
		   "  --help                    print this help and exit\n\n"
		   "Every option can also be set in the file as 'name = value' in its section.\n");
}

/* Runs getopt over the saved argv; @pass 0 finds --config etc., pass 1 applies flags. */
static int scan_flags(struct tpd_config *c, int pass, char *err, size_t el)
{
	struct option lo[TPU_ARRAY_SIZE(opts) + 8]; /* the extra flags below, and the end */
	int opt;

	build_longopts(lo);
	optind = 0;
	opterr = pass == 0;
	while ((opt = getopt_long(c->argc, c->argv, "", lo, NULL)) != -1) {
		if (opt == '?') {
			snprintf(err, el, "unknown or incomplete option (see --help)");
			return -EINVAL;
		}
		if (pass == 0) {
			if (opt == OPT_HELP) {
				usage(stdout);
				return 1;
			}
			if (opt == OPT_VERSION) {
				printf("tpipd %s\n", TP_VERSION);
				return 1;
			}
			if (opt == OPT_CHECK)
				c->check_only = true;
			if (opt == OPT_CONFIG) {
				snprintf(c->config_path, sizeof(c->config_path), "%s", optarg);
				c->config_explicit = true;
			}
			continue;
		}
		if (opt == OPT_NO_CMA)
			c->no_cma = true;
		else if (opt == OPT_NO_SHM)
			c->no_shm = true;
		else if (opt == OPT_NO_RDMA)
			c->no_rdma = true;
		else if (opt >= OPT_TABLE && (size_t)(opt - OPT_TABLE) < TPU_ARRAY_SIZE(opts)) {
			char e[200];
			if (set_opt(c, &opts[opt - OPT_TABLE], optarg ? optarg : "yes", e,
				    sizeof(e)) < 0) {
				snprintf(err, el, "--%s", e);
				return -EINVAL;
			}
		}
	}
	if (optind < c->argc) {
		snprintf(err, el, "unexpected argument '%s'", c->argv[optind]);
		return -EINVAL;
	}
	return 0;
}

/* A non-loopback metrics-listen needs metrics-allow-remote, wherever each was set. */
static int check_metrics(const struct tpd_config *c, char *err, size_t el)
{
	char where[PATH_MAX + 16] = "--";

	if (!c->metrics_listen[0] || tpd_addr_metrics_listen_check(c->metrics_listen,
								    c->metrics_allow_remote) == 0)
		return 0;
	if (c->metrics_listen_line > 0)
		snprintf(where, sizeof(where), "%s:%d: ", c->config_path, c->metrics_listen_line);
	snprintf(err, el, "%smetrics-listen: '%s' is not a loopback ADDR:PORT (127.0.0.1:PORT, "
		 "[::1]:PORT or localhost:PORT); set metrics-allow-remote = yes in [daemon] or "
		 "--metrics-allow-remote to serve metrics to other hosts", where,
		 c->metrics_listen);
	return -EINVAL;
}


/* An explicit kept-fds-max must fit what RLIMIT_NOFILE leaves. */
static int check_kept_fds(const struct tpd_config *c, char *err, size_t el)
{
	uint64_t nofile, room = fd_room(c, &nofile);

	if (!c->kept_fds_max || c->kept_fds_max <= room)
		return 0;
	snprintf(err, el, "kept-fds-max: %u fds do not fit RLIMIT_NOFILE %llu, which leaves %llu "
		 "once %llu are set aside for sessions, peer links and rings (sessions-max, "
		 "peer-links-max, peer-data-conns-max, peer-pending-max, pipe-ring-bytes-max); "
		 "raise the limit (LimitNOFILE=) or lower kept-fds-max, or set it to 0 to derive it",
		 c->kept_fds_max, (unsigned long long)nofile, (unsigned long long)room,
		 (unsigned long long)tpd_config_fd_reserve(c));
	return -EINVAL;
}

static void finish(struct tpd_config *c)
{
	set_kept_fds_cap(c);
	if ((uint64_t)c->wire.inline_max + 65536 > c->wire.frame_max)
		c->wire.inline_max = c->wire.frame_max > 65536 ? c->wire.frame_max - 65536 : 0;
}

int tpd_config_load(struct tpd_config *c, int argc, char **argv, char *err, size_t el)
{
	int r;

	c->argc = argc;
	c->argv = argv;
	r = scan_flags(c, 0, err, el);
	if (r != 0)
		return r;
	r = load_file(c, err, el);
	if (r < 0)
		return r;
	r = scan_flags(c, 1, err, el);
	if (r == 0)
		r = check_metrics(c, err, el);
	if (r == 0)
		r = check_kept_fds(c, err, el);
	if (r < 0)
		return r;
	finish(c);
	return 0;
}

int tpd_config_reload(const struct tpd_config *old, struct tpd_config *ret, char *err,
		      size_t el)
{
	struct tpd_config c;
	int r;

	tpd_config_defaults(&c);
	memcpy(c.config_path, old->config_path, sizeof(c.config_path));
	c.config_explicit = old->config_explicit;
	c.argc = old->argc;
	c.argv = old->argv;
	r = load_file(&c, err, el);
	if (r == 0)
		r = scan_flags(&c, 1, err, el);
	if (r == 0)
		r = check_metrics(&c, err, el);
	if (r == 0)
		r = check_kept_fds(&c, err, el);
	if (r < 0)
		return r;
	finish(&c);
	*ret = c;
	return 0;
}

static size_t opt_size(const struct opt *o)
{
	switch (o->kind) {
	case K_PATH:
	case K_STR:
		return (size_t)o->max;
	case K_LOG:
		return sizeof(enum tpu_log_level);
	case K_BOOL:
	case K_NOBOOL:
	case K_FLAG:
		return sizeof(bool);
	case K_U32:
	case K_SIZE32:
		return sizeof(uint32_t);
	default:
		return sizeof(uint64_t);
	}
}

int tpd_config_diff(const struct tpd_config *old, const struct tpd_config *new,
		    struct tpd_config *live, char *restart, size_t rl)
{
	size_t off = 0;
	int changed = 0;

	*live = *old;
	restart[0] = '\0';
	for (size_t i = 0; i < TPU_ARRAY_SIZE(opts); i++) {
		const struct opt *o = &opts[i];
		size_t sz = opt_size(o);
		if (memcmp((const char *)old + o->off, (const char *)new + o->off, sz) == 0)
			continue;
		changed++;
		if (o->live)
			memcpy((char *)live + o->off, (const char *)new + o->off, sz);
		else if (off < rl)
			off += snprintf(restart + off, rl - off, "%s%s", off ? ", " : "", o->name);
	}
	finish(live);
	return changed;
}

void tpd_config_dump(const struct tpd_config *c, void *fp)
{
	FILE *f = fp;
	const char *section = "";

	for (size_t i = 0; i < TPU_ARRAY_SIZE(opts); i++) {
		const struct opt *o = &opts[i];
		const char *field = (const char *)c + o->off;
		if (strcmp(section, o->section) != 0) {
			fprintf(f, "%s[%s]\n", *section ? "\n" : "", o->section);
			section = o->section;
		}
		switch (o->kind) {
		case K_PATH:
		case K_STR:
			fprintf(f, "%s = %s\n", ini_key(o), field);
			break;
		case K_LOG: {
			static const char *names[] = { "emerg", "alert", "crit", "err", "warning",
						       "notice", "info", "debug" };
			fprintf(f, "%s = %s\n", o->name, names[*(const enum tpu_log_level *)field & 7]);
			break;
		}
		case K_BOOL:
		case K_NOBOOL:
		case K_FLAG: {
			bool b = *(const bool *)field;
			fprintf(f, "%s = %s\n", ini_key(o), (o->kind == K_NOBOOL ? !b : b) ? "yes" : "no");
			break;
		}
		case K_U32:
		case K_SIZE32:
			fprintf(f, "%s = %u\n", ini_key(o), *(const uint32_t *)field);
			break;
		default:
			fprintf(f, "%s = %llu\n", ini_key(o),
				(unsigned long long)*(const uint64_t *)field);
		}
	}
}
