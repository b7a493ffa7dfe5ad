"""tools/build_cuda_check.sh's disk guard (CI's compile check of the CUDA sources): where the
disk has less free space than the torch 2.14.1+cu130 venv needs, the script says SKIPPED and
exits 0, or 1 with FUSED_MLP_REQUIRE_CUDA_CHECK=1, before it creates or installs anything.
The script runs from a copy in a temporary folder, so the checkout's own .venvs is not touched;
the need is set above any disk's free space to take that path, and `python3` on PATH is a stub
that fails, so a broken guard ends the script at once instead of starting a 5.5 GiB install."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("require", [None, "1"])
def test_skips_when_the_disk_is_short(tmp_path, require):
    (tmp_path / "tools").mkdir()
    script = tmp_path / "tools" / "build_cuda_check.sh"
    shutil.copy(ROOT / "tools" / "build_cuda_check.sh", script)
    stub = tmp_path / "bin"
    stub.mkdir()
    (stub / "python3").write_text("#!/bin/sh\necho 'python3 stub: the guard let the install start' >&2\nexit 3\n")
    (stub / "python3").chmod(0o755)
    env = {**os.environ, "FUSED_MLP_CUDA_CHECK_NEED_MIB": str(1 << 40),
           "PATH": f"{stub}{os.pathsep}{os.environ['PATH']}"}
    env.pop("FUSED_MLP_REQUIRE_CUDA_CHECK", None)
    if require:
        env["FUSED_MLP_REQUIRE_CUDA_CHECK"] = require
    res = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=60)
    assert "[cuda-check] SKIPPED" in res.stdout, res.stdout + res.stderr
    assert res.returncode == (1 if require else 0), res.stdout + res.stderr
    assert not (tmp_path / ".venvs" / "torch214-cu130").exists()  # nothing installed
