#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
# Checks that a shared library exports only tp_* symbols (plus its version node) and at least
# one of them. Usage: check_exports.sh LIB
set -eu
lib=$1
syms=$(nm -D --defined-only "$lib" | awk '$2 != "A" { print $3 }')
bad=$(printf '%s\n' "$syms" | grep -v '^tp_' || true)
if [ -n "$bad" ]; then
	echo "$lib exports symbols outside the public API:"
	printf '%s\n' "$bad"
	exit 1
fi
n=$(printf '%s\n' "$syms" | grep -c '^tp_' || true)
echo "$lib: $n tp_* symbols, nothing else"
[ "$n" -gt 0 ]
