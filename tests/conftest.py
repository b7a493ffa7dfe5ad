"""Shared test set-up: load fused-mlp the way users do, through kernels.get_kernel.

tools/test.sh builds the variant for the installed torch and stages it into
.hub-cache/ first; here we point the loader at that cache, offline, before
`kernels` is imported anywhere.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
REPO_ID = "org/fused-mlp"

os.environ.setdefault("KERNELS_CACHE", str(ROOT / ".hub-cache"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# On a GPU, timing every candidate tile config for each new shape compiles a few hundred
# Triton kernels across the suite. Correctness tests take the first config instead; every
# config is checked by the *every_config tests, and the autotune tests turn it back on.
os.environ.setdefault("FUSED_MLP_AUTOTUNE", "0")

import torch  # noqa: E402

HAS_CUDA = torch.cuda.is_available()


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU (skipped without one)")
    config.addinivalue_line("markers", "slow: long-running")


def pytest_collection_modifyitems(config, items):
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def fused_mlp():
    """The fused_mlp package as get_kernel("org/fused-mlp", version=1) loads it."""
    from kernels import get_kernel

    return get_kernel(REPO_ID, version=1)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in float64; NaN anywhere fails every bound."""
    out = out.double()
    ref = ref.double()
    if not torch.isfinite(out).all():
        return float("inf")
    denom = ref.norm().item()
    return (out - ref).norm().item() / (denom if denom > 0 else 1.0)


def submodule(fm, name: str):
    """The loaded package's submodule `name`. get_kernel imports the package under the build's
    op namespace, so its submodules are `<that name>.<name>`; some are shadowed by the package
    attribute of the same name (`fused_mlp.act_and_mul` is the function)."""
    return importlib.import_module(f"{fm.__name__}.{name}")


def poison_like(t: torch.Tensor) -> torch.Tensor:
    """An output buffer full of NaN, so that an unwritten element fails the check."""
    return torch.full_like(t, float("nan"))


def need_sm90(fm) -> None:
    """Skip unless the GPU is sm_90 and this build has the sm_90a kernels (one file
    registers all three ops)."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the sm_90a kernels run on sm_90 GPUs only")
    has = submodule(fm, "act_and_mul").has_compiled_kernel
    if not has("gated_gemm_sm90", torch.device("cuda")):
        pytest.skip("this build has no sm_90a kernels")


def need_interpreter(fm):
    """Skip unless Triton's interpreter can run the package's kernels here (Triton imports,
    and triton_gemm.interpreter_blocker has no objection to its and NumPy's versions);
    returns the triton_gemm module."""
    pytest.importorskip("triton")
    tg = submodule(fm, "triton_gemm")
    blocker = tg.interpreter_blocker()
    if blocker is not None:
        pytest.skip(blocker)
    return tg


def recording_backend(graphs: list, inner: str = "aot_eager"):
    """A torch.compile backend that keeps each graph dynamo makes, then hands it to inner."""

    def backend(gm, example_inputs):
        graphs.append(gm)
        return torch._dynamo.lookup_backend(inner)(gm, example_inputs)

    return backend


def package_op_calls(fm, graphs) -> dict:
    """{op name: calls} of the package's own ops in dynamo graphs (what a compiled model
    runs, where the layers' counters do not count)."""
    prefix = fm.ops.name + "."
    calls: dict = {}
    for gm in graphs:
        for node in gm.graph.nodes:
            target = str(node.target)
            if node.op == "call_function" and target.startswith(prefix):
                name = target[len(prefix):].split(".")[0]
                calls[name] = calls.get(name, 0) + 1
    return calls


def spy(monkeypatch, mod, name: str, key) -> list:
    """Wrap mod.<name> so that every call appends key(args) to the returned list and then
    runs the real function."""
    calls = []
    real = getattr(mod, name)
    monkeypatch.setattr(mod, name, lambda *a: calls.append(key(a)) or real(*a))
    return calls


def sm90_template_args(run) -> list:
    """The template arguments of the one sm_90a kernel run() launches, as torch.profiler
    names it: gated_gemm_kernel<T, Activation, BN, Epi, BNMajor> -> [T, ..., BNMajor]. For
    choices whose results are bit-identical, where only the kernel's name tells them apart."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if "gated_gemm_kernel<" in e.name]
    assert len(names) == 1, names
    return names[0].split("gated_gemm_kernel<", 1)[1].split(">", 1)[0].split(", ")


def kernel_variants(cfg, tma_flags) -> list:
    """A Triton tile config as each kernel flavour the GPU test runs: pointer loads, and with
    True in tma_flags also TMA loads and the persistent TMA kernel."""
    out = [cfg._replace(tma=False)]
    if True in tma_flags:
        out += [cfg._replace(tma=True), cfg._replace(tma=True, persistent=True)]
    return out

