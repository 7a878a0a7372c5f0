/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * An LD_PRELOAD shim for signals.sh: wraps listen() and, once a Unix socket listens, raises the
 * signal named by TPT_SIGNAL_AT_LISTEN (a number) in the listening process. That is the earliest
 * moment a client can connect to tpipd and a service manager stop it, made deterministic. Used
 * only by the test; it does nothing else and changes nothing when the variable is unset.
 */
#include <dlfcn.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/un.h>

int listen(int fd, int backlog);

int listen(int fd, int backlog)
{
	int (*real)(int, int) = (int (*)(int, int))dlsym(RTLD_NEXT, "listen");
	const char *sig = getenv("TPT_SIGNAL_AT_LISTEN");
	struct sockaddr_un sa;
	socklen_t len = sizeof(sa);
	int r = real(fd, backlog);

	if (r == 0 && sig && getsockname(fd, (struct sockaddr *)&sa, &len) == 0 &&
	    sa.sun_family == AF_UNIX)
		raise(atoi(sig));
	return r;
}
