# SPDX-License-Identifier: BSD-3-Clause
"""Entry of the python suite for meson test: skips (exit 77) with the reason when pytest,
numpy or the built module is missing (or, for test_cuda.py, a CUDA driver), else runs pytest
on the given test files."""
import sys

missing = []
for mod in ("pytest", "numpy", "tpipd"):
    try:
        __import__(mod)
    except ImportError as e:
        missing.append(f"{mod} ({e})")
if missing:
    print("SKIP: cannot import " + ", ".join(missing))
    sys.exit(77)
if any(a.endswith("test_cuda.py") for a in sys.argv[1:]):
    sys.path.insert(0, __import__("os").path.dirname(__file__))
    import cudev  # noqa: E402
    why = cudev.why_not()
    if why:
        print("SKIP: " + why)
        sys.exit(77)
import pytest  # noqa: E402

rc = pytest.main(["-q", "-rs", "-p", "no:cacheprovider"] + sys.argv[1:])
sys.exit(77 if rc == 5 else int(rc))
