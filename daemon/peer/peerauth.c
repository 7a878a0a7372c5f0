/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Peer-link authentication primitives: the pre-shared key file (with the ownership and mode rules
 * that keep other users from reading or replacing it), nonces and instance ids from OpenSSL's
 * CSPRNG, HMAC-SHA256 through EVP_MAC, constant-time comparison, and the host's boot id. Nothing
 * here logs: failures come back as -errno plus, for the key file, a sentence for the caller to log.
 */
#include <ctype.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/rand.h>
#include "peerauth.h"
#include "tpu.h"

#define BOOT_ID_PATH "/proc/sys/kernel/random/boot_id"
#define BOOT_ID_TEXT 36 /* 8-4-4-4-12 hex digits */
#define KEY_HINT "generate one with: head -c 32 /dev/urandom | base64 > "
/* Room for a maximal key plus trailing whitespace; a larger file is refused as too long. */
#define KEY_READ_MAX (2 * TPD_PEERAUTH_KEY_MAX)

static void cleanse_freep(uint8_t **p)
{
	if (*p) {
		OPENSSL_cleanse(*p, KEY_READ_MAX);
		free(*p);
	}
}

static int key_open(const char *path, char *why, size_t why_len)
{
	char eb[128];
	int fd, err;

	/* O_NONBLOCK: opening a FIFO must not hang the daemon; a regular file ignores it. */
	fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
	if (fd >= 0)
		return fd;
	err = -errno;
	if (err == -ELOOP)
		return tpu_why(err, why, why_len,
			       "key file %s is a symbolic link; point key-file at the file itself",
			       path);
	return tpu_why(err, why, why_len, "cannot open key file %s: %s", path,
		       tpu_strerror(err, eb, sizeof(eb)));
}

static int key_check_stat(int fd, const char *path, char *why, size_t why_len)
{
	struct stat st;
	char eb[128];

	if (fstat(fd, &st) < 0) {
		int err = -errno;

		return tpu_why(err, why, why_len, "cannot stat key file %s: %s", path,
			       tpu_strerror(err, eb, sizeof(eb)));
	}
	if (!S_ISREG(st.st_mode))
		return tpu_why(-EINVAL, why, why_len, "key file %s is not a regular file", path);
	if (st.st_uid != 0 && st.st_uid != geteuid())
		return tpu_why(-EPERM, why, why_len,
			       "key file %s is owned by uid %u, not by root or the daemon's "
			       "uid %u; chown it",
			       path, (unsigned)st.st_uid, (unsigned)geteuid());
	if (st.st_mode & 077)
		return tpu_why(-EPERM, why, why_len,
			       "key file %s is readable by group/others (mode %04o); chmod 600 it",
			       path, (unsigned)(st.st_mode & 07777));
	return 0;
}

/* Reads all of @fd into @buf (KEY_READ_MAX bytes). Return: bytes read, -EFBIG, or -errno. */
static ssize_t key_read(int fd, uint8_t *buf)
{
	size_t n = 0;

	for (;;) {
		ssize_t r = read(fd, buf + n, KEY_READ_MAX - n);

		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			return -errno;
		if (r == 0)
			return (ssize_t)n;
		n += (size_t)r;
		if (n == KEY_READ_MAX)
			return -EFBIG;
	}
}

static size_t trim_trailing_space(const uint8_t *buf, size_t n)
{
	while (n > 0 && isspace(buf[n - 1]))
		n--;
	return n;
}

static int key_check_len(ssize_t n, const char *path, char *why, size_t why_len)
{
	char eb[128];

	if (n == -EFBIG || n > TPD_PEERAUTH_KEY_MAX)
		return tpu_why(-EINVAL, why, why_len, "key file %s: key too long, at most %d bytes",
			       path, TPD_PEERAUTH_KEY_MAX);
	if (n < 0)
		return tpu_why((int)n, why, why_len, "cannot read key file %s: %s", path,
			       tpu_strerror((int)n, eb, sizeof(eb)));
	if (n == 0)
		return tpu_why(-EINVAL, why, why_len, "key file %s is empty; " KEY_HINT "%s", path,
			       path);
	if (n < TPD_PEERAUTH_KEY_MIN)
		return tpu_why(-EINVAL, why, why_len,
			       "key file %s: key too short (%zd bytes), need at least %d "
			       "bytes; " KEY_HINT "%s",
			       path, n, TPD_PEERAUTH_KEY_MIN, path);
	return 0;
}

int tpd_peerauth_key_load(const char *path, struct tpd_peer_key *ret, char *why, size_t why_len)
{
	_cleanup_(cleanse_freep) uint8_t *buf = NULL;
	_cleanup_close_ int fd = -EBADF;
	uint8_t *key;
	ssize_t n;
	int r;

	fd = key_open(path, why, why_len);
	if (fd < 0)
		return fd;
	r = key_check_stat(fd, path, why, why_len);
	if (r < 0)
		return r;
	buf = malloc(KEY_READ_MAX);
	if (!buf)
		return tpu_why(-ENOMEM, why, why_len, "out of memory reading key file %s", path);
	n = key_read(fd, buf);
	if (n > 0)
		n = (ssize_t)trim_trailing_space(buf, (size_t)n);
	r = key_check_len(n, path, why, why_len);
	if (r < 0)
		return r;
	key = malloc((size_t)n);
	if (!key)
		return tpu_why(-ENOMEM, why, why_len, "out of memory reading key file %s", path);
	memcpy(key, buf, (size_t)n);
	*ret = (struct tpd_peer_key){ .bytes = key, .len = (size_t)n };
	return 0;
}

void tpd_peerauth_key_done(struct tpd_peer_key *k)
{
	if (!k)
		return;
	if (k->bytes) {
		OPENSSL_cleanse(k->bytes, k->len);
		free(k->bytes);
	}
	*k = (struct tpd_peer_key){ 0 };
}

int tpd_peerauth_nonce(uint8_t out[TPD_PEERAUTH_NONCE_LEN])
{
	return RAND_bytes(out, TPD_PEERAUTH_NONCE_LEN) == 1 ? 0 : -EIO;
}

static void mac_ctx_freep(EVP_MAC_CTX **c)
{
	EVP_MAC_CTX_free(*c);
}

static void mac_freep(EVP_MAC **m)
{
	EVP_MAC_free(*m);
}

/* Feeds @len bytes at @p (NULL allowed when @len is 0). Return: true on success. */
static bool mac_update(EVP_MAC_CTX *c, const void *p, size_t len)
{
	return len == 0 || EVP_MAC_update(c, p, len) == 1;
}

int tpd_peerauth_mac(const struct tpd_peer_key *k, const char *label, const uint8_t *a,
		     size_t a_len, const uint8_t *b, size_t b_len, int64_t index,
		     uint8_t out[TPD_PEERAUTH_MAC_LEN])
{
	_cleanup_(mac_freep) EVP_MAC *mac = NULL;
	_cleanup_(mac_ctx_freep) EVP_MAC_CTX *ctx = NULL;
	OSSL_PARAM params[] = {
		OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, (char *)"SHA256", 0),
		OSSL_PARAM_construct_end(),
	};
	uint8_t idx[4];
	size_t out_len = 0;

	if (!k || !k->bytes || !k->len || index > (int64_t)UINT32_MAX)
		return -EINVAL;
	mac = EVP_MAC_fetch(NULL, "HMAC", NULL);
	ctx = mac ? EVP_MAC_CTX_new(mac) : NULL;
	if (!ctx || EVP_MAC_init(ctx, k->bytes, k->len, params) != 1)
		return -EIO;
	if (!mac_update(ctx, label, label ? strlen(label) : 0) || !mac_update(ctx, a, a_len) ||
	    !mac_update(ctx, b, b_len))
		return -EIO;
	if (index >= 0) {
		for (int i = 0; i < 4; i++)
			idx[i] = (uint8_t)((uint64_t)index >> (8 * i));
		if (!mac_update(ctx, idx, sizeof(idx)))
			return -EIO;
	}
	if (EVP_MAC_final(ctx, out, &out_len, TPD_PEERAUTH_MAC_LEN) != 1 ||
	    out_len != TPD_PEERAUTH_MAC_LEN)
		return -EIO;
	return 0;
}

bool tpd_peerauth_mac_ok(const uint8_t *expected, const uint8_t *got, size_t got_len)
{
	if (!expected || !got || got_len != TPD_PEERAUTH_MAC_LEN)
		return false;
	return CRYPTO_memcmp(expected, got, TPD_PEERAUTH_MAC_LEN) == 0;
}

static int hex_nibble(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	c = (char)tolower((unsigned char)c);
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	return -1;
}

/* Parses "xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" (36 chars) into 16 bytes. */
static int uuid_parse(const char *s, uint8_t out[TPD_PEERAUTH_BOOT_ID_LEN])
{
	size_t o = 0;

	for (size_t i = 0; i < BOOT_ID_TEXT; i++) {
		int hi, lo;

		if (i == 8 || i == 13 || i == 18 || i == 23) {
			if (s[i] != '-')
				return -EBADMSG;
			continue;
		}
		hi = hex_nibble(s[i]);
		lo = hi < 0 ? -1 : hex_nibble(s[++i]);
		if (lo < 0)
			return -EBADMSG;
		out[o++] = (uint8_t)(hi << 4 | lo);
	}
	return o == TPD_PEERAUTH_BOOT_ID_LEN ? 0 : -EBADMSG;
}

int tpd_peerauth_boot_id(uint8_t out[TPD_PEERAUTH_BOOT_ID_LEN])
{
	_cleanup_close_ int fd = -EBADF;
	char text[64] = { 0 };
	ssize_t n;

	fd = open(BOOT_ID_PATH, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	do
		n = read(fd, text, sizeof(text) - 1);
	while (n < 0 && errno == EINTR);
	if (n < 0)
		return -errno;
	if (n < BOOT_ID_TEXT || (n > BOOT_ID_TEXT && !isspace((unsigned char)text[BOOT_ID_TEXT])))
		return -EBADMSG;
	return uuid_parse(text, out);
}

int tpd_peerauth_instance(uint64_t *ret)
{
	uint64_t v = 0;

	while (v == 0)
		if (RAND_bytes((unsigned char *)&v, sizeof(v)) != 1)
			return -EIO;
	*ret = v;
	return 0;
}
