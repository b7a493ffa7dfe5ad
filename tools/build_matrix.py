#!/usr/bin/env python3
"""Build and check several torch/CUDA variants of fused-mlp, each in its own environment.

kernel-builder (Nix) builds the whole matrix in one go; without Nix this tool does the
same one environment at a time. For every selected variant it:

1. sets up an isolated virtual environment under ``.venvs/<name>/`` with that variant's
   torch (reused when it is already there; ``--system`` uses the current interpreter
   instead, for machines with no network such as the GPU machine);
2. runs ``tools/build_variant.py`` with that environment's python, so the variant name,
   the op namespace and ``metadata.json`` come from that torch (``--jobs`` is passed on;
   keep it at 1 while other compiles run);
3. checks ``build/<variant>/metadata.json`` with ``kernels._rust.Metadata`` (and that its
   id names the ``.so`` and its version is build.toml's);
4. reports the kernel-abi-check findings that build_variant.py wrote to
   ``build/_work/<variant>/abi-check.txt``;
5. stages the variant alone into a temporary Hub cache (``tools/stage_cache.py``) and
   imports it in that environment with ``get_kernel(repo_id, version=N)`` offline, then
   calls an op (on CPU tensors; on the GPU too when one is visible);
6. runs ``pytest tests -q`` in that environment for CPU variants (and for CUDA variants
   when a GPU is visible; see ``--tests``).

A summary table is printed and written to ``build/matrix-report.json``. Logs of every
step go to ``build/matrix-logs/``.

Usage:
    python tools/build_matrix.py --list
    python tools/build_matrix.py                                  # every non --system entry
    python tools/build_matrix.py torch213-cxx11-cpu-x86_64-linux  # some entries, by name
    python tools/build_matrix.py --system                         # the current interpreter only
    python tools/build_matrix.py --skip-build torch214-cxx11-cu130-x86_64-linux  # re-check only
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
VENVS = ROOT / ".venvs"
BUILD = ROOT / "build"
LOGS = BUILD / "matrix-logs"
REPORT = BUILD / "matrix-report.json"


def kernels_requirement() -> str:
    """requirements.txt's kernels line: the one place that names the releases this project takes."""
    from packaging.requirements import Requirement
    from requirements_check import read_requirements

    for line in read_requirements(ROOT / "requirements.txt"):
        if Requirement(line).name == "kernels":
            return line
    raise SystemExit("requirements.txt names no kernels requirement")


KERNELS_REQ = kernels_requirement()


def kernels_ok(installed: str | None) -> bool:
    """Whether a venv's kernels version (probed) is one requirements.txt takes."""
    from packaging.requirements import Requirement

    return installed is not None and Requirement(KERNELS_REQ).specifier.contains(installed)


# What every environment needs besides torch (the build, the checks and the tests).
COMMON = [KERNELS_REQ, "kernel-abi-check", "huggingface_hub", "safetensors", "pytest", "numpy"]


@dataclass
class Entry:
    """One row of the matrix: a variant and how to get an environment that builds it."""

    variant: str
    backend: str  # "cpu" | "cuda"
    venv: str | None  # directory name under .venvs/; None: --system only
    torch: str  # the pip requirement for torch
    packages: list[str] = field(default_factory=list)  # besides torch and COMMON
    # "system": /usr/local/cuda; "pip": nvcc and headers from nvidia-* wheels in the venv.
    cuda: str | None = None
    note: str = ""
    # Environment variables for this entry's pip installs only (e.g. a machine-wide constraint
    # file that caps torch below the entry's release, lifted for this venv).
    pip_env: dict[str, str] = field(default_factory=dict)


MATRIX: dict[str, Entry] = {
    e.variant: e
    for e in [
        Entry(
            variant="torch213-cxx11-cpu-x86_64-linux",
            backend="cpu",
            venv="torch213-cpu",
            torch="torch==2.13.0",
            packages=["transformers", "triton"],
            note="torch 2.13.0+cpu (a wheel on this machine's disk); also runs pytest tests",
        ),
        Entry(
            variant="torch214-cxx11-cu130-x86_64-linux",
            backend="cuda",
            venv="torch214-cu130",
            torch="torch==2.14.1",
            cuda="system",
            note="torch 2.14.1 (CUDA 13.0 build, on this disk); nvcc 13.0 from CUDA_HOME=/usr/local/cuda",
        ),
        Entry(
            variant="torch212-cxx11-cu130-x86_64-linux",
            backend="cuda",
            venv="torch212-cu130",
            torch="torch==2.12.1",
            packages=[
                # The CUDA 13.0 compiler from PyPI, pinned to the toolkit torch 2.12.1 pins
                # (cuda-toolkit==13.0.2): nvcc + cudafe++/fatbinary/nvlink/ptxas (nvcc),
                # cicc + libdevice (nvvm), crt/ headers (crt), cub/thrust/libcu++ (cccl),
                # cuda_runtime.h + libcudart (cudart). All land in site-packages/nvidia/cu13/.
                "cuda-toolkit[nvcc,nvvm,crt,cccl,cudart]==13.0.2",
            ],
            cuda="pip",
            note="torch 2.12.1 from PyPI (CUDA 13.0); nvcc 13.0 from PyPI (cuda-toolkit[nvcc,...]==13.0.2)",
        ),
        Entry(
            variant="torch215-cxx11-cu132-x86_64-linux",
            backend="cuda",
            venv="torch215-cu132",
            torch="torch==2.15.0",
            packages=[
                # torch 2.15.0's own toolkit pin (cuda-toolkit==13.2.2), the same parts as above;
                # transformers for the tests (run with --tests always: the CPU parts of the suite
                # under this torch, its CUDA tests skip without a GPU).
                "cuda-toolkit[nvcc,nvvm,crt,cccl,cudart]==13.2.2",
                "transformers",
            ],
            cuda="pip",
            # This machine's /etc/xdg/pip/constraints.txt caps torch at 2.14.1 (the releases on
            # its disk); 2.15.0 comes from PyPI, so that cap is lifted for this venv's installs.
            pip_env={"PIP_CONSTRAINT": "/dev/null"},
            note="torch 2.15.0 from PyPI (CUDA 13.2); nvcc 13.2 from PyPI (cuda-toolkit[nvcc,...]==13.2.2)",
        ),
        Entry(
            variant="torch29-cxx11-cu128-x86_64-linux",
            backend="cuda",
            venv="torch29-cu128",
            torch="torch==2.9.1",
            packages=[
                # What PyPI has for CUDA 12.8. NOTE: nvidia-cuda-nvcc-cu12 (12.8.93, also
                # 12.9.86) ships ptxas, libnvvm and crt/ headers only -- no nvcc driver, cicc,
                # cudafe++, fatbinary or nvlink -- so this entry stops at the compiler check.
                "nvidia-cuda-nvcc-cu12==12.8.*",
                "nvidia-cuda-cccl-cu12==12.8.*",
                "nvidia-cuda-runtime-cu12==12.8.*",
            ],
            cuda="pip",
            note="torch 2.9.1 from PyPI (CUDA 12.8) + nvidia-cuda-nvcc-cu12: cannot compile here "
                 "(that wheel has no nvcc driver; no CUDA 12 toolkit on this machine)",
        ),
        Entry(
            variant="torch211-cxx11-cu130-x86_64-linux",
            backend="cuda",
            venv=None,
            torch="torch==2.11.0",
            cuda="system",
            note="GPU machine only: its system python3 has torch 2.11.0+cu130 (run with --system)",
        ),
    ]
}


# --------------------------------------------------------------------------------------
# small helpers


def log(msg: str) -> None:
    print(f"[matrix] {msg}", flush=True)


def read_build_toml() -> dict:
    with open(ROOT / "build.toml", "rb") as f:
        return tomllib.load(f)


class StepError(Exception):
    """A step failed; the message says what stopped it."""


def run_logged(cmd: list[str], logfile: Path, *, env: dict | None = None, cwd: Path = ROOT,
               timeout: float | None = None) -> subprocess.CompletedProcess:
    """Run cmd, append its output to logfile, return the completed process (never raises on rc)."""
    logfile.parent.mkdir(parents=True, exist_ok=True)
    with open(logfile, "a") as f:
        f.write(f"\n$ {' '.join(shlex.quote(c) for c in cmd)}\n")
        f.flush()
        try:
            res = subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 text=True, timeout=timeout)
        except subprocess.TimeoutExpired as e:
            out = e.stdout if isinstance(e.stdout, str) else (e.stdout or b"").decode(errors="replace")
            f.write(out + f"\n[timed out after {timeout}s]\n")
            return subprocess.CompletedProcess(cmd, 124, out + f"\n[timed out after {timeout}s]\n")
        f.write(res.stdout)
    return res


def tail(text: str, n: int = 15) -> str:
    lines = [l for l in text.strip().splitlines() if l.strip()]
    return "\n".join(lines[-n:])


def clean_env() -> dict:
    """The environment for child processes: ours, minus anything that would leak another venv in."""
    env = dict(os.environ)
    for k in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "KERNELS_CACHE", "LOCAL_KERNELS"):
        env.pop(k, None)
    return env


# --------------------------------------------------------------------------------------
# environments


def base_python() -> str:
    """The interpreter venvs are made from (the one behind our own venv, if any)."""
    return getattr(sys, "_base_executable", None) or sys.executable


def venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


PROBE = r"""
import json, sys
out = {"python": sys.version.split()[0]}
try:
    import torch
    out["torch"] = torch.__version__
    out["torch_cuda"] = torch.version.cuda
    out["gpu"] = bool(torch.cuda.is_available())
except Exception as e:
    out["torch_error"] = repr(e)
missing = []
for m in ("kernels", "kernel_abi_check", "huggingface_hub", "pytest"):
    try:
        __import__(m)
    except Exception:
        missing.append(m)
out["missing"] = missing
try:
    import kernels
    out["kernels"] = kernels.__version__
except Exception:
    pass
print("PROBE " + json.dumps(out))
"""


def probe(python: str, logfile: Path) -> dict:
    res = run_logged([python, "-c", PROBE], logfile, env=clean_env())
    for line in res.stdout.splitlines():
        if line.startswith("PROBE "):
            return json.loads(line[6:])
    raise StepError(f"cannot run {python}: {tail(res.stdout, 5)}")


def torch_matches(info: dict, entry: Entry) -> bool:
    """Whether the probed torch is the entry's (local labels such as +cpu or +cu130 ignored)."""
    have = (info.get("torch") or "").split("+")[0]
    if "==" not in entry.torch or not have:
        return bool(have)
    return have == entry.torch.split("==", 1)[1]


def setup_venv(entry: Entry, logfile: Path, *, no_install: bool) -> tuple[str, dict]:
    """Create (or reuse) the entry's venv; install only what is missing. Returns (python, probe)."""
    assert entry.venv is not None
    venv = VENVS / entry.venv
    py = venv_python(venv)
    if not py.exists():
        if no_install:
            raise StepError(f"{venv.relative_to(ROOT)} does not exist (and --no-install was given)")
        log(f"creating {venv.relative_to(ROOT)}")
        res = run_logged([base_python(), "-m", "venv", str(venv)], logfile, env=clean_env())
        if res.returncode != 0:
            raise StepError(f"python -m venv failed: {tail(res.stdout, 5)}")
    info = probe(str(py), logfile)
    need_torch = not torch_matches(info, entry)
    need_pkgs = bool(info.get("missing")) or not kernels_ok(info.get("kernels"))
    need_cuda = entry.cuda == "pip" and pip_nvidia_dir(venv) is None
    if need_torch or need_pkgs or need_cuda:
        if no_install:
            raise StepError(f"{venv.relative_to(ROOT)} lacks {entry.torch} or {info.get('missing')} (--no-install)")
        if need_cuda:
            # The compiler wheels first (tens of MB): when they cannot compile, say so before
            # downloading torch (GBs).
            log(f"pip install into {venv.relative_to(ROOT)}: {' '.join(entry.packages)}")
            res = run_logged([str(py), "-m", "pip", "install", *entry.packages], logfile,
                             env={**clean_env(), **entry.pip_env})
            if res.returncode != 0:
                errs = [l for l in res.stdout.splitlines() if l.startswith("ERROR")]
                raise StepError("pip install of the CUDA compiler failed: " + ("; ".join(errs) or tail(res.stdout, 5)))
            make_pip_cuda_home(venv, logfile)  # raises with the reason when there is no usable nvcc
        # A torch that is already installed at the right version is never reinstalled:
        # pip leaves satisfied requirements alone (no --upgrade).
        reqs = [entry.torch, *COMMON, *entry.packages]
        log(f"pip install into {venv.relative_to(ROOT)}: {' '.join(reqs)} (log: {logfile.relative_to(ROOT)})")
        t0 = time.time()
        res = run_logged([str(py), "-m", "pip", "install", *reqs], logfile, env={**clean_env(), **entry.pip_env})
        if res.returncode != 0:
            errs = [l for l in res.stdout.splitlines() if l.startswith("ERROR")]
            raise StepError("pip install failed: " + ("; ".join(errs) or tail(res.stdout, 5)))
        log(f"pip install done in {time.time() - t0:.0f}s")
        info = probe(str(py), logfile)
        if not torch_matches(info, entry):
            raise StepError(f"{venv.relative_to(ROOT)} has torch {info.get('torch')} after pip install, wanted {entry.torch}")
    return str(py), info


def pip_nvidia_dir(venv: Path) -> Path | None:
    """site-packages/nvidia of the venv, when a pip CUDA compiler package is installed there."""
    for sp in sorted((venv / "lib").glob("python3*/site-packages")):
        nv = sp / "nvidia"
        if (nv / "cu13" / "bin").is_dir() or (nv / "cuda_nvcc").is_dir():
            return nv
    return None


def _link_tree(src: Path, dst: Path) -> None:
    """Make dst a real folder of symlinks to src's entries, merging into what is there."""
    dst.mkdir(parents=True, exist_ok=True)
    for f in sorted(src.iterdir()):
        if f.name in ("__init__.py", "__pycache__"):
            continue
        d = dst / f.name
        if not (d.exists() or d.is_symlink()):
            d.symlink_to(f)
        elif f.is_dir() and d.is_dir():
            if d.is_symlink():  # two wheels ship the same folder: merge one level deeper
                first = d.resolve()
                d.unlink()
                _link_tree(first, d)
            _link_tree(f, d)


def make_pip_cuda_home(venv: Path, logfile: Path) -> Path:
    """A CUDA_HOME made of symlinks into the venv's nvidia wheels: <venv>/cuda-home.

    build_variant.py (and torch.utils.cpp_extension) expect ``$CUDA_HOME/bin/nvcc``,
    ``$CUDA_HOME/include`` and ``$CUDA_HOME/lib64/libcudart.so``; nvcc itself finds cicc and
    libdevice under ``$(TOP)/nvvm``. The CUDA 13 wheels install one merged tree
    (``nvidia/cu13/{bin,include,lib,nvvm}``) with ``lib`` for ``lib64``; the CUDA 12 wheels
    spread over ``nvidia/cuda_nvcc``, ``nvidia/cuda_runtime``, ``nvidia/cuda_cccl``.
    """
    nv = pip_nvidia_dir(venv)
    if nv is None:
        raise StepError(f"no CUDA compiler wheel under {venv.relative_to(ROOT)}/lib/*/site-packages/nvidia")
    if (nv / "cu13" / "bin").is_dir():
        tops = [nv / "cu13"]
    else:
        tops = [nv / "cuda_nvcc", nv / "cuda_runtime", nv / "cuda_cccl", nv / "cuda_crt", nv / "nvvm"]
        tops = [t for t in tops if t.is_dir()]
    nvcc = [t / "bin" / "nvcc" for t in tops if (t / "bin" / "nvcc").exists()]
    if not nvcc:
        shipped = sorted(p.name for t in tops if (t / "bin").is_dir() for p in (t / "bin").iterdir())
        raise StepError(
            f"the pip CUDA compiler packages in {venv.relative_to(ROOT)} have no nvcc driver: "
            f"{', '.join(str(t.relative_to(nv.parent)) + '/bin' for t in tops if (t / 'bin').is_dir())} "
            f"contain only {shipped or 'nothing'} "
            "(PyPI's nvidia-cuda-nvcc-cu12 wheels ship ptxas, libnvvm and crt/ headers for JIT use, not the "
            "nvcc/cicc/cudafe++/fatbinary/nvlink toolchain); a CUDA 12 variant needs a CUDA 12 toolkit "
            "(e.g. /usr/local/cuda-12.x, or kernel-builder under Nix), and this machine has only CUDA 13.0"
        )
    cicc = [t for t in tops if (t / "nvvm" / "bin" / "cicc").exists()]
    if not cicc:
        raise StepError(f"nvcc found ({nvcc[0]}) but no nvvm/bin/cicc: install the nvvm package "
                        "(cuda-toolkit[nvvm] / nvidia-nvvm)")
    home = venv / "cuda-home"
    if home.exists():
        shutil.rmtree(home)
    home.mkdir()
    for t in tops:
        for sub, dst in (("bin", "bin"), ("include", "include"), ("nvvm", "nvvm"), ("lib", "lib64"),
                         ("lib64", "lib64")):
            if (t / sub).is_dir():
                _link_tree(t / sub, home / dst)
    lib64 = home / "lib64"
    libs = sorted(lib64.glob("libcudart.so.*")) if lib64.is_dir() else []
    if not libs:
        raise StepError("no libcudart.so.* in the pip CUDA packages (install the cudart/runtime package)")
    if not (lib64 / "libcudart.so").exists():
        (lib64 / "libcudart.so").symlink_to(libs[0].resolve())
    if not (home / "include" / "cuda_runtime.h").exists():
        raise StepError("no cuda_runtime.h in the pip CUDA packages (install the cudart/runtime package)")
    with open(logfile, "a") as fh:
        fh.write(f"\n[matrix] CUDA_HOME for the pip compiler: {home} (from {', '.join(map(str, tops))})\n")
    return home


# --------------------------------------------------------------------------------------
# checks run inside the variant's environment

CHECK = r'''
import importlib.util, json, os, sys, traceback
from pathlib import Path

mode, variant, variant_dir, repo_id, version, backend = sys.argv[1:7]
variant_dir = Path(variant_dir)
version = int(version)
out = {}

def emit():
    print("CHECK " + json.dumps(out))

if mode == "metadata":
    try:
        from kernels._rust import Metadata
        md = Metadata.read_from_file(variant_dir / "metadata.json")
        out["id"] = md.id
        out["version"] = md.version
        out["name"] = str(md.name.python_name)
        out["ok"] = True
    except Exception as e:
        out["ok"] = False
        out["error"] = f"{type(e).__name__}: {e}"
    emit()
    sys.exit(0)

# mode == "import": KERNELS_CACHE and HF_HUB_OFFLINE=1 are set by the caller.
import torch
import torch.nn.functional as F

out["gpu"] = bool(torch.cuda.is_available())
meta = json.loads((variant_dir / "metadata.json").read_text())
ns = meta["id"]
mod = None
how = None
errors = []
try:
    from kernels import get_kernel
    mod = get_kernel(repo_id, version=version)
    how = f"get_kernel({repo_id!r}, version={version})"
except Exception as e:
    errors.append(f"get_kernel: {type(e).__name__}: {e}")
    if backend == "cuda":
        try:
            mod = get_kernel(repo_id, version=version, backend="cuda")
            how = f"get_kernel({repo_id!r}, version={version}, backend='cuda')"
        except Exception as e2:
            errors.append(f"get_kernel(backend='cuda'): {type(e2).__name__}: {e2}")
if mod is None:
    # The loader's own mechanism (kernels/importer.py): import <variant>/__init__.py under metadata["id"].
    try:
        spec = importlib.util.spec_from_file_location(ns, variant_dir / "__init__.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[ns] = mod
        spec.loader.exec_module(mod)
        how = "importlib (spec_from_file_location under metadata id), not get_kernel"
    except Exception as e:
        errors.append(f"importlib: {type(e).__name__}: {e}")
out["how"] = how
out["errors"] = errors
if mod is None:
    out["ok"] = False
    emit()
    sys.exit(0)

loaded_from = Path(mod.__file__).parent
out["loaded_variant"] = loaded_from.name
checks = []
ok = loaded_from.name == variant
checks.append(f"loaded variant dir {loaded_from.name}" + ("" if ok else f" (expected {variant})"))

all_ops = sorted(n.split("::", 1)[1] for n in torch._C._dispatch_get_all_op_names() if n.startswith(ns + "::"))
out["ops"] = all_ops
key = "CUDA" if backend == "cuda" else "CPU"
with_kernel = [o for o in all_ops if torch._C._dispatch_has_kernel_for_dispatch_key(f"{ns}::{o}", key)]
out["ops_with_" + key.lower() + "_kernel"] = with_kernel
if not all_ops:
    ok = False
    checks.append(f"no op registered under {ns}")
elif not with_kernel:
    ok = False
    checks.append(f"no op of {ns} has a {key} kernel")
else:
    checks.append(f"{len(all_ops)} ops under {ns}, {len(with_kernel)} with a {key} kernel")

def silu_ref(x):
    d = x.shape[-1] // 2
    return F.silu(x[..., :d]) * x[..., d:]

def try_op(device):
    torch.manual_seed(0)
    x = torch.randn(8, 256, device=device)
    ref = silu_ref(x)
    results = []
    if "silu_and_mul" in all_ops and torch._C._dispatch_has_kernel_for_dispatch_key(
            f"{ns}::silu_and_mul", "CUDA" if device == "cuda" else "CPU"):
        o = torch.full_like(ref, float("nan"))
        getattr(torch.ops, ns).silu_and_mul(o, x)
        err = ((o - ref).norm() / ref.norm()).item()
        results.append((f"torch.ops.{ns}.silu_and_mul on {device}", err))
    if hasattr(mod, "silu_and_mul"):
        o = torch.full_like(ref, float("nan"))
        mod.silu_and_mul(o, x)
        err = ((o - ref).norm() / ref.norm()).item()
        results.append((f"fused_mlp.silu_and_mul on {device}", err))
    return results

calls = []
try:
    calls += try_op("cpu")
    if out["gpu"]:
        calls += try_op("cuda")
except Exception as e:
    ok = False
    checks.append(f"op call failed: {type(e).__name__}: {e}")
for name, err in calls:
    good = err == err and err < 1e-5  # NaN fails
    ok = ok and good
    checks.append(f"{name}: rel err {err:.2e}" + ("" if good else " (WRONG)"))
if not calls:
    checks.append("no silu_and_mul to call")
out["checks"] = checks
out["ok"] = ok and how is not None
emit()
'''


def run_check(python: str, mode: str, entry_backend: str, variant: str, repo_id: str, version: int,
              logfile: Path, env: dict) -> dict:
    vdir = BUILD / variant
    res = run_logged([python, "-c", CHECK, mode, variant, str(vdir), repo_id, str(version), entry_backend],
                     logfile, env=env, timeout=600)
    for line in res.stdout.splitlines():
        if line.startswith("CHECK "):
            return json.loads(line[6:])
    return {"ok": False, "error": tail(res.stdout, 8)}


# --------------------------------------------------------------------------------------
# one variant


def expected_variant(python: str, backend: str, logfile: Path) -> str:
    code = ("import sys; sys.path.insert(0, 'tools'); import build_variant as b; "
            f"print('VARIANT', b.variant_name({backend!r}))")
    res = run_logged([python, "-c", code], logfile, env=clean_env())
    for line in res.stdout.splitlines():
        if line.startswith("VARIANT "):
            return line.split()[1]
    raise StepError(f"cannot compute the variant name with {python}: {tail(res.stdout, 5)}")


def check_built_files(variant: str, version: int) -> list[str]:
    """Structural problems of build/<variant> (the same rules tools/publish.py enforces)."""
    vdir = BUILD / variant
    problems = []
    for f in ("metadata.json", "__init__.py", "_ops.py"):
        if not (vdir / f).is_file():
            problems.append(f"missing {f}")
    if (vdir / "metadata.json").is_file():
        md = json.loads((vdir / "metadata.json").read_text())
        sos = sorted(p.name for p in vdir.glob("*.so"))
        if f"{md.get('id')}.abi3.so" not in sos:
            problems.append(f"metadata id {md.get('id')} does not name a .so (have {sos})")
        if md.get("version") != version:
            problems.append(f"metadata version {md.get('version')} != build.toml version {version}")
    return problems


def run_entry(name: str, entry: Entry | None, args, conf: dict) -> dict:
    t_start = time.time()
    repo_id = conf["general"]["hub"]["repo-id"]
    version = conf["general"]["version"]
    row: dict = {
        "variant": name, "env": None, "python": None, "torch": None, "built": False,
        "abi_findings": None, "metadata_ok": False, "import_ok": False, "tests": "not run",
        "error": None,
    }
    logfile = LOGS / f"{name}.log"
    LOGS.mkdir(parents=True, exist_ok=True)
    logfile.write_text(f"[matrix] {name} started {time.ctime()}\n")
    row["log"] = str(logfile.relative_to(ROOT))
    try:
        env = clean_env()
        # ---- environment
        if args.system:
            py = sys.executable
            row["env"] = f"system ({py})"
            info = probe(py, logfile)
            if "torch" not in info:
                raise StepError(f"{py} has no torch: {info.get('torch_error')}")
            backend = entry.backend if entry else ("cuda" if info.get("torch_cuda") else "cpu")
            # kernel-abi-check is optional here (build_variant.py reports it as skipped) and pytest
            # is needed only for the tests; the loader is not.
            required = [m for m in info.get("missing", []) if m in ("kernels", "huggingface_hub")]
            if required:
                raise StepError(f"{py} lacks {required} (pip install --no-deps the carried wheels)")
            if "pytest" in info.get("missing", []):
                args.tests = "never"
        else:
            assert entry is not None
            if entry.venv is None:
                raise StepError("this entry has no venv recipe: run it with --system on the machine that has its torch")
            row["env"] = f".venvs/{entry.venv}"
            py, info = setup_venv(entry, logfile, no_install=args.no_install)
            backend = entry.backend
        row["python"] = info.get("python")
        row["torch"] = info.get("torch")
        row["gpu"] = info.get("gpu")
        if backend == "cuda":
            if entry is not None and entry.cuda == "pip" and not args.system:
                env["CUDA_HOME"] = str(make_pip_cuda_home(VENVS / entry.venv, logfile))
            elif "CUDA_HOME" not in env:
                env["CUDA_HOME"] = "/usr/local/cuda"
            nvcc = Path(env["CUDA_HOME"]) / "bin" / "nvcc"
            if not nvcc.exists():
                raise StepError(f"no nvcc at {nvcc} (set CUDA_HOME)")
            ver = subprocess.run([str(nvcc), "--version"], capture_output=True, text=True).stdout
            m = re.search(r"release (\d+\.\d+)", ver)
            row["nvcc"] = m.group(1) if m else "?"
            row["cuda_home"] = env["CUDA_HOME"]
        actual = expected_variant(py, backend, logfile)
        if actual != name and not (args.system and entry is None):
            raise StepError(f"this environment builds {actual}, not {name} (torch {info.get('torch')})")
        name = row["variant"] = actual
        if logfile.name != f"{name}.log":  # --system: the name is known only now
            new_log = LOGS / f"{name}.log"
            new_log.write_text(logfile.read_text())
            logfile.unlink()
            logfile = new_log
            row["log"] = str(logfile.relative_to(ROOT))

        # ---- build
        if args.skip_build:
            if not (BUILD / name / "metadata.json").exists():
                raise StepError(f"--skip-build but build/{name} is not built")
            row["built"] = "existing"
        else:
            cmd = [py, str(ROOT / "tools" / "build_variant.py"), "--backend", backend, "--jobs", str(args.jobs)]
            if args.archs:
                cmd += ["--archs", args.archs]
            log(f"{name}: building with {py} (--jobs {args.jobs}; log: {logfile.relative_to(ROOT)})")
            t0 = time.time()
            res = run_logged(cmd, logfile, env=env)
            row["build_seconds"] = round(time.time() - t0)
            if res.returncode != 0:
                raise StepError("build_variant.py failed: " + tail(res.stdout, 12))
            row["built"] = True
            log(f"{name}: built in {row['build_seconds']}s")
        problems = check_built_files(name, version)

        # ---- metadata
        md = run_check(py, "metadata", backend, name, repo_id, version, logfile, env)
        row["metadata_ok"] = bool(md.get("ok")) and not problems
        if problems or not md.get("ok"):
            row["metadata_error"] = "; ".join(problems + ([md.get("error", "")] if not md.get("ok") else []))

        # ---- kernel-abi-check
        abi_file = BUILD / "_work" / name / "abi-check.txt"
        if abi_file.exists():
            findings = [l for l in abi_file.read_text().splitlines() if l.strip()]
            skipped = any("not installed" in f for f in findings)
            row["abi_findings"] = "skipped" if skipped else len(findings)
            row["abi_details"] = findings
        else:
            row["abi_findings"] = "no report"

        # ---- import through get_kernel from a staged cache
        with tempfile.TemporaryDirectory(prefix="fused-mlp-matrix-cache-") as cache:
            res = run_logged([py, str(ROOT / "tools" / "stage_cache.py"), "--cache", cache, "--variant", name],
                             logfile, env=env)
            if res.returncode != 0:
                raise StepError("stage_cache.py failed: " + tail(res.stdout, 5))
            ienv = dict(env, KERNELS_CACHE=cache, HF_HUB_OFFLINE="1")
            imp = run_check(py, "import", backend, name, repo_id, version, logfile, ienv)
            row["import_ok"] = bool(imp.get("ok"))
            row["import_how"] = imp.get("how")
            row["import_detail"] = imp.get("checks") or imp.get("error")
            if imp.get("errors"):
                row["import_errors"] = imp["errors"]

            # ---- tests
            run_tests = args.tests == "always" or (
                args.tests == "auto" and (backend == "cpu" or bool(info.get("gpu"))))
            if not run_tests:
                row["tests"] = "skipped (CUDA variant, no GPU)" if args.tests == "auto" else "skipped"
            else:
                log(f"{name}: pytest tests -q")
                t0 = time.time()
                res = run_logged([py, "-m", "pytest", "tests", "-q", "-p", "no:cacheprovider"], logfile,
                                 env=ienv, timeout=args.test_timeout)
                summary = [l for l in res.stdout.splitlines()
                           if re.search(r"\d+ (passed|failed|error)", l) or "no tests ran" in l]
                s = summary[-1].strip("= ") if summary else tail(res.stdout, 1)
                if res.returncode == 5:  # pytest: no tests collected
                    row["tests"] = "no tests collected"
                else:
                    row["tests"] = ("ok: " if res.returncode == 0 else f"FAILED (rc {res.returncode}): ") + s
                    row["tests_ok"] = res.returncode == 0
                row["tests_seconds"] = round(time.time() - t0)
    except StepError as e:
        row["error"] = str(e)
        log(f"{name}: STOPPED: {e}")
    row["seconds"] = round(time.time() - t_start)
    return row


# --------------------------------------------------------------------------------------
# report


def fmt(v) -> str:
    if v is True:
        return "yes"
    if v is False:
        return "no"
    if v is None:
        return "-"
    return str(v)


def print_table(rows: list[dict]) -> None:
    cols = [("variant", "variant"), ("built", "built?"), ("abi_findings", "abi findings"),
            ("metadata_ok", "metadata ok"), ("import_ok", "import ok"), ("tests", "tests")]
    table = [[h for _, h in cols]] + [[fmt(r.get(k)) for k, _ in cols] for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(cols))]
    print()
    for i, row in enumerate(table):
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
        if i == 0:
            print("  ".join("-" * w for w in widths))
    for r in rows:
        if r.get("error"):
            print(f"\n{r['variant']}: stopped: {r['error']}")
        if r.get("metadata_error"):
            print(f"\n{r['variant']}: metadata: {r['metadata_error']}")
        if r.get("import_how") and "importlib" in str(r.get("import_how")):
            print(f"\n{r['variant']}: imported with {r['import_how']}; get_kernel errors: {r.get('import_errors')}")
        if r.get("import_ok") is False and r.get("import_detail"):
            print(f"\n{r['variant']}: import: {r['import_detail']}")
    print()


def write_report(rows: list[dict], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    old = []
    if path.exists():
        try:
            old = json.loads(path.read_text()).get("variants", [])
        except Exception:
            old = []
    # Keep rows of variants not run this time (a report accumulates across machines/runs).
    names = {r["variant"] for r in rows}
    merged = [r for r in old if r.get("variant") not in names] + rows
    report = {
        "generated": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "host": platform.node(),
        "machine": f"{platform.machine()}-{platform.system().lower()}",
        "variants": sorted(merged, key=lambda r: r["variant"]),
    }
    path.write_text(json.dumps(report, indent=2) + "\n")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("variants", nargs="*", help="matrix entries to build (default: every entry that has a venv recipe)")
    p.add_argument("--list", action="store_true", help="list the known entries and exit")
    p.add_argument("--system", action="store_true",
                   help="use the current interpreter, no venv (machines with torch preinstalled and no network)")
    p.add_argument("--jobs", type=int, default=1, help="parallel compiles inside one build (default 1)")
    p.add_argument("--archs", default=None, help="override CUDA capabilities (passed to build_variant.py)")
    p.add_argument("--skip-build", action="store_true", help="check the existing build/<variant> only")
    p.add_argument("--no-install", action="store_true", help="never create venvs or pip install")
    p.add_argument("--tests", choices=["auto", "always", "never"], default="auto",
                   help="auto: CPU variants, and CUDA variants when a GPU is visible")
    p.add_argument("--test-timeout", type=float, default=1800)
    p.add_argument("--report", type=Path, default=REPORT)
    a = p.parse_args()

    if a.list:
        w = max(len(n) for n in MATRIX)
        for n, e in MATRIX.items():
            where = f".venvs/{e.venv}" if e.venv else "--system"
            have = ""
            if e.venv:
                have = " (exists)" if venv_python(VENVS / e.venv).exists() else " (not created yet)"
            print(f"{n.ljust(w)}  {where}{have}\n{'':{w}}  {e.note}")
        return 0

    conf = read_build_toml()
    if a.system:
        if len(a.variants) > 1:
            p.error("--system builds the one variant of the current interpreter")
        names = a.variants or [None]
    else:
        names = a.variants or [n for n, e in MATRIX.items() if e.venv is not None]
    unknown = [n for n in names if n is not None and n not in MATRIX]
    if unknown:
        p.error(f"unknown variant(s) {unknown}; known: {', '.join(MATRIX)} (see --list)")

    rows = []
    for n in names:
        entry = MATRIX.get(n) if n else None
        rows.append(run_entry(n or "system-interpreter", entry, a, conf))
    write_report(rows, a.report)
    print_table(rows)
    print(f"[matrix] report: {a.report.relative_to(ROOT) if a.report.is_relative_to(ROOT) else a.report}")
    bad = [r for r in rows if r.get("error") or not r.get("metadata_ok") or not r.get("import_ok")
           or r.get("tests_ok") is False]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
