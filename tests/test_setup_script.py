"""tools/setup.sh's failure message: when pip cannot install into the venv (CI once ran out
of disk there), the script exits 1 and says which install failed and how much disk is free
where the venv lies, instead of leaving only pip's bare OSError. The venv here is a stub
whose `python` fails every call, so nothing is installed anywhere."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_failed_install_names_the_disk(tmp_path):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("#!/bin/sh\nexit 1\n")
    (venv / "bin" / "python").chmod(0o755)
    env = {**os.environ, "FUSED_MLP_VENV": str(venv)}
    res = subprocess.run(["bash", str(ROOT / "tools" / "setup.sh")], env=env,
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "[setup] ERROR: pip install torch==2.13.0 failed" in res.stderr, res.stderr
    assert f"MiB are free on the disk of {venv}" in res.stderr, res.stderr
