/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * tpd_peertls: TLS 1.3 for peer links (OpenSSL 3). Builds the client and server contexts from the
 * daemon's authentication settings: an external pre-shared key derived from the key file
 * (identity "tpipd"), and/or mutual certificates under a cluster CA. Makes the SSL object of each
 * connection (a dialled one checks that the certificate names the host it dialled), names the
 * verified peer, derives the tokens that bind a data connection to its link's control session,
 * and says whether kTLS carries a connection. It does not own sockets, events or links: peer.c,
 * peerhs.c and peerlisten.c drive the handshakes; stripe_io.c moves bytes with SSL_read/_write.
 */
#ifndef TPD_PEERTLS_H
#define TPD_PEERTLS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <openssl/ssl.h>
#include "peerauth.h"

#define TPD_PEERTLS_PSK_LEN 32
#define TPD_PEERTLS_PSK_IDENTITY "tpipd"
#define TPD_PEERTLS_BIND_LEN 32

/* What authenticates peers; the paths are borrowed for tpd_peertls_new() only. */
struct tpd_peertls_config {
	const struct tpd_peer_key *key;	  /* NULL: no pre-shared key */
	const char *cert, *cert_key, *ca; /* "" or NULL: no certificates */
};

struct tpd_peertls {
	SSL_CTX *client, *server;
	bool psk, certs;
	uint8_t psk_key[TPD_PEERTLS_PSK_LEN];
};

/*
 * tpd_peertls_psk_derive() - the TLS external PSK for a key file's bytes: HKDF-SHA256 with the
 * salt "tpipd peer psk v1" and info "tls13 external psk", so any key of 16..4096 bytes gives a
 * uniform 32-byte PSK. Borrows @k.
 * Return: 0, -EINVAL for an empty key, -EIO (OpenSSL failed).
 */
int tpd_peertls_psk_derive(const struct tpd_peer_key *k, uint8_t out[TPD_PEERTLS_PSK_LEN]);

/*
 * tpd_peertls_new() - TLS 1.3-only client and server contexts for @cfg: a PSK when @cfg->key is
 * set, certificates when @cfg->cert is set (then @cfg->cert_key and @cfg->ca are required, the
 * key must match the certificate, and peers must present a certificate chaining to @cfg->ca).
 * No session tickets, kTLS allowed. Borrows @cfg.
 * @ret: returns owned contexts, free with tpd_peertls_free().
 * @why: on failure, a sentence for the log naming the setting that is wrong.
 * Return: 0; -EINVAL (neither configured, a certificate without key or CA, a key or CA without
 * certificate, key and certificate that do not match), -ENOENT/-EACCES/-EBADMSG (a file that
 * cannot be read or parsed), -ENOMEM, -EIO.
 */
int tpd_peertls_new(const struct tpd_peertls_config *cfg, struct tpd_peertls **ret, char *why,
		    size_t why_len);

/* Wipes the PSK and frees both contexts. Accepts NULL. */
void tpd_peertls_free(struct tpd_peertls *t);

/*
 * tpd_peertls_ssl_new() - an SSL object for one connection. A client (@host not NULL) that uses
 * certificates accepts only a certificate naming @host (DNS name or IP address). Borrows @t and
 * @host.
 * Return: owned SSL (SSL_free()), or NULL (out of memory).
 */
SSL *tpd_peertls_ssl_new(struct tpd_peertls *t, bool server, const char *host);

/*
 * tpd_peertls_identity() - the verified identity of the peer of handshaken @ssl into @buf:
 * "psk:tpipd", or "cert:" and the certificate's subject CN and first subject alternative name.
 * @ret_cert: set to whether a verified certificate authenticated the peer.
 */
void tpd_peertls_identity(SSL *ssl, char *buf, size_t len, bool *ret_cert);

/*
 * tpd_peertls_names_host() - whether the verified certificate of @ssl's peer names @host
 * (a DNS name or an IP address literal, as a dial would check it). False without a certificate.
 */
bool tpd_peertls_names_host(SSL *ssl, const char *host);

/*
 * tpd_peertls_link_key() - the secret a link's data connections prove: exported from the
 * control connection's session @ctl under the label "EXPORTER-tpipd-link" with @link_id (8 bytes
 * little endian) as context. Borrows @ctl.
 * Return: 0 or -EIO (the session is not established).
 */
int tpd_peertls_link_key(SSL *ctl, uint64_t link_id, uint8_t out[TPD_PEERTLS_BIND_LEN]);

/*
 * tpd_peertls_binding() - the token a data connection's dialler (@dialler true) or answerer
 * sends inside its own session @data: HMAC-SHA256(@link_key, role | index | exporter of @data
 * under "EXPORTER-tpipd-data"). It is worthless on another connection (another exporter) or
 * another link (another link key). Borrows both.
 * Return: 0 or -EIO.
 */
int tpd_peertls_binding(const uint8_t link_key[TPD_PEERTLS_BIND_LEN], SSL *data, unsigned index,
			bool dialler, uint8_t out[TPD_PEERTLS_BIND_LEN]);

/* Constant-time comparison of a received token (@got_len bytes) with @expected. */
bool tpd_peertls_binding_ok(const uint8_t expected[TPD_PEERTLS_BIND_LEN], const uint8_t *got,
			    size_t got_len);

/*
 * tpd_peertls_ktls() - how @ssl's records are protected: "kTLS" (kernel, both directions),
 * "kTLS send" / "kTLS receive" (one direction in the kernel), or "OpenSSL" (user space).
 */
const char *tpd_peertls_ktls(SSL *ssl);

/*
 * tpd_peertls_error() - the OpenSSL error queue (and @ssl's verify result when a certificate was
 * refused) as one line into @buf, clearing the queue; "connection closed" when empty.
 */
void tpd_peertls_error(SSL *ssl, char *buf, size_t len);

/*
 * tpd_peertls_step() - map the return @r of SSL_do_handshake/SSL_read_ex/SSL_write_ex on
 * non-blocking @ssl: 1 done, 0 wait for readability (*@want_write false) or writability (true),
 * < 0 failed (@why filled by tpd_peertls_error()).
 */
int tpd_peertls_step(SSL *ssl, int r, bool *want_write, char *why, size_t why_len);

#endif
