/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Unit suite for daemon/peer/peertls.c: the PSK derived from a key file (an HKDF vector computed
 * with the openssl command, any key length), the validation of the authentication settings
 * (neither, a certificate without its key or CA, a key or CA without certificate, unreadable or
 * garbage files, a key that does not match its certificate), and TLS 1.3 handshakes between two SSL
 * objects in memory: the same key agrees on the link key and the data connection tokens, a
 * different key fails, certificates are verified against the CA and the host dialled.
 */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <openssl/err.h>
#include "peertls.h"

static char dir[256];
static bool have_certs;

static void path_of(const char *name, char *buf, size_t len)
{
	snprintf(buf, len, "%s/%s", dir, name);
}

static void setup(void)
{
	const char *tmp = getenv("TMPDIR");
	char cmd[2048];

	snprintf(dir, sizeof(dir), "%s/tpt-peertls-XXXXXX", tmp && *tmp ? tmp : "/tmp");
	ck_assert_ptr_nonnull(mkdtemp(dir));
	/* A CA, a certificate for 127.0.0.1 and "peer-a.test" signed by it, and a second CA. */
	snprintf(cmd, sizeof(cmd),
		 "cd %s && { openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes "
		 "-keyout ca.key -out ca.crt -subj /CN=test-ca -days 2 && "
		 "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes "
		 "-keyout ca2.key -out ca2.crt -subj /CN=other-ca -days 2 && "
		 "openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout a.key "
		 "-out a.csr -subj /CN=peer-a && "
		 "printf 'subjectAltName=IP:127.0.0.1,DNS:peer-a.test\\n' > a.ext && "
		 "openssl x509 -req -in a.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out a.crt "
		 "-days 2 -extfile a.ext && "
		 "openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout b.key "
		 "-out b.csr -subj /CN=peer-b && printf 'not a pem\\n' > garbage.pem; "
		 "} >/dev/null 2>&1",
		 dir);
	have_certs = system(cmd) == 0;
}

static void teardown(void)
{
	char cmd[400];

	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	ck_assert_int_eq(system(cmd), 0);
}

static const struct tpd_peer_key key16 = {.bytes = (uint8_t *)"abcdefghijklmnop", .len = 16};

START_TEST(test_psk_matches_the_hkdf_vector)
{
	/* openssl kdf -keylen 32 -kdfopt digest:SHA256 -kdfopt key:abcdefghijklmnop
	 *   -kdfopt salt:"tpipd peer psk v1" -kdfopt info:"tls13 external psk" HKDF */
	static const uint8_t want[32] = {
	    0xF1, 0xE4, 0xBD, 0xF1, 0x08, 0x32, 0xBE, 0xA8, 0x5D, 0xAB, 0xCE,
	    0x71, 0xFA, 0x2E, 0x60, 0xEB, 0x88, 0x14, 0xE7, 0x56, 0xC6, 0x66,
	    0xB4, 0x9A, 0x45, 0x28, 0xA2, 0x49, 0xAF, 0x90, 0x2D, 0xC0,
	};
	uint8_t out[32];

	ck_assert_int_eq(tpd_peertls_psk_derive(&key16, out), 0);
	ck_assert_mem_eq(out, want, 32);
}
END_TEST

START_TEST(test_psk_any_length_and_distinct)
{
	uint8_t big[TPD_PEERAUTH_KEY_MAX], a[32], b[32];
	struct tpd_peer_key k = {.bytes = big, .len = sizeof(big)};
	const struct tpd_peer_key empty = {0};

	memset(big, 'k', sizeof(big));
	ck_assert_int_eq(tpd_peertls_psk_derive(&k, a), 0);
	big[sizeof(big) - 1] = 'K'; /* the last byte counts */
	ck_assert_int_eq(tpd_peertls_psk_derive(&k, b), 0);
	ck_assert_int_ne(memcmp(a, b, 32), 0);
	ck_assert_int_eq(tpd_peertls_psk_derive(&empty, a), -EINVAL);
	ck_assert_int_eq(tpd_peertls_psk_derive(NULL, a), -EINVAL);
}
END_TEST

/* tpd_peertls_new() on @c: its return, and @why must contain @want_why. */
static void expect_new(const struct tpd_peertls_config *c, int want, const char *want_why)
{
	struct tpd_peertls *t = NULL;
	char why[300] = "";
	int r = tpd_peertls_new(c, &t, why, sizeof(why));

	ck_assert_msg(r == want, "tpd_peertls_new: %d (%s), want %d", r, why, want);
	if (want_why)
		ck_assert_msg(strstr(why, want_why), "why '%s' lacks '%s'", why, want_why);
	if (r == 0)
		tpd_peertls_free(t);
}

START_TEST(test_config_validation)
{
	char crt[300], key[300], ca[300], bkey[300], garbage[300], missing[300];
	struct tpd_peertls_config c = {0};

	path_of("a.crt", crt, sizeof(crt));
	path_of("a.key", key, sizeof(key));
	path_of("ca.crt", ca, sizeof(ca));
	path_of("b.key", bkey, sizeof(bkey));
	path_of("garbage.pem", garbage, sizeof(garbage));
	path_of("missing.pem", missing, sizeof(missing));
	expect_new(&c, -EINVAL, "no peer authentication");
	c.key = &key16;
	expect_new(&c, 0, NULL);
	c = (struct tpd_peertls_config){.cert = crt};
	expect_new(&c, -EINVAL, "peer-cert-key");
	c = (struct tpd_peertls_config){.cert = crt, .cert_key = key};
	expect_new(&c, -EINVAL, "peer-ca");
	c = (struct tpd_peertls_config){.cert_key = key, .ca = ca};
	expect_new(&c, -EINVAL, "without peer-cert");
	c = (struct tpd_peertls_config){.cert = crt, .cert_key = key, .ca = missing};
	expect_new(&c, -ENOENT, "peer-ca");
	if (!have_certs)
		return; /* no openssl command: the file checks above are all that can run */
	c = (struct tpd_peertls_config){.cert = garbage, .cert_key = key, .ca = ca};
	expect_new(&c, -EBADMSG, "peer-cert");
	c = (struct tpd_peertls_config){.cert = crt, .cert_key = bkey, .ca = ca};
	expect_new(&c, -EINVAL, "does not match");
	c = (struct tpd_peertls_config){.cert = crt, .cert_key = key, .ca = garbage};
	expect_new(&c, -EBADMSG, "peer-ca");
	c = (struct tpd_peertls_config){.cert = crt, .cert_key = key, .ca = ca, .key = &key16};
	expect_new(&c, 0, NULL);
	if (geteuid() != 0) {
		chmod(ca, 0);
		c = (struct tpd_peertls_config){.cert = crt, .cert_key = key, .ca = ca};
		expect_new(&c, -EACCES, "peer-ca");
	}
}
END_TEST

/* Runs a handshake between @client and @server over a memory BIO pair. Return: whether both
 * finished. */
static bool handshake(SSL *client, SSL *server)
{
	BIO *bc, *bs;

	ck_assert_int_eq(BIO_new_bio_pair(&bc, 0, &bs, 0), 1);
	SSL_set_bio(client, bc, bc);
	SSL_set_bio(server, bs, bs);
	SSL_set_connect_state(client);
	SSL_set_accept_state(server);
	for (int i = 0; i < 20; i++) {
		int rc = SSL_do_handshake(client), rs = SSL_do_handshake(server);
		if (rc == 1 && rs == 1)
			return true;
		if ((rc <= 0 && SSL_get_error(client, rc) != SSL_ERROR_WANT_READ) ||
		    (rs <= 0 && SSL_get_error(server, rs) != SSL_ERROR_WANT_READ))
			return false;
	}
	return false;
}

static struct tpd_peertls *psk_tls(const struct tpd_peer_key *k)
{
	struct tpd_peertls_config c = {.key = k};
	struct tpd_peertls *t;
	char why[200];

	ck_assert_int_eq(tpd_peertls_new(&c, &t, why, sizeof(why)), 0);
	return t;
}

START_TEST(test_psk_handshake_binds_link_and_data)
{
	const struct tpd_peer_key other = {.bytes = (uint8_t *)"ABCDEFGHIJKLMNOP", .len = 16};
	struct tpd_peertls *t = psk_tls(&key16), *u = psk_tls(&other);
	SSL *c = tpd_peertls_ssl_new(t, false, "127.0.0.1"),
	    *s = tpd_peertls_ssl_new(t, true, NULL);
	SSL *dc = tpd_peertls_ssl_new(t, false, "127.0.0.1"),
	    *ds = tpd_peertls_ssl_new(t, true, NULL);
	SSL *wc = tpd_peertls_ssl_new(u, false, "127.0.0.1"),
	    *ws = tpd_peertls_ssl_new(t, true, NULL);
	uint8_t kc[32], ks[32], k2[32], tc[32], ts[32], ta[32];
	char id[200], err[300];
	bool cert;

	ck_assert(handshake(c, s));
	tpd_peertls_identity(s, id, sizeof(id), &cert);
	ck_assert_str_eq(id, "psk:tpipd");
	ck_assert(!cert);
	ck_assert_int_eq(SSL_version(c), TLS1_3_VERSION);
	ck_assert_int_eq(tpd_peertls_link_key(c, 7, kc), 0);
	ck_assert_int_eq(tpd_peertls_link_key(s, 7, ks), 0);
	ck_assert_mem_eq(kc, ks, 32);
	ck_assert_int_eq(tpd_peertls_link_key(s, 8, k2), 0); /* another link id: another key */
	ck_assert_int_ne(memcmp(k2, ks, 32), 0);
	ck_assert(handshake(dc, ds));
	ck_assert_int_eq(tpd_peertls_binding(kc, dc, 0, true, tc), 0);
	ck_assert_int_eq(tpd_peertls_binding(ks, ds, 0, true, ts), 0);
	ck_assert(tpd_peertls_binding_ok(ts, tc, 32));
	ck_assert(!tpd_peertls_binding_ok(ts, tc, 31));
	ck_assert_int_eq(tpd_peertls_binding(ks, ds, 0, false, ta), 0); /* roles differ */
	ck_assert(!tpd_peertls_binding_ok(ts, ta, 32));
	ck_assert_int_eq(tpd_peertls_binding(ks, ds, 1, true, ta), 0); /* indexes differ */
	ck_assert(!tpd_peertls_binding_ok(ts, ta, 32));
	ck_assert_int_eq(tpd_peertls_binding(ks, s, 0, true, ta), 0); /* sessions differ */
	ck_assert(!tpd_peertls_binding_ok(ts, ta, 32));
	ck_assert(!handshake(wc, ws)); /* a different key */
	tpd_peertls_error(ws, err, sizeof(err));
	ck_assert_msg(strstr(err, "wrong pre-shared key"), "server error: %s", err);
	SSL_free(c);
	SSL_free(s);
	SSL_free(dc);
	SSL_free(ds);
	SSL_free(wc);
	SSL_free(ws);
	tpd_peertls_free(t);
	tpd_peertls_free(u);
}
END_TEST

static struct tpd_peertls *cert_tls(const char *crt, const char *key, const char *ca)
{
	char c1[300], c2[300], c3[300], why[300];
	struct tpd_peertls_config c = {.cert = c1, .cert_key = c2, .ca = c3};
	struct tpd_peertls *t;

	path_of(crt, c1, sizeof(c1));
	path_of(key, c2, sizeof(c2));
	path_of(ca, c3, sizeof(c3));
	ck_assert_msg(tpd_peertls_new(&c, &t, why, sizeof(why)) == 0, "%s", why);
	return t;
}

START_TEST(test_certificates_verify_ca_and_host)
{
	struct tpd_peertls *t, *other;
	SSL *c, *s;
	char id[200];
	bool cert;

	if (!have_certs)
		return;
	t = cert_tls("a.crt", "a.key", "ca.crt");
	other = cert_tls("a.crt", "a.key", "ca2.crt"); /* trusts another CA */
	c = tpd_peertls_ssl_new(t, false, "127.0.0.1");
	s = tpd_peertls_ssl_new(t, true, NULL);
	ck_assert(handshake(c, s));
	tpd_peertls_identity(s, id, sizeof(id), &cert);
	ck_assert(cert);
	ck_assert_str_eq(id, "cert:CN=peer-a,IP:127.0.0.1");
	ck_assert(tpd_peertls_names_host(s, "127.0.0.1"));
	ck_assert(tpd_peertls_names_host(s, "peer-a.test"));
	ck_assert(!tpd_peertls_names_host(s, "127.0.0.2"));
	ck_assert(!tpd_peertls_names_host(s, "peer-b.test"));
	SSL_free(c);
	SSL_free(s);
	c = tpd_peertls_ssl_new(t, false, "peer-b.test"); /* the certificate names another host */
	s = tpd_peertls_ssl_new(t, true, NULL);
	ck_assert(!handshake(c, s));
	SSL_free(c);
	SSL_free(s);
	ERR_clear_error();
	c = tpd_peertls_ssl_new(other, false, "127.0.0.1"); /* the server's CA is not trusted */
	s = tpd_peertls_ssl_new(t, true, NULL);
	ck_assert(!handshake(c, s));
	SSL_free(c);
	SSL_free(s);
	ERR_clear_error();
	tpd_peertls_free(t);
	tpd_peertls_free(other);
}
END_TEST

static Suite *peertls_suite(void)
{
	Suite *s = suite_create("peertls");
	TCase *tc = tcase_create("peertls");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, test_psk_matches_the_hkdf_vector);
	tcase_add_test(tc, test_psk_any_length_and_distinct);
	tcase_add_test(tc, test_config_validation);
	tcase_add_test(tc, test_psk_handshake_binds_link_and_data);
	tcase_add_test(tc, test_certificates_verify_ca_and_host);
	tcase_set_timeout(tc, 30);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(peertls_suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
