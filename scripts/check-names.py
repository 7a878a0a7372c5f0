#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
#
# Names follow files (the style guide, "Names"): every non-static symbol defined by a file of daemon/ or
# backends/ carries its layer's prefix and then the file's name: daemon/broker/budget.c defines
# tpd_budget_* (or tpd_budgets_*), backends/cma/proc.c tpb_proc_* or, being in backends/cma/,
# tpb_cma_*; files at the top of backends/ (the registry and dispatch wrappers) define the
# layer's own tpb_* API; the verbs layer (backends/verbs/) uses tpv_*. Underscores are ignored
# when comparing, so daemon/peer/peerdial.c may define tpd_peer_dial_*. Reads the objects of a
# built tree (nm over the outputs listed in compile_commands.json) and prints each symbol that
# breaks the rule; exits 1 if there is one. Not responsible for common/, proto/ or client/.
#
# Usage: check-names.py BUILD_DIR
import json
import os
import subprocess
import sys


def expected(path):
    """(prefix, [allowed first words]) for source @path relative to the source root, or None."""
    parts = path[:-2].split('/')
    top, stem = parts[0], parts[-1]
    folder = parts[-2] if len(parts) > 2 else None
    if top == 'daemon':
        return 'tpd_', [stem]
    if top != 'backends':
        return None
    if folder == 'verbs':
        return 'tpv_', ['']
    if stem == 'tpcuda':
        return 'tpcuda_', ['']
    if folder is None:
        return 'tpb_', ['']
    return 'tpb_', [stem] if stem == folder else [stem, folder]


def main():
    build = os.path.abspath(sys.argv[1])
    root = os.path.dirname(build) if len(sys.argv) < 3 else os.path.abspath(sys.argv[2])
    with open(os.path.join(build, 'compile_commands.json')) as f:
        entries = json.load(f)
    bad = 0
    seen = set()
    for e in entries:
        src = os.path.normpath(os.path.join(e['directory'], e['file']))
        rel = os.path.relpath(src, root)
        obj = os.path.join(e['directory'], e['output'])
        rule = expected(rel) if rel.endswith('.c') else None
        if rule is None or obj in seen or not os.path.exists(obj):
            continue
        seen.add(obj)
        prefix, words = rule
        out = subprocess.run(['nm', '--defined-only', '-g', obj], capture_output=True,
                             text=True, check=True).stdout
        for line in out.splitlines():
            fields = line.split()
            if len(fields) != 3:
                continue
            sym = fields[2]
            # main(), and what compilers and sanitizers add (__odr_asan.NAME, __asan_*, ...)
            if sym == 'main' or sym.startswith('__'):
                continue
            rest = sym[len(prefix):].replace('_', '') if sym.startswith(prefix) else None
            if rest is not None and any(rest.startswith(w.replace('_', '')) for w in words):
                continue
            want = ' or '.join(prefix + w + ('_*' if w else '*') for w in words)
            print(f'{rel}: {sym} (want {want})')
            bad += 1
    if bad:
        print(f'{bad} symbol(s) do not follow their file\'s name')
    return 1 if bad else 0


if __name__ == '__main__':
    sys.exit(main())
