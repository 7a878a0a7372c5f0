/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * tpd_peerauth: the cryptographic pieces of peer-link authentication and host identity. Loads
 * the pre-shared key file (refusing files others could read or swap), makes nonces and daemon
 * instance ids, computes and compares HMAC-SHA256 values (through OpenSSL, never by hand; used
 * for the data connections' link proofs, peertls.c), and reads this host's boot id. It does not
 * know about connections, messages or the handshake's order.
 */
#ifndef TPD_PEERAUTH_H
#define TPD_PEERAUTH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Key files are trimmed of trailing whitespace, then must hold this many bytes. */
#define TPD_PEERAUTH_KEY_MIN 16
#define TPD_PEERAUTH_KEY_MAX 4096
#define TPD_PEERAUTH_NONCE_LEN 32
#define TPD_PEERAUTH_MAC_LEN 32
#define TPD_PEERAUTH_BOOT_ID_LEN 16

/* The pre-shared key, as raw bytes of the file (a base64 text key is used as its text). */
struct tpd_peer_key {
	uint8_t *bytes;
	size_t len;
};

/*
 * tpd_peerauth_key_load() - read the pre-shared key from @path.
 * @path: a regular file (not a symlink), owned by root or by the daemon's effective uid, with no
 *        group or other permission bits (mode & 077 == 0).
 * @ret: returns owned key, wipe and free with tpd_peerauth_key_done(); written only on success.
 * @why: on failure, a sentence for the log saying what is wrong and how to fix it.
 *
 * Trailing whitespace and newlines are not part of the key; what is left must be
 * TPD_PEERAUTH_KEY_MIN..TPD_PEERAUTH_KEY_MAX bytes.
 * Return: 0; -EPERM (bad mode or owner), -ELOOP (symlink), -EINVAL (not a regular file, empty,
 * too short or too long), -ENOMEM, or the -errno of open/fstat/read (-ENOENT, -EACCES, ...).
 */
int tpd_peerauth_key_load(const char *path, struct tpd_peer_key *ret, char *why, size_t why_len);

/* Wipes @k's bytes with OPENSSL_cleanse() and frees them; @k is left empty. Accepts an empty
 * or zeroed key. */
void tpd_peerauth_key_done(struct tpd_peer_key *k);

/*
 * tpd_peerauth_nonce() - fill @out with 32 bytes from a cryptographically secure source.
 * Return: 0 or -EIO.
 */
int tpd_peerauth_nonce(uint8_t out[TPD_PEERAUTH_NONCE_LEN]);

/*
 * tpd_peerauth_mac() - HMAC-SHA256 over @label | @a | @b [| @index as u32 little endian].
 * @k: borrowed key, at least one byte.
 * @label: borrowed NUL-terminated domain label ("tpipd-peer-answer", ...); "" for none.
 * @a, @b: borrowed; either may be NULL when its length is 0.
 * @index: < 0 for none, else 0..UINT32_MAX, appended as 4 little-endian bytes.
 * @out: the 32-byte MAC.
 * Return: 0, -EINVAL (empty key, index too large), -EIO (OpenSSL failed).
 */
int tpd_peerauth_mac(const struct tpd_peer_key *k, const char *label, const uint8_t *a,
		     size_t a_len, const uint8_t *b, size_t b_len, int64_t index,
		     uint8_t out[TPD_PEERAUTH_MAC_LEN]);

/*
 * tpd_peerauth_mac_ok() - compare a received MAC @got of @got_len bytes with the 32-byte
 * @expected in constant time (CRYPTO_memcmp). Borrows both.
 * Return: true only if @got_len is 32 and the bytes are equal.
 */
bool tpd_peerauth_mac_ok(const uint8_t *expected, const uint8_t *got, size_t got_len);

/*
 * tpd_peerauth_boot_id() - this host's boot id, parsed from the UUID text in
 * /proc/sys/kernel/random/boot_id. Two daemons with the same boot id run on the same host.
 * Return: 0, -EBADMSG (not a UUID), or the -errno of reading the file.
 */
int tpd_peerauth_boot_id(uint8_t out[TPD_PEERAUTH_BOOT_ID_LEN]);

/*
 * tpd_peerauth_instance() - a random, non-zero 64-bit id for this daemon start.
 * @ret: written only on success.
 * Return: 0 or -EIO.
 */
int tpd_peerauth_instance(uint64_t *ret);

#endif
