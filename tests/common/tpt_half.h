/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Reference IEEE binary16 conversions computed by arithmetic (round to nearest even, subnormals,
 * infinities, NaN), for tests that check the library's f16 kernels without trusting the
 * compiler's _Float16. Header-only: each test includes it once.
 */
#ifndef TPT_HALF_H
#define TPT_HALF_H

#include <math.h>
#include <stdint.h>

static uint16_t ref_f2h(float x)
{
	uint16_t sign = signbit(x) ? 0x8000 : 0;
	double a = fabs((double)x), q, v;
	int e, ue;

	if (isnan(x))
		return 0x7e00;
	if (a == 0)
		return sign;
	frexp(a, &e);		       /* a in [2^(e-1), 2^e) */
	ue = e - 11 < -24 ? -24 : e - 11; /* 11 significant bits, subnormal spacing 2^-24 */
	q = nearbyint(ldexp(a, -ue));
	v = ldexp(q, ue);
	if (v >= 65536.0)
		return sign | 0x7c00;
	if (v < 0x1p-14)
		return sign | (uint16_t)ldexp(v, 24);
	frexp(v, &e);
	return sign | (uint16_t)((e - 1 + 15) << 10) | (uint16_t)(ldexp(v, 11 - e) - 1024);
}

static float ref_h2f(uint16_t h)
{
	int E = (h >> 10) & 31, M = h & 1023;
	double v = E == 31 ? (M ? NAN : INFINITY) : E == 0 ? ldexp(M, -24) : ldexp(1024 + M, E - 25);

	return (float)((h & 0x8000) ? -v : v);
}

#endif
