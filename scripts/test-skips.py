#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""Lists the skipped tests of a `meson test` run with the reason each printed.

Reads meson's testlog.json (one JSON object per test) and prints, for every test whose result
is SKIP, its name and the first line of its output that mentions a skip ("SKIP: no CUDA
device", "1..0 # SKIP ...", "skipped: ..."), or "(no reason printed)". Prints nothing when no
test was skipped. Used by ./test.sh after `meson test`; never changes its exit status.
Usage: test-skips.py BUILD/meson-logs/testlog.json
"""
import json
import re
import sys

SKIP_LINE = re.compile(r"\bskip", re.IGNORECASE)


def reason(out):
    for line in (out or "").splitlines():
        if SKIP_LINE.search(line):
            return line.strip()
    return "(no reason printed)"


def main(argv):
    if len(argv) != 2:
        print("usage: test-skips.py TESTLOG_JSON", file=sys.stderr)
        return 2
    skipped = []
    try:
        with open(argv[1], encoding="utf-8", errors="replace") as f:
            for line in f:
                try:
                    t = json.loads(line)
                except ValueError:
                    continue
                if t.get("result") == "SKIP":
                    skipped.append((t.get("name", "?"), reason(t.get("stdout"))))
    except OSError as e:
        print(f"test-skips: cannot read {argv[1]}: {e.strerror}", file=sys.stderr)
        return 1
    if skipped:
        print(f"\nSkipped tests ({len(skipped)}):")
        for name, why in skipped:
            print(f"  {name}: {why}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
