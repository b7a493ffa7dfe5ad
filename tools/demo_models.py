#!/usr/bin/env python3
"""Kernelize tiny transformers models with fused_mlp.mapping and check them.

Builds a tiny Llama and a tiny GPT-2 from configs (random weights, no download),
kernelizes each with `fused_mlp.mapping.kernelize` (fused-mlp loaded through
`kernels.get_kernel`), prints what was patched and checks the logits against the
unpatched model. On a GPU machine it also times a Llama-3-8B-sized MLP module
(hidden 4096, intermediate 14336, 4096 tokens, bf16): kernelized vs eager.

    python tools/demo_models.py                 # uses .hub-cache/ offline (tools/stage_cache.py)
    python tools/demo_models.py --no-timing

From tools/demo.py: `demo_models.run(fused_mlp, device)` returns the failed checks.
Under a minute on CPU.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
REPO_ID = "org/fused-mlp"
sys.path.insert(0, str(ROOT / "benchmarks"))
from _common import call_order, rel_err  # noqa: E402  (the benchmarks' rotation of who goes first, their error)

# fp32 (CPU): same sums in another order, ~1e-7 relative; a wrong activation is off by >1e-3.
FP32_BOUND = 1e-5


def tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=256, intermediate_size=688, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=512, max_position_embeddings=128)
    return LlamaForCausalLM(cfg).eval()


def tiny_gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(n_embd=256, n_layer=2, n_head=4, vocab_size=512, n_positions=128, bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(cfg).eval()


def _check(label, ok, detail, failures):
    print(f"  {label:<40} {detail}  {'ok' if ok else 'FAIL'}")
    if not ok:
        failures.append(label)


def kernelize_models(fm, device: str) -> list[str]:
    from kernels import Mode

    failures: list[str] = []
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    print(f"\n== kernelize tiny transformers models with fused_mlp.mapping ({device}, {str(dtype)[6:]}) ==")
    ids = torch.randint(0, 512, (2, 33), generator=torch.Generator().manual_seed(1)).to(device)
    for name, build in (("llama", tiny_llama), ("gpt2", tiny_gpt2)):
        model = build().to(device, dtype)
        with torch.no_grad():
            ref = model(ids).logits
            exact = copy.deepcopy(model).double()(ids).logits if dtype != torch.float32 else None
        t0 = time.time()
        fm.mapping.kernelize(model, mode=Mode.INFERENCE, device=device)
        dt = time.time() - t0
        replaced = fm.mapping.kernelized_modules(model)
        mlps = [p for p, m in model.named_modules() if type(m).__name__.endswith("MLP")]
        print(f"  {name}: {fm.mapping.explain(model)}; {len(replaced)}/{len(mlps)} MLP modules "
              f"kernelized in {dt * 1e3:.0f} ms")
        fm.layers.reset_counters()
        with torch.no_grad():
            out = model(ids).logits
        _check(f"{name}: every MLP forward replaced", sorted(replaced) == sorted(mlps) and len(mlps) > 0,
               f"{sorted(set(replaced.values()))}", failures)
        _check(f"{name}: fused path ran", sum(fm.layers.FUSED_CALLS.values()) == len(mlps),
               f"fused {fm.layers.FUSED_CALLS}, original {fm.layers.ORIGINAL_CALLS}", failures)
        if exact is None:
            err = rel_err(out, ref)
            _check(f"{name}: logits vs unpatched", err < FP32_BOUND,
                   f"rel err {err:.2e} (bound {FP32_BOUND:.0e})", failures)
        else:
            err, eager_err = rel_err(out, exact), rel_err(ref, exact)
            bound = 2 * eager_err + 1e-3
            _check(f"{name}: logits vs float64", err <= bound,
                   f"rel err {err:.2e}, eager bf16 {eager_err:.2e} (bound 2x eager + 1e-3)", failures)
        fm.mapping.unpatch(model)
    return failures


def _bench(fn) -> float:
    """Median milliseconds of one short block of calls."""
    try:
        import triton.testing

        return triton.testing.do_bench(fn, warmup=10, rep=50, return_mode="median")
    except ImportError:
        for _ in range(5):
            fn()
        times = []
        for _ in range(20):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        return sorted(times)[len(times) // 2]


def bench_interleaved(fns: dict, rounds: int = 6, time_ms=_bench) -> dict:
    """{name: median milliseconds} over `rounds` short blocks per function, the blocks of the
    functions taking turns and the first of each round rotating. Timed one after the other, the
    second of two equal GPU-bound functions reads slower (the card warms and its clock drops at
    the power limit: the demo once printed 0.95x for a module faster than eager); in turns, that
    drift falls on each alike."""
    names = list(fns)
    per_name: dict = {n: [] for n in names}
    for r in range(rounds):
        for n in call_order(names, r):
            per_name[n].append(time_ms(fns[n]))
    return {n: statistics.median(v) for n, v in per_name.items()}


def time_model_mlp(fm) -> list[str]:
    """A Llama-3-8B-sized LlamaMLP, kernelized, against its own (class) forward in eager."""
    from kernels import Mode
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaMLP

    failures: list[str] = []
    tokens, d, h = 4096, 4096, 14336
    print(f"\n== a Llama-3-8B-sized MLP module ({tokens} tokens, {d}->{h}->{d}, bf16) ==")
    torch.manual_seed(0)
    with torch.device("cuda"):
        mlp = LlamaMLP(LlamaConfig(hidden_size=d, intermediate_size=h, hidden_act="silu")).to(torch.bfloat16).eval()
    for lin in (mlp.gate_proj, mlp.up_proj, mlp.down_proj):
        torch.nn.init.normal_(lin.weight, std=lin.in_features ** -0.5)
    x = torch.randn(tokens, d, device="cuda", dtype=torch.bfloat16)
    fm.mapping.kernelize(mlp, mode=Mode.INFERENCE, device="cuda")
    eager = lambda: LlamaMLP.forward(mlp, x)  # noqa: E731 - the class's forward is the original
    fused = lambda: mlp(x)  # noqa: E731
    with torch.no_grad():
        fm.layers.reset_counters()
        y = fused()
        ran = fm.layers.FUSED_CALLS.get("GatedMLP", 0) == 1
        err = rel_err(y, eager())
        _check("8B MLP: kernelized output vs eager", ran and err < 3e-2,
               f"rel err {err:.2e} (bound 3e-2: two bf16 roundings of h)", failures)
        t = bench_interleaved({"eager": eager, "fused": fused})
        t_eager, t_fused = t["eager"], t["fused"]
    flops = 2 * tokens * d * h * 3
    print(f"  eager     {t_eager * 1e3:8.1f} us  ({flops / t_eager / 1e9:6.0f} TFLOP/s)")
    print(f"  kernelized{t_fused * 1e3:8.1f} us  ({flops / t_fused / 1e9:6.0f} TFLOP/s)  "
          f"speedup {t_eager / t_fused:.2f}x")
    fm.mapping.unpatch([LlamaMLP])
    return failures


def run(fm, device: str, timing: bool | None = None) -> list[str]:
    """Kernelize and check the tiny models; on CUDA also time a model-sized MLP.
    Returns the labels of failed checks."""
    failures = kernelize_models(fm, device)
    if timing is None:
        timing = not os.environ.get("FUSED_MLP_DEMO_NO_TIMING")
    if device == "cuda" and timing:
        failures += time_model_mlp(fm)
    return failures


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cache", type=Path, default=None,
                   help="local Hub cache (offline); default: $KERNELS_CACHE, else .hub-cache/")
    p.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    p.add_argument("--no-timing", action="store_true")
    a = p.parse_args()
    if a.cache is not None:
        os.environ["KERNELS_CACHE"] = str(a.cache)
    os.environ.setdefault("KERNELS_CACHE", str(ROOT / ".hub-cache"))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from kernels import get_kernel

    t0 = time.time()
    fm = get_kernel(REPO_ID, version=1)
    device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    print(f"fused-mlp: get_kernel({REPO_ID!r}, version=1) -> {fm.__name__} in {time.time() - t0:.1f}s")
    failures = run(fm, device, timing=not a.no_timing)
    print(f"\n{'ALL MODEL CHECKS PASSED' if not failures else 'FAILED: ' + ', '.join(failures)}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
