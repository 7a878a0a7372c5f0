/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The peer part as a whole, as opposed to one link (peer.c): its state (struct tpd_peers, made
 * and freed by the daemon) and what the rest of the daemon reads of it, starting it (the key
 * file, the TLS context, the host identity, the peer listener) and stopping it (every link told
 * goodbye and failed, the listener and pending connections closed, the keys dropped), how links
 * authenticate, and the tpipctl snapshot of every link. Everything here runs on the loop thread.
 */
#include <event2/event.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "core.h"
#include "hmap.h"
#include "log.h"
#include "peer.h"
#include "peer_int.h"
#include "peerauth.h"
#include "peertls.h"
#include "stripe.h"

/* ---- the part's state ---------------------------------------------------------------------- */

int tpd_peers_new(struct tpd_daemon *d, struct tpd_peers **ret)
{
	struct tpd_peers *ps = calloc(1, sizeof(*ps));

	if (!ps)
		return -ENOMEM;
	ps->d = d;
	ps->cfg = tpd_daemon_cfg(d);
	ps->base = tpd_daemon_base(d);
	ps->limits = tpd_daemon_limits(d);
	tpu_list_init(&ps->links);
	tpu_list_init(&ps->flushq);
	tpu_list_init(&ps->conns);
	tpu_list_init(&ps->data_dials);
	ps->listen_fd = -EBADF;
	*ret = ps;
	return 0;
}

static void peers_stop(struct tpd_peers *ps);

void tpd_peers_free(struct tpd_peers *ps)
{
	if (!ps)
		return;
	peers_stop(ps);
	if (ps->ev_accept_resume)
		event_free(ps->ev_accept_resume);
	tpd_peer_dial_dns_free(ps);
	free(ps);
}

unsigned tpd_peers_count(const struct tpd_daemon *d)
{
	const struct tpd_peers *ps = tpd_daemon_peers(d);

	return ps ? ps->n_links : 0;
}

unsigned tpd_peers_pending(const struct tpd_daemon *d, unsigned *ret_dials)
{
	const struct tpd_peers *ps = tpd_daemon_peers(d);
	const struct tpu_list *n;
	unsigned conns = 0, dials = 0;

	if (ps) {
		for (n = ps->conns.next; n != &ps->conns; n = n->next)
			conns++;
		for (n = ps->data_dials.next; n != &ps->data_dials; n = n->next)
			dials++;
	}
	*ret_dials = dials;
	return conns;
}

const char *tpd_peers_listen_addr(const struct tpd_daemon *d)
{
	const struct tpd_peers *ps = tpd_daemon_peers(d);

	return ps ? ps->listen_addr : "";
}

uint16_t tpd_peers_port(const struct tpd_daemon *d)
{
	const struct tpd_peers *ps = tpd_daemon_peers(d);

	return ps ? ps->port_bound : 0;
}

const char *tpd_peers_hostname(const struct tpd_daemon *d)
{
	const struct tpd_peers *ps = tpd_daemon_peers(d);

	return ps ? ps->hostname : "";
}

const char *tpd_peers_host_id(const struct tpd_daemon *d)
{
	const struct tpd_peers *ps = tpd_daemon_peers(d);

	return ps ? ps->boot_id_hex : "";
}

/* ---- start and stop ------------------------------------------------------------------------ */

int tpd_peers_start(struct tpd_daemon *d)
{
	struct tpd_peers *ps = tpd_daemon_peers(d);
	const struct tpd_config *c = ps->cfg;
	char why[300] = "";
	int r;

	if (c->peer_host_name[0])
		snprintf(ps->hostname, sizeof(ps->hostname), "%s", c->peer_host_name);
	else if (gethostname(ps->hostname, sizeof(ps->hostname) - 1) < 0)
		snprintf(ps->hostname, sizeof(ps->hostname), "unknown");
	r = tpd_peerauth_boot_id(ps->boot_id);
	if (r < 0)
		tpu_log_warn("cannot read the boot id (%s): same-host peers are not recognised",
			     strerror(-r));
	for (size_t i = 0; i < sizeof(ps->boot_id); i++)
		snprintf(ps->boot_id_hex + 2 * i, 3, "%02x", ps->boot_id[i]);
	r = tpd_peerauth_instance(&ps->instance);
	if (r < 0)
		return r;
	if (c->peer_insecure && (c->peer_key_file[0] || c->peer_cert[0])) {
		tpu_log_err("peer-insecure is set together with peer authentication (peer-key-file "
			    "or peer-cert): choose one");
		return -EINVAL;
	}
	if (c->peer_key_file[0]) {
		r = tpd_peerauth_key_load(c->peer_key_file, &ps->key, why, sizeof(why));
		if (r < 0) {
			tpu_log_err("peer key file: %s", why);
			return r;
		}
		ps->keyed = true;
	}
	if (ps->keyed || c->peer_cert[0] || c->peer_cert_key[0] || c->peer_ca[0]) {
		const struct tpd_peertls_config tc = { .key = ps->keyed ? &ps->key : NULL,
						       .cert = c->peer_cert,
						       .cert_key = c->peer_cert_key,
						       .ca = c->peer_ca };
		r = tpd_peertls_new(&tc, &ps->tls, why, sizeof(why));
		if (r < 0) {
			tpu_log_err("peer authentication: %s", why);
			return r;
		}
	}
	if (strcmp(c->peer_listen, "off") == 0 || !c->peer_listen[0])
		return 0;
	if (!ps->tls && !c->peer_insecure) {
		tpu_log_notice("peer listener on %s not opened: no peer authentication is configured, "
			       "and this daemon never listens on the network without it. To peer "
			       "with other hosts give every daemon the same key (head -c 32 "
			       "/dev/urandom | base64 > /etc/tpipd/peer.key; chmod 600; [peer] "
			       "key-file = /etc/tpipd/peer.key) or certificates from a cluster CA "
			       "([peer] cert, cert-key, ca); see tpipd(8)",
			       c->peer_listen);
		return 0;
	}
	if (c->peer_insecure)
		tpu_log_warn("peer links are INSECURE (--peer-insecure): no authentication and no "
			     "encryption; any host that reaches the peer port can open pipes as a "
			     "peer daemon. Use it on isolated test fabrics only");
	r = tpd_peerlisten_open(ps, c->peer_listen);
	if (r < 0 && r != -EINVAL && strcmp(c->peer_listen, "*:7420") == 0) {
		tpu_log_warn("peer listener on %s: %s; cross-host pipes can still be dialled from "
			     "here, but other hosts cannot reach this daemon",
			     c->peer_listen, strerror(-r));
		return 0;
	}
	if (r < 0 && r != -EINVAL)
		tpu_log_err("peer listener on %s: %s", c->peer_listen, strerror(-r));
	return r;
}

/* Tells the peer that every pipe over @pr ends because this daemon stops, and pushes it out. */
static void say_goodbye(struct tpd_peer *pr)
{
	Tpw__V1__PeerPipeClose pc = TPW__V1__PEER_PIPE_CLOSE__INIT;
	Tpw__V1__PeerMsg m = TPW__V1__PEER_MSG__INIT;
	size_t i = 0;
	uint64_t key;
	void *val;

	pc.status = TPW__V1__STATUS__STATUS_SHUTDOWN;
	pc.message = "the peer daemon is stopping";
	m.body_case = TPW__V1__PEER_MSG__BODY_PIPE_CLOSE;
	m.pipe_close = &pc;
	while (tpu_hmap_next(&pr->pipes, &i, &key, &val)) {
		pc.pipe_id = tpd_peer_pipe_ops()->remote_id(val);
		if (!pc.pipe_id)
			continue;
		tpd_peer_send_now(pr, &m);
	}
}

/* Stops @ps (see tpd_peers_stop()); again, it finds nothing left to stop. */
static void peers_stop(struct tpd_peers *ps)
{
	struct tpd_peer *pr, *tmp;
	struct peer_conn *c, *ctmp;

	tpu_list_for_each_safe(pr, tmp, &ps->links, node) {
		if (pr->state == PEER_UP)
			say_goodbye(pr);
		if (pr->state != PEER_FAILED) {
			snprintf(pr->last_error, sizeof(pr->last_error), "daemon stopping");
			pr->fail_err = -ESHUTDOWN;
		}
		pr->state = PEER_FAILED;
		tpd_peer_teardown(pr);
	}
	tpu_list_for_each_safe(c, ctmp, &ps->conns, node)
		tpd_peerlisten_conn_free(c);
	while (!tpu_list_empty(&ps->data_dials))
		tpd_peerhs_data_dial_free(tpu_list_first(&ps->data_dials, struct data_dial, node));
	if (ps->ev_accept)
		event_free(ps->ev_accept);
	ps->ev_accept = NULL;
	tpu_close(ps->listen_fd);
	ps->listen_fd = -EBADF;
	if (ps->keyed)
		tpd_peerauth_key_done(&ps->key);
	ps->keyed = false;
	tpd_peertls_free(ps->tls);
	ps->tls = NULL;
}

void tpd_peers_stop(struct tpd_daemon *d)
{
	struct tpd_peers *ps = tpd_daemon_peers(d);

	if (ps)
		peers_stop(ps);
}

/* ---- tpipctl ------------------------------------------------------------------------------- */

const char *tpd_peers_auth(const struct tpd_daemon *d)
{
	const struct tpd_peers *ps = tpd_daemon_peers(d);
	const struct tpd_config *cfg = ps->cfg;
	static const char *const names[2][3] = {
		{ "tls: psk", "tls: certificates", "tls: psk, certificates" },
		{ "tls: psk, data plaintext", "tls: certificates, data plaintext",
		  "tls: psk, certificates, data plaintext" },
	};
	const struct tpd_peertls *t = ps->tls;

	if (!t)
		return cfg->peer_insecure ? "insecure" : "none";
	return names[!cfg->peer_data_encryption][t->psk && t->certs ? 2 : t->certs ? 1 : 0];
}

/* How @pr is protected, for tpipctl (see CtlPeer.security). */
/* The link's RDMA state and bytes, from its rdma endpoint (tpb_ep_query()): "" and zeros
 * without one. */
static void peer_rdma_info(struct tpd_peer *pr, Tpw__V1__CtlPeer *e)
{
	struct tpb_ep_info info = { .state = "" };
	struct tpb_ep *ep = tpd_peer_ep(pr, tpb_index("rdma"));

	if (ep)
		(void)tpb_ep_query(ep, &info);
	e->rdma = (char *)info.state;
	e->rdma_bytes_sent = info.sent;
	e->rdma_bytes_received = info.received;
	e->rdma_reg_client_dmabuf = info.reg_client_dmabuf;
	e->rdma_reg_dmabuf = info.reg_dmabuf;
	e->rdma_reg_addr = info.reg_addr;
}

static const char *peer_security(const struct tpd_peer *pr)
{
	if (!pr->ssl)
		return pr->state == PEER_CONNECTING || pr->state == PEER_TLS ? "" : "insecure";
	if (pr->data_prot && strcmp(pr->data_prot, "plaintext") == 0)
		return "tls, data plaintext";
	if (pr->data_prot && strncmp(pr->data_prot, "kTLS", 4) == 0)
		return "tls, data kTLS";
	return "tls";
}

int tpd_peers_ctl(struct tpd_daemon *d, Tpw__V1__CtlPeer ***ret, size_t *n)
{
	struct tpd_peers *ps = tpd_daemon_peers(d);
	Tpw__V1__CtlPeer **v = calloc(ps->n_links + 1, sizeof(*v));
	struct tpd_peer *pr;
	size_t k = 0;
	uint64_t now = tpu_now_ns();

	if (!v)
		return -ENOMEM;
	tpu_list_for_each(pr, &ps->links, node) {
		Tpw__V1__CtlPeer *e = calloc(1, sizeof(*e));
		if (!e || k >= ps->n_links) {
			free(e);
			break;
		}
		tpw__v1__ctl_peer__init(e);
		e->id = pr->id;
		e->address = pr->key;
		e->host = pr->host;
		e->state = (char *)tpd_peer_state_name(pr);
		e->outgoing = pr->outgoing;
		e->data_conns = pr->stripe ? tpb_stripe_conns(pr->stripe) : 0;
		e->rtt_us = pr->rtt_us;
		e->bytes_sent = pr->ctl_out + (pr->stripe ? tpb_stripe_bytes_sent(pr->stripe) : 0);
		e->bytes_received = pr->ctl_in +
				    (pr->stripe ? tpb_stripe_bytes_received(pr->stripe) : 0);
		peer_rdma_info(pr, e);
		e->bytes_sent += e->rdma_bytes_sent;
		e->bytes_received += e->rdma_bytes_received;
		e->pipes = (uint32_t)pr->pipes.len;
		e->last_error = pr->last_error;
		e->authenticated = pr->authenticated;
		e->identity = pr->identity;
		e->security = (char *)peer_security(pr);
		e->up_ms = pr->state == PEER_UP ? (now - pr->up_ns) / 1000000ull : 0;
		v[k++] = e;
	}
	*ret = v;
	*n = k;
	return 0;
}

void tpd_peers_ctl_free(Tpw__V1__CtlPeer **v, size_t n)
{
	for (size_t i = 0; i < n; i++)
		free(v[i]);
	free(v);
}
