/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Error reporting of libtpclient: the static descriptions behind tp_strerror() and the
 * thread-local message behind tp_last_error(). Deciding which error a call returns is left to
 * the calls themselves.
 */
#include <stdio.h>
#include <string.h>
#include "internal.h"

static __thread char last_error[TPC_ERRMSG_MAX];

static const struct {
	int err;
	const char *text;
} descriptions[] = {
	{ 0, "success" },
	{ EPIPE, "the remote end closed the pipe" },
	{ ECONNRESET, "peer died" },
	{ ECONNABORTED, "closed by an administrator" },
	{ ECANCELED, "canceled: closed locally" },
	{ ENOENT, "no such listener (or no daemon socket)" },
	{ ECONNREFUSED, "connection refused: nothing listens at that address" },
	{ EACCES, "refused by the listener's access policy" },
	{ EADDRINUSE, "listener name already taken" },
	{ ERANGE, "buffer range outside registered memory" },
	{ EMSGSIZE, "over a size limit" },
	{ E2BIG, "too many payloads and tensors" },
	{ ENOBUFS, "over a count or queue limit" },
	{ EINVAL, "invalid argument" },
	{ EOPNOTSUPP, "not supported" },
	{ EPROTONOSUPPORT, "incompatible protocol version" },
	{ EPROTO, "protocol error" },
	{ EFAULT, "memory not reachable by the daemon" },
	{ ETIMEDOUT, "timed out" },
	{ ESHUTDOWN, "the daemon is shutting down" },
	{ EBUSY, "object in use" },
	{ EIO, "copy failed" },
	{ EDEADLK, "blocking call from a callback" },
	{ ENOMEM, "out of memory" },
};

TP_EXPORT const char *tp_strerror(int err)
{
	if (err < 0)
		err = -err;
	for (size_t i = 0; i < TPU_ARRAY_SIZE(descriptions); i++)
		if (descriptions[i].err == err)
			return descriptions[i].text;
	return strerror(err);
}

TP_EXPORT const char *tp_last_error(void)
{
	return last_error;
}

int tpc_error(int err, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(last_error, sizeof(last_error), fmt, ap);
	va_end(ap);
	return err;
}

int tpc_error_msg(int err, const char *msg)
{
	snprintf(last_error, sizeof(last_error), "%s", msg ? msg : tp_strerror(err));
	return err;
}
