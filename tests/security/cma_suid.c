/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Helper of test_cma: the test copies this binary into a temporary directory, makes it
 * setuid root (chown 0, chmod 4755), and an attacker (uid 65534) that attached to tpipd execs
 * it. It holds CMA_SUID_BYTES bytes of a known pattern in memory, reports their address (or 0
 * when it does not run with euid 0) as 8 bytes on fd argv[1], waits for one byte on fd argv[2],
 * and exits 0 if its bytes are unchanged, 3 if someone wrote them, 4 when not setuid.
 * Usage: cma_suid REPORT_FD DONE_FD
 */
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#define CMA_SUID_BYTES 4096

static volatile uint8_t secret[CMA_SUID_BYTES];

static uint8_t pattern(size_t i)
{
	return (uint8_t)(0xc3 ^ (i * 13));
}

int main(int argc, char **argv)
{
	uint64_t addr = (uint64_t)(uintptr_t)secret;
	char c;

	if (argc != 3)
		return 2;
	for (size_t i = 0; i < CMA_SUID_BYTES; i++)
		secret[i] = pattern(i);
	if (geteuid() != 0)
		addr = 0;
	if (write(atoi(argv[1]), &addr, sizeof(addr)) != (ssize_t)sizeof(addr))
		return 2;
	if (!addr)
		return 4;
	if (read(atoi(argv[2]), &c, 1) < 0)
		return 2;
	for (size_t i = 0; i < CMA_SUID_BYTES; i++)
		if (secret[i] != pattern(i))
			return 3;
	return 0;
}
