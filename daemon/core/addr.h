/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * tpd_addr: the syntax of the listen addresses in the settings, peer-listen and metrics-listen.
 * The configuration (config.c) checks them as it reads them; the peer part (peerlisten.c) and the
 * ctl part (metrics.c) parse them here when they bind. Binding is the parts' own.
 */
#ifndef TPD_ADDR_H
#define TPD_ADDR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

/*
 * tpd_addr_peer_listen() - parse a peer-listen address, "ADDR:PORT", "*:PORT" or "[V6]:PORT"
 * (port 0..65535), into @ss and @sl, written also on failure. Borrows @spec.
 * Return: 0, or -EINVAL.
 */
int tpd_addr_peer_listen(const char *spec, struct sockaddr_storage *ss, socklen_t *sl);

/*
 * tpd_addr_peer_listen_check() - whether @spec is a peer-listen value: "off", "" (also off),
 * ADDR:PORT, *:PORT or [V6ADDR]:PORT with a port in 0..65535. Borrows @spec.
 * Return: 0, or -EINVAL.
 */
int tpd_addr_peer_listen_check(const char *spec);

/*
 * tpd_addr_metrics_listen() - split a metrics-listen address, "host:port" or "[v6]:port" (port
 * 1..65535, localhost read as 127.0.0.1), into @host (@hl bytes) and @port. Borrows @listen.
 * Return: 0; -EINVAL malformed; -EPERM for a non-loopback address unless @allow_remote (@host
 * and @port are then written).
 */
int tpd_addr_metrics_listen(const char *listen, bool allow_remote, char *host, size_t hl,
			    uint16_t *port);

/*
 * tpd_addr_metrics_listen_check() - whether @listen is an address the metrics endpoint accepts:
 * an IP ADDR:PORT ("[V6]:PORT") or localhost:PORT, port 1..65535, on a loopback address unless
 * @allow_remote (checked when the configuration is read). Borrows @listen.
 * Return: 0; -EINVAL malformed; -EPERM not loopback and not @allow_remote.
 */
int tpd_addr_metrics_listen_check(const char *listen, bool allow_remote);

#endif
