/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * TLS 1.3 contexts and per-connection helpers for peer links; see peertls.h. The PSK is an
 * external PSK (RFC 8446 section 4.2.11) offered and found through OpenSSL's session callbacks,
 * always with (EC)DHE so each session has forward secrecy; certificates are verified against the
 * configured CA only (never the system store). Nothing here logs: errors come back as -errno and
 * a sentence.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/kdf.h>
#include <openssl/x509v3.h>
#include "peertls.h"
#include "tpu.h"

#define PSK_SALT "tpipd peer psk v1"
#define PSK_INFO "tls13 external psk"
/* SHA-256 suites first: the PSK is bound to SHA-256, and AES-128-GCM is the fastest with AES-NI */
#define SUITES "TLS_AES_128_GCM_SHA256:TLS_CHACHA20_POLY1305_SHA256:TLS_AES_256_GCM_SHA384"

int tpd_peertls_psk_derive(const struct tpd_peer_key *k, uint8_t out[TPD_PEERTLS_PSK_LEN])
{
	EVP_KDF *kdf;
	EVP_KDF_CTX *ctx;
	OSSL_PARAM p[5];
	int r = -EIO;

	if (!k || !k->bytes || !k->len)
		return -EINVAL;
	kdf = EVP_KDF_fetch(NULL, "HKDF", NULL);
	ctx = kdf ? EVP_KDF_CTX_new(kdf) : NULL;
	p[0] = OSSL_PARAM_construct_utf8_string(OSSL_KDF_PARAM_DIGEST, (char *)"SHA256", 0);
	p[1] = OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_KEY, k->bytes, k->len);
	p[2] = OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_SALT, (char *)PSK_SALT,
						 strlen(PSK_SALT));
	p[3] = OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_INFO, (char *)PSK_INFO,
						 strlen(PSK_INFO));
	p[4] = OSSL_PARAM_construct_end();
	if (ctx && EVP_KDF_derive(ctx, out, TPD_PEERTLS_PSK_LEN, p) == 1)
		r = 0;
	EVP_KDF_CTX_free(ctx);
	EVP_KDF_free(kdf);
	return r;
}

/* ---- PSK callbacks ------------------------------------------------------------------------- */

/* A session carrying the PSK for a TLS_AES_128_GCM_SHA256 handshake, or NULL. */
static SSL_SESSION *psk_session(SSL *ssl, const struct tpd_peertls *t)
{
	static const unsigned char aes128gcm[2] = {0x13, 0x01};
	const SSL_CIPHER *c = SSL_CIPHER_find(ssl, aes128gcm);
	SSL_SESSION *s = c ? SSL_SESSION_new() : NULL;

	if (!s)
		return NULL;
	if (!SSL_SESSION_set1_master_key(s, t->psk_key, sizeof(t->psk_key)) ||
	    !SSL_SESSION_set_cipher(s, c) || !SSL_SESSION_set_protocol_version(s, TLS1_3_VERSION)) {
		SSL_SESSION_free(s);
		return NULL;
	}
	return s;
}

static int psk_use(SSL *ssl, const EVP_MD *md, const unsigned char **id, size_t *id_len,
		   SSL_SESSION **sess)
{
	const struct tpd_peertls *t = SSL_CTX_get_app_data(SSL_get_SSL_CTX(ssl));
	SSL_SESSION *s = psk_session(ssl, t);

	*sess = NULL;
	*id = NULL;
	*id_len = 0;
	if (!s)
		return 0;
	if (md && md != SSL_CIPHER_get_handshake_digest(SSL_SESSION_get0_cipher(s))) {
		SSL_SESSION_free(s); /* after a HelloRetryRequest for another hash: no PSK */
		return 1;
	}
	*sess = s;
	*id = (const unsigned char *)TPD_PEERTLS_PSK_IDENTITY;
	*id_len = strlen(TPD_PEERTLS_PSK_IDENTITY);
	return 1;
}

static int psk_find(SSL *ssl, const unsigned char *id, size_t id_len, SSL_SESSION **sess)
{
	const struct tpd_peertls *t = SSL_CTX_get_app_data(SSL_get_SSL_CTX(ssl));

	*sess = NULL;
	if (id_len != strlen(TPD_PEERTLS_PSK_IDENTITY) ||
	    memcmp(id, TPD_PEERTLS_PSK_IDENTITY, id_len) != 0)
		return 1; /* not ours: go on without a PSK */
	*sess = psk_session(ssl, t);
	return *sess ? 1 : 0;
}

/* ---- contexts ------------------------------------------------------------------------------ */

/* Checks that @path can be opened for reading. Return: 0 or -errno with @why filled. */
static int readable(const char *opt, const char *path, char *why, size_t wl)
{
	FILE *f = fopen(path, "re");

	if (f) {
		fclose(f);
		return 0;
	}
	snprintf(why, wl, "%s %s: %s", opt, path, strerror(errno));
	return -errno;
}

static int ctx_setup(struct tpd_peertls *t, const struct tpd_peertls_config *cfg, SSL_CTX *ctx,
		     bool server, char *why, size_t wl)
{
	char e[200];

	SSL_CTX_set_app_data(ctx, t);
	if (!SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION) ||
	    !SSL_CTX_set_max_proto_version(ctx, TLS1_3_VERSION) ||
	    !SSL_CTX_set_ciphersuites(ctx, SUITES)) {
		snprintf(why, wl, "TLS 1.3 is not available in this OpenSSL");
		return -EIO;
	}
	/* Each daemon dials its own links: no resumption, so no tickets after the handshake (a
	 * data connection with plaintext tensor bytes must have nothing of TLS left to read). */
	SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_OFF);
	SSL_CTX_set_num_tickets(ctx, 0);
	SSL_CTX_set_options(ctx, SSL_OP_NO_TICKET | SSL_OP_NO_RENEGOTIATION);
	SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
	if (t->psk) {
		if (server)
			SSL_CTX_set_psk_find_session_callback(ctx, psk_find);
		else
			SSL_CTX_set_psk_use_session_callback(ctx, psk_use);
	}
	/* A client always verifies: with a PSK only and no CA, a server that skips the PSK and
	 * shows a certificate fails here instead of being trusted. */
	SSL_CTX_set_verify(ctx,
			   server ? (t->certs ? SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT
					      : SSL_VERIFY_NONE)
				  : SSL_VERIFY_PEER,
			   NULL);
	if (!t->certs)
		return 0;
	if (SSL_CTX_use_certificate_chain_file(ctx, cfg->cert) != 1) {
		ERR_error_string_n(ERR_get_error(), e, sizeof(e));
		ERR_clear_error();
		snprintf(why, wl, "peer-cert %s: not a PEM certificate chain (%s)", cfg->cert, e);
		return -EBADMSG;
	}
	if (SSL_CTX_use_PrivateKey_file(ctx, cfg->cert_key, SSL_FILETYPE_PEM) != 1 &&
	    ERR_GET_REASON(ERR_peek_error()) != X509_R_KEY_VALUES_MISMATCH) {
		ERR_error_string_n(ERR_get_error(), e, sizeof(e));
		ERR_clear_error();
		snprintf(why, wl, "peer-cert-key %s: not a PEM private key (%s)", cfg->cert_key, e);
		return -EBADMSG;
	}
	if (ERR_peek_error() || SSL_CTX_check_private_key(ctx) != 1) {
		ERR_clear_error();
		snprintf(why, wl, "peer-cert-key %s does not match the certificate in peer-cert %s",
			 cfg->cert_key, cfg->cert);
		return -EINVAL;
	}
	if (SSL_CTX_load_verify_locations(ctx, cfg->ca, NULL) != 1) {
		ERR_error_string_n(ERR_get_error(), e, sizeof(e));
		ERR_clear_error();
		snprintf(why, wl, "peer-ca %s: no PEM CA certificate (%s)", cfg->ca, e);
		return -EBADMSG;
	}
	return 0;
}

static bool set(const char *s)
{
	return s && *s;
}

int tpd_peertls_new(const struct tpd_peertls_config *cfg, struct tpd_peertls **ret, char *why,
		    size_t wl)
{
	struct tpd_peertls *t;
	int r;

	if (set(cfg->cert) && !set(cfg->cert_key)) {
		snprintf(why, wl,
			 "peer-cert is set but peer-cert-key is not: give the certificate's "
			 "private key");
		return -EINVAL;
	}
	if (set(cfg->cert) && !set(cfg->ca)) {
		snprintf(why, wl,
			 "peer-cert is set but peer-ca is not: give the cluster CA that "
			 "signs every daemon's certificate");
		return -EINVAL;
	}
	if (!set(cfg->cert) && (set(cfg->cert_key) || set(cfg->ca))) {
		snprintf(why, wl, "peer-cert-key or peer-ca is set without peer-cert");
		return -EINVAL;
	}
	if (!cfg->key && !set(cfg->cert)) {
		snprintf(why, wl, "no peer authentication: set peer-key-file or peer-cert");
		return -EINVAL;
	}
	if (set(cfg->cert) && ((r = readable("peer-cert", cfg->cert, why, wl)) < 0 ||
			       (r = readable("peer-cert-key", cfg->cert_key, why, wl)) < 0 ||
			       (r = readable("peer-ca", cfg->ca, why, wl)) < 0))
		return r;
	t = calloc(1, sizeof(*t));
	if (!t)
		return -ENOMEM;
	t->certs = set(cfg->cert);
	t->psk = cfg->key != NULL;
	if (t->psk && (r = tpd_peertls_psk_derive(cfg->key, t->psk_key)) < 0) {
		snprintf(why, wl, "cannot derive the TLS key from the pre-shared key");
		goto fail;
	}
	t->client = SSL_CTX_new(TLS_client_method());
	t->server = SSL_CTX_new(TLS_server_method());
	if (!t->client || !t->server) {
		snprintf(why, wl, "out of memory");
		r = -ENOMEM;
		goto fail;
	}
	r = ctx_setup(t, cfg, t->client, false, why, wl);
	if (r == 0)
		r = ctx_setup(t, cfg, t->server, true, why, wl);
	if (r < 0)
		goto fail;
	*ret = t;
	return 0;
fail:
	tpd_peertls_free(t);
	return r;
}

void tpd_peertls_free(struct tpd_peertls *t)
{
	if (!t)
		return;
	SSL_CTX_free(t->client);
	SSL_CTX_free(t->server);
	OPENSSL_cleanse(t->psk_key, sizeof(t->psk_key));
	free(t);
}

/* ---- connections --------------------------------------------------------------------------- */

static bool inet_pton_any(const char *s, unsigned char a[16])
{
	return inet_pton(AF_INET, s, a) == 1 || inet_pton(AF_INET6, s, a) == 1;
}

static void inet_ntop_any(const unsigned char *a, size_t n, char *buf, size_t len)
{
	if (n == 4 || n == 16)
		inet_ntop(n == 4 ? AF_INET : AF_INET6, a, buf, (socklen_t)len);
}

/* @host without IPv6 brackets or zone into @buf. Return: whether it is an IP literal. */
static bool host_plain(const char *host, char *buf, size_t len)
{
	unsigned char a[16];
	size_t n;

	if (host[0] == '[')
		host++;
	snprintf(buf, len, "%s", host);
	n = strcspn(buf, "%]");
	buf[n] = '\0';
	return inet_pton_any(buf, a);
}

SSL *tpd_peertls_ssl_new(struct tpd_peertls *t, bool server, const char *host)
{
	SSL *ssl = SSL_new(server ? t->server : t->client);
	char h[256];

	if (!ssl || server || !host || !t->certs)
		return ssl;
	if (host_plain(host, h, sizeof(h))) {
		if (X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), h) == 1)
			return ssl;
	} else if (SSL_set1_host(ssl, h) == 1) {
		return ssl;
	}
	SSL_free(ssl);
	return NULL;
}

void tpd_peertls_identity(SSL *ssl, char *buf, size_t len, bool *ret_cert)
{
	X509 *x = SSL_get0_peer_certificate(ssl);
	GENERAL_NAMES *sans;
	char cn[128] = "", san[128] = "";

	*ret_cert = false;
	if (!x || SSL_get_verify_result(ssl) != X509_V_OK) {
		snprintf(buf, len, "psk:%s", TPD_PEERTLS_PSK_IDENTITY);
		return;
	}
	*ret_cert = true;
	X509_NAME_get_text_by_NID(X509_get_subject_name(x), NID_commonName, cn, sizeof(cn));
	sans = X509_get_ext_d2i(x, NID_subject_alt_name, NULL, NULL);
	for (int i = 0; sans && i < sk_GENERAL_NAME_num(sans) && !san[0]; i++) {
		const GENERAL_NAME *g = sk_GENERAL_NAME_value(sans, i);
		if (g->type == GEN_DNS) {
			snprintf(san, sizeof(san), "DNS:%.*s", ASN1_STRING_length(g->d.dNSName),
				 (const char *)ASN1_STRING_get0_data(g->d.dNSName));
		} else if (g->type == GEN_IPADD) {
			const ASN1_OCTET_STRING *ip = g->d.iPAddress;
			char txt[64] = "?";
			inet_ntop_any(ASN1_STRING_get0_data(ip), (size_t)ASN1_STRING_length(ip),
				      txt, sizeof(txt));
			snprintf(san, sizeof(san), "IP:%s", txt);
		}
	}
	GENERAL_NAMES_free(sans);
	snprintf(buf, len, "cert:CN=%s%s%s", cn, san[0] ? "," : "", san);
}

bool tpd_peertls_names_host(SSL *ssl, const char *host)
{
	X509 *x = SSL_get0_peer_certificate(ssl);
	char h[256];

	if (!x || SSL_get_verify_result(ssl) != X509_V_OK)
		return false;
	if (host_plain(host, h, sizeof(h)))
		return X509_check_ip_asc(x, h, 0) == 1;
	return X509_check_host(x, h, strlen(h), 0, NULL) == 1;
}

int tpd_peertls_link_key(SSL *ctl, uint64_t link_id, uint8_t out[TPD_PEERTLS_BIND_LEN])
{
	static const char label[] = "EXPORTER-tpipd-link";
	uint8_t ctx[8];

	for (int i = 0; i < 8; i++)
		ctx[i] = (uint8_t)(link_id >> (8 * i));
	return SSL_export_keying_material(ctl, out, TPD_PEERTLS_BIND_LEN, label, sizeof(label) - 1,
					  ctx, sizeof(ctx), 1) == 1
		   ? 0
		   : -EIO;
}

int tpd_peertls_binding(const uint8_t link_key[TPD_PEERTLS_BIND_LEN], SSL *data, unsigned index,
			bool dialler, uint8_t out[TPD_PEERTLS_BIND_LEN])
{
	static const char label[] = "EXPORTER-tpipd-data";
	const struct tpd_peer_key k = {.bytes = (uint8_t *)link_key, .len = TPD_PEERTLS_BIND_LEN};
	uint8_t ekm[32];
	int r;

	if (SSL_export_keying_material(data, ekm, sizeof(ekm), label, sizeof(label) - 1, NULL, 0,
				       0) != 1)
		return -EIO;
	r = tpd_peerauth_mac(&k, dialler ? "tpipd-data-dialler" : "tpipd-data-answerer", ekm,
			     sizeof(ekm), NULL, 0, index, out);
	OPENSSL_cleanse(ekm, sizeof(ekm));
	return r;
}

bool tpd_peertls_binding_ok(const uint8_t expected[TPD_PEERTLS_BIND_LEN], const uint8_t *got,
			    size_t got_len)
{
	return tpd_peerauth_mac_ok(expected, got, got_len);
}

const char *tpd_peertls_ktls(SSL *ssl)
{
	bool tx = BIO_get_ktls_send(SSL_get_wbio(ssl)) > 0;
	bool rx = BIO_get_ktls_recv(SSL_get_rbio(ssl)) > 0;

	return tx && rx ? "kTLS" : tx ? "kTLS send" : rx ? "kTLS receive" : "OpenSSL";
}

void tpd_peertls_error(SSL *ssl, char *buf, size_t len)
{
	unsigned long e;
	size_t n = 0;
	long v = ssl ? SSL_get_verify_result(ssl) : X509_V_OK;
	bool psk_hint = false;

	buf[0] = '\0';
	while ((e = ERR_get_error()) && n + 1 < len) {
		const char *rs = ERR_reason_error_string(e);
		char eb[160];
		if (!rs) {
			ERR_error_string_n(e, eb, sizeof(eb));
			rs = eb;
		}
		if (strstr(rs, "binder") || strstr(rs, "decrypt error") ||
		    strstr(rs, "bad record mac") || strstr(rs, "alert illegal parameter"))
			psk_hint = true;
		n += (size_t)snprintf(buf + n, len - n, "%s%s", n ? "; " : "", rs);
	}
	if (v != X509_V_OK && n + 1 < len)
		n += (size_t)snprintf(buf + n, len - n, "%scertificate refused: %s", n ? "; " : "",
				      X509_verify_cert_error_string(v));
	if (psk_hint && n + 1 < len)
		n += (size_t)snprintf(buf + n, len - n,
				      " (wrong pre-shared key: the two daemons' keys differ)");
	if (!n)
		snprintf(buf, len, "connection closed");
}

int tpd_peertls_step(SSL *ssl, int r, bool *want_write, char *why, size_t wl)
{
	int e;

	if (r == 1)
		return 1;
	e = SSL_get_error(ssl, r);
	if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) {
		*want_write = e == SSL_ERROR_WANT_WRITE;
		return 0;
	}
	if (e == SSL_ERROR_ZERO_RETURN) {
		snprintf(why, wl, "closed by the peer");
		return -ECONNRESET;
	}
	if (e == SSL_ERROR_SYSCALL && ERR_peek_error() == 0) {
		snprintf(why, wl, "%s", errno ? strerror(errno) : "connection closed");
		return errno ? -errno : -ECONNRESET;
	}
	tpd_peertls_error(ssl, why, wl);
	return -EPROTO;
}
