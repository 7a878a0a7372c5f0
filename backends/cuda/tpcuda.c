/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Run-time binding of the CUDA driver API (see tpcuda.h): dlopen, dlsym under the ABI names
 * cuda.h selects, cuInit, and the translation of driver results into errno and text.
 */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "tpcuda.h"

#define STR_(x) #x
#define STR(x) STR_(x) /* expands cuda.h's renames first: cuMemAlloc -> "cuMemAlloc_v2" */

static struct tpcuda_api api;
static const struct tpcuda_api *api_ok;
static char api_why[256];
static pthread_once_t api_once = PTHREAD_ONCE_INIT;

static int bind_all(void *lib)
{
#define TPCUDA_BIND(f)                                                                             \
	*(void **)&api.f = dlsym(lib, STR(f));                                                     \
	if (!api.f) {                                                                              \
		snprintf(api_why, sizeof(api_why), "CUDA driver too old: no %s", STR(f));          \
		return -ENOSYS;                                                                    \
	}
	TPCUDA_FUNCS(TPCUDA_BIND)
#undef TPCUDA_BIND
#define TPCUDA_BIND_OPT(f) *(void **)&api.f = dlsym(lib, STR(f));
	TPCUDA_OPTIONAL_FUNCS(TPCUDA_BIND_OPT)
#undef TPCUDA_BIND_OPT
	return 0;
}

static void api_load(void)
{
	const char *path = getenv("TPIPD_CUDA_LIBRARY");
	void *lib;
	CUresult r;

	if (!path || !*path)
		path = "libcuda.so.1";
	lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!lib) {
		snprintf(api_why, sizeof(api_why), "no CUDA driver: %s", dlerror());
		return;
	}
	if (bind_all(lib) < 0)
		goto fail;
	r = api.cuInit(0);
	if (r != CUDA_SUCCESS) {
		tpcuda_why(&api, "cuInit", r, api_why, sizeof(api_why));
		goto fail;
	}
	r = api.cuDriverGetVersion(&api.driver_version);
	if (r == CUDA_SUCCESS)
		r = api.cuDeviceGetCount(&api.n_devices);
	if (r != CUDA_SUCCESS) {
		tpcuda_why(&api, "cuDeviceGetCount", r, api_why, sizeof(api_why));
		goto fail;
	}
	if (api.n_devices <= 0) {
		snprintf(api_why, sizeof(api_why), "CUDA driver %d.%d sees no device",
			 api.driver_version / 1000, api.driver_version % 1000 / 10);
		goto fail;
	}
	api_ok = &api;
	return;
fail:
	/* The library stays loaded: a failed cuInit may have started driver threads. */
	memset(&api, 0, sizeof(api));
}

const struct tpcuda_api *tpcuda_api(char *why, size_t why_len)
{
	pthread_once(&api_once, api_load);
	if (!api_ok && why && why_len)
		snprintf(why, why_len, "%s", api_why);
	return api_ok;
}

char *tpcuda_why(const struct tpcuda_api *a, const char *call, CUresult r, char *buf, size_t len)
{
	const char *name = NULL, *text = NULL;

	if (a && a->cuGetErrorName)
		a->cuGetErrorName(r, &name);
	if (a && a->cuGetErrorString)
		a->cuGetErrorString(r, &text);
	if (name && text)
		snprintf(buf, len, "%s: %s (%s)", call, name, text);
	else
		snprintf(buf, len, "%s: CUDA error %d", call, (int)r);
	return buf;
}

int tpcuda_sticky(CUresult r)
{
	switch (r) {
	case CUDA_ERROR_ILLEGAL_ADDRESS:
	case CUDA_ERROR_LAUNCH_FAILED:
	case CUDA_ERROR_HARDWARE_STACK_ERROR:
	case CUDA_ERROR_ILLEGAL_INSTRUCTION:
	case CUDA_ERROR_MISALIGNED_ADDRESS:
	case CUDA_ERROR_INVALID_ADDRESS_SPACE:
	case CUDA_ERROR_INVALID_PC:
	case CUDA_ERROR_ECC_UNCORRECTABLE:
		return 1;
	default:
		return 0;
	}
}

int tpcuda_errno(CUresult r)
{
	switch (r) {
	case CUDA_SUCCESS:
		return 0;
	case CUDA_ERROR_OUT_OF_MEMORY:
		return -ENOMEM;
	case CUDA_ERROR_INVALID_VALUE:
	case CUDA_ERROR_INVALID_HANDLE:
	case CUDA_ERROR_INVALID_CONTEXT:
	case CUDA_ERROR_INVALID_DEVICE:
		return -EINVAL;
	case CUDA_ERROR_NO_DEVICE:
	case CUDA_ERROR_NOT_INITIALIZED:
	case CUDA_ERROR_DEINITIALIZED:
		return -ENODEV;
	case CUDA_ERROR_NOT_SUPPORTED:
	case CUDA_ERROR_PEER_ACCESS_UNSUPPORTED:
	case CUDA_ERROR_NOT_PERMITTED:
		return -EOPNOTSUPP;
	case CUDA_ERROR_ALREADY_MAPPED:
	case CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED:
		return -EEXIST;
	default:
		return -EIO;
	}
}
