/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The syntax of the listen addresses in the settings: peer-listen (the peer part binds it) and
 * metrics-listen (the ctl part serves metrics on it). The configuration checks them as it reads
 * them and the parts parse them here when they bind, so that core/ never calls up into a part.
 * Binding, and what a part does with the address, is the part's.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "addr.h"

int tpd_addr_peer_listen(const char *spec, struct sockaddr_storage *ss, socklen_t *sl)
{
	char host[80];
	const char *colon = strrchr(spec, ':');
	unsigned long port;
	char *end;

	if (!colon || colon == spec || (size_t)(colon - spec) >= sizeof(host))
		return -EINVAL;
	port = strtoul(colon + 1, &end, 10);
	if (*end || port > 65535 || colon[1] == '\0')
		return -EINVAL;
	memcpy(host, spec, (size_t)(colon - spec));
	host[colon - spec] = '\0';
	memset(ss, 0, sizeof(*ss));
	if (strcmp(host, "*") == 0 || strcmp(host, "[::]") == 0) {
		struct sockaddr_in6 *in6 = (void *)ss;
		in6->sin6_family = AF_INET6;
		in6->sin6_addr = in6addr_any;
		in6->sin6_port = htons((uint16_t)port);
		*sl = sizeof(*in6);
		return 0;
	}
	if (host[0] == '[') {
		struct sockaddr_in6 *in6 = (void *)ss;
		size_t l = strlen(host);
		if (l < 3 || host[l - 1] != ']')
			return -EINVAL;
		host[l - 1] = '\0';
		in6->sin6_family = AF_INET6;
		in6->sin6_port = htons((uint16_t)port);
		*sl = sizeof(*in6);
		return inet_pton(AF_INET6, host + 1, &in6->sin6_addr) == 1 ? 0 : -EINVAL;
	}
	{
		struct sockaddr_in *in = (void *)ss;
		in->sin_family = AF_INET;
		in->sin_port = htons((uint16_t)port);
		*sl = sizeof(*in);
		return inet_pton(AF_INET, host, &in->sin_addr) == 1 ? 0 : -EINVAL;
	}
}

int tpd_addr_peer_listen_check(const char *spec)
{
	struct sockaddr_storage ss;
	socklen_t sl;

	if (!spec[0] || strcmp(spec, "off") == 0)
		return 0;
	return tpd_addr_peer_listen(spec, &ss, &sl);
}

int tpd_addr_metrics_listen(const char *listen, bool allow_remote, char *host, size_t hl,
			    uint16_t *port)
{
	const char *colon = strrchr(listen, ':');
	struct in6_addr a6;
	struct in_addr a4;
	unsigned long p;
	char *end;
	size_t n;

	if (!colon || colon == listen)
		return -EINVAL;
	p = strtoul(colon + 1, &end, 10);
	if (*end || p == 0 || p > 65535)
		return -EINVAL;
	n = (size_t)(colon - listen);
	if (listen[0] == '[' && n >= 2 && listen[n - 1] == ']') {
		listen++;
		n -= 2;
	}
	if (n >= hl)
		return -EINVAL;
	memcpy(host, listen, n);
	host[n] = '\0';
	*port = (uint16_t)p;
	if (strcmp(host, "localhost") == 0) {
		snprintf(host, hl, "127.0.0.1");
		return 0;
	}
	if (inet_pton(AF_INET, host, &a4) == 1)
		return allow_remote || (ntohl(a4.s_addr) >> 24) == 127 ? 0 : -EPERM;
	if (inet_pton(AF_INET6, host, &a6) == 1)
		return allow_remote || IN6_IS_ADDR_LOOPBACK(&a6) ? 0 : -EPERM;
	return -EINVAL;
}

int tpd_addr_metrics_listen_check(const char *listen, bool allow_remote)
{
	char host[64];
	uint16_t port;

	return tpd_addr_metrics_listen(listen, allow_remote, host, sizeof(host), &port);
}
