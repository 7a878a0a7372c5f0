#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
#
# layout-report.py: figures on the layout of the daemon and the backends, for reviews of a change
# that moves code: lines per folder, files over 800 lines, the places outside daemon/core/ that
# read a field of struct tpd_daemon, the include arrows between the parts of daemon/, and the
# largest include cycle between modules. A module is a file name without its extension
# (foo.c and foo.h are one module); module A points at module B when a file of A includes B's
# header. A cycle of modules is a set where each reaches every other: the largest one says how
# much of the code must be understood at once. Reads the sources only; run at any commit.
#
# Usage: scripts/layout-report.py [SOURCE_ROOT]
import os
import re
import sys
from collections import defaultdict

LIMIT = 800
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def sources(root):
    out = []
    for top in ('daemon', 'backends'):
        for dirpath, _, names in os.walk(os.path.join(root, top)):
            for n in names:
                if n.endswith(('.c', '.h')):
                    out.append(os.path.relpath(os.path.join(dirpath, n), root))
    return sorted(out)


def lines(root, path):
    with open(os.path.join(root, path), errors='replace') as f:
        return f.read()


def daemon_fields(root, files):
    """The field names of struct tpd_daemon, from whichever header defines it."""
    for p in files:
        if p.endswith('.h'):
            text = lines(root, p)
            m = re.search(r'^struct tpd_daemon \{(.*?)^\};', text, re.S | re.M)
            if m:
                body = re.sub(r'/\*.*?\*/', '', m.group(1), flags=re.S)
                return set(re.findall(r'([A-Za-z_]\w*)\s*(?:\[[^\]]*\])?\s*;', body))
    return set()


def part_of(path):
    """daemon/<part>/..., backends/<folder>/... or the flat daemon/ of older trees."""
    bits = path.split('/')
    if len(bits) > 2:
        return bits[0] + '/' + bits[1]
    return bits[0]


def scc(graph):
    """Tarjan's strongly connected components, iterative."""
    index, low, on, stack, comps = {}, {}, set(), [], []
    counter = [0]
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    comps.append(sorted(comp))
    return comps


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else '.')
    files = sources(root)
    text = {p: lines(root, p) for p in files}

    print('lines per folder')
    per = defaultdict(lambda: [0, 0])
    for p in files:
        per[os.path.dirname(p)][0] += text[p].count('\n')
        per[os.path.dirname(p)][1] += 1
    for d in sorted(per):
        print(f'  {d:24} {per[d][0]:6} lines in {per[d][1]} files')

    print(f'files over {LIMIT} lines')
    big = [(text[p].count('\n'), p) for p in files if text[p].count('\n') > LIMIT]
    for n, p in sorted(big, reverse=True):
        print(f'  {p:40} {n}')
    if not big:
        print('  none')

    fields = daemon_fields(root, files)
    pat = re.compile(r'(?:\bd|->d)->(' + '|'.join(sorted(fields)) + r')\b') if fields else None
    print('reads of struct tpd_daemon fields outside daemon/core/ (d->FIELD, x->d->FIELD)')
    total = 0
    for p in files:
        if not p.startswith('daemon/') or p.startswith('daemon/core/') or not pat:
            continue
        if os.path.basename(p) in ('daemon.c', 'config.c', 'main.c', 'notify.c', 'quota.c',
                                  'stats.c') and part_of(p) == 'daemon':
            continue  # the core files of the flat daemon/ of older trees
        n = len(pat.findall(text[p]))
        if n:
            print(f'  {p:40} {n}')
            total += n
    print(f'  total {total}')

    # Modules and the include graph.
    by_name = defaultdict(list)
    for p in files:
        by_name[os.path.basename(p)].append(p)

    def module(p):
        return os.path.splitext(p)[0]

    graph = defaultdict(set)
    arrows = defaultdict(int)
    for p in files:
        graph[module(p)]
        for inc in INCLUDE.findall(text[p]):
            target = os.path.normpath(os.path.join(os.path.dirname(p), inc))
            cands = [target] if target in text else by_name.get(os.path.basename(inc), [])
            for t in cands:
                if module(t) != module(p):
                    graph[module(p)].add(module(t))
                a, b = part_of(p), part_of(t)
                if a != b and a.startswith('daemon/') and b.startswith('daemon/'):
                    arrows[(a, b)] += 1
    print('include arrows between the parts of daemon/ (includes)')
    for (a, b), n in sorted(arrows.items()):
        back = ' (both ways)' if (b, a) in arrows else ''
        print(f'  {a:16} -> {b:16} {n}{back}')
    comps = [c for c in scc(graph) if len(c) > 1]
    comps.sort(key=len, reverse=True)
    print('largest include cycle between modules')
    if not comps:
        print('  none')
    else:
        print(f'  {len(comps[0])} modules: ' + ' '.join(comps[0]))
        if len(comps) > 1:
            print('  others: ' + ', '.join(str(len(c)) for c in comps[1:]))
    return 0


if __name__ == '__main__':
    sys.exit(main())
