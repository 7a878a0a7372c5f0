# SPDX-License-Identifier: BSD-3-Clause
"""The data-parallel training example (examples/python/train_ddp.py): 4 processes all-reduce
gradients through tpipd each step; after the steps every rank's parameters equal those of
one process trained on the concatenated batches (float tolerance)."""
import os
import subprocess
import sys

import pytest

from tpipd import _tensor

if _tensor.torch_module() is None:
    pytest.skip("torch is not installed", allow_module_level=True)


def test_four_ranks_train_like_one_process(daemon, tmp_path):
    ex = os.path.join(os.environ.get("TPY_EXAMPLES", ""), "train_ddp.py")
    p = subprocess.run([sys.executable, ex, "--nprocs", "4", "--steps", "15", "--check",
                        "--out", str(tmp_path), "--group", f"train.{os.getpid()}"],
                       capture_output=True, text=True, timeout=200)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.count("parameters equal one process's") == 4, p.stdout
