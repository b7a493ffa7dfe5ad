"""tools/setup.sh and tools/requirements_check.py. When pip cannot install into the venv (CI
once ran out of disk there), setup.sh exits 1 and says which install failed and how much disk is
free where the venv lies, instead of leaving only pip's bare OSError; the venv there is a stub
whose `python` fails every call, so nothing is installed anywhere. Without a GPU, the failed +cpu
install is reported with pip's own error line before the PyPI fallback."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_failed_install_names_the_disk(tmp_path):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("#!/bin/sh\necho 'ERROR: stub pip, no network' >&2\nexit 1\n")
    (venv / "bin" / "python").chmod(0o755)
    # An nvidia-smi that finds no GPU, first on PATH: the CPU branch runs on a GPU machine too.
    fake = tmp_path / "fakebin"
    fake.mkdir()
    (fake / "nvidia-smi").write_text("#!/bin/sh\nexit 1\n")
    (fake / "nvidia-smi").chmod(0o755)
    env = {**os.environ, "FUSED_MLP_VENV": str(venv), "PATH": f"{fake}{os.pathsep}{os.environ['PATH']}"}
    res = subprocess.run(["bash", str(ROOT / "tools" / "setup.sh")], env=env,
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "[setup] ERROR: pip install torch==2.13.0 failed" in res.stderr, res.stderr
    assert f"MiB are free on the disk of {venv}" in res.stderr, res.stderr
    # The CPU branch reports pip's reason for the +cpu failure before the PyPI fallback.
    assert "(pip: ERROR: stub pip, no network)" in res.stdout, res.stdout


def test_requirements_check(tmp_path):
    """tools/requirements_check.py: met, out of range and missing requirements, from a file and
    from the command line; exit 1 where any is unmet (setup.sh then installs)."""
    import sys
    from importlib.metadata import version

    have = version("pytest")
    check = [sys.executable, str(ROOT / "tools" / "requirements_check.py")]
    ok = subprocess.run([*check, f"pytest=={have}"], capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0 and f"[requirements] pytest {have}" in ok.stdout, ok.stdout + ok.stderr
    reqs = tmp_path / "requirements.txt"
    reqs.write_text(f"# a comment\npytest>={have}  # in range\n\npytest<1\nno-such-package-here>=1\n")
    bad = subprocess.run([*check, "-r", str(reqs)], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert f"pytest {have} is not pytest<1" in bad.stderr
    assert "no-such-package-here: not installed" in bad.stderr
    assert f"[requirements] pytest {have}" in bad.stdout  # the met line is still reported
