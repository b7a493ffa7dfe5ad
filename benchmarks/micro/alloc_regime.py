#!/usr/bin/env python3
"""Which allocations put our SwiGLU M 128 call in its fast regime? Session 38 found the gate/up
kernel ~0.8 us faster on a process's first large allocation than on later ones (NOTES, session
38, call 8), and transformers' loader reserves one block of the model's size before it loads
the weights (`caching_allocator_warmup`), so a loaded model's weights are carved out of an
early allocation. Run one layout per process (the effect is about a process's history):

  first         the operands are the process's first large allocation
  after:G       G GiB allocated and kept first, then the operands
  reserve:G     G GiB reserved and freed first (the loader's warm-up), the operands carved from it
  model         a Llama-shaped model (hidden 4096, intermediate 14336, --layers layers, random
                weights) saved with safetensors and loaded by from_pretrained onto the GPU; each
                timed layer's MLP weights as loaded

In each process the same values are then allocated again ("later": after a 2 GiB pad kept
alive), and fused-mlp and torch.compile are timed as CUDA graphs on both copies, interleaved
call by call with L2 evicted by a fill (_common.interleaved_us).

    KERNELS_CACHE=.hub-cache HF_HUB_OFFLINE=1 python3 benchmarks/micro/alloc_regime.py --layout first [--out F]
    ... --layout model --layers 4 --time-layers 0,3
    ... --dry-run   (CPU, tiny sizes, one call each, nothing timed: the script's own check)
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _common import DTYPES, graphed, interleaved_us, local_package, swiglu_eager, write_report  # noqa: E402


def weights(d, h, dtype, device, seed=1000):
    """Wg, Wu [h, d], Wd [d, h] as _common.swiglu_operands scales them, but made on the CPU and
    copied: each is then one allocation on the device, with no temporaries allocated (and
    freed) ahead of it, which would take the "first allocation" place this script studies."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    wg = (torch.randn(h, d, generator=g) * d**-0.5).to(device=device, dtype=dtype)
    wu = (torch.randn(h, d, generator=g) * d**-0.5).to(device=device, dtype=dtype)
    wd = (torch.randn(d, h, generator=g) * h**-0.5).to(device=device, dtype=dtype)
    return wg, wu, wd


def loaded_mlps(layers: int, d: int, h: int, dtype, device, tmp: Path) -> list:
    """[(wg, wu, wd)] of each layer of a Llama-shaped model with random weights, saved with
    safetensors and loaded by from_pretrained onto `device` (the loader's own allocation path)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(hidden_size=d, intermediate_size=h, num_hidden_layers=layers, num_attention_heads=max(1, d // 128),
                      num_key_value_heads=max(1, d // 512), vocab_size=1024, max_position_embeddings=256)
    torch.manual_seed(1000)
    LlamaForCausalLM(cfg).to(dtype).save_pretrained(tmp)
    try:
        model = LlamaForCausalLM.from_pretrained(tmp, dtype=dtype, device_map=device)
        how = "from_pretrained(device_map=...)"
    except ValueError as e:  # device_map needs accelerate: reserve as the loader would, then move
        print(f"[alloc-regime] {e}; loading on the CPU, reserving the model's size on {device}, then .to()")
        model = LlamaForCausalLM.from_pretrained(tmp, dtype=dtype)
        nbytes = sum(t.numel() * t.element_size() for t in model.state_dict().values())
        block = torch.empty(nbytes, dtype=torch.uint8, device=device)
        del block
        model = model.to(device)
        how = "from_pretrained, a block of the model's size reserved, .to(device)"
    print(f"[alloc-regime] model loaded by {how}")
    return [(lay.mlp.gate_proj.weight, lay.mlp.up_proj.weight, lay.mlp.down_proj.weight) for lay in model.model.layers]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layout", default="first", help="first | after:G | reserve:G | model")
    ap.add_argument("--m", type=int, default=128)
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    ap.add_argument("--layers", type=int, default=4, help="model layout: the model's layers")
    ap.add_argument("--time-layers", default="0,-1", help="model layout: the layers timed")
    ap.add_argument("--reps", type=int, default=60)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    dt = DTYPES[args.dtype]
    device, d, h, pad_gib = ("cpu", 64, 160, 0) if args.dry_run else ("cuda", 4096, 14336, 2)
    fm, = local_package()
    compiled = torch.compile(swiglu_eager, dynamic=False)
    x = torch.randn(args.m, d, generator=torch.Generator().manual_seed(999)).to(device=device, dtype=dt)  # 1 MB
    kept = []
    sets = {}
    if args.layout == "model":
        with tempfile.TemporaryDirectory() as tmp:
            mlps = loaded_mlps(args.layers, d, h, dt, device, Path(tmp))
        for i in (int(v) for v in args.time_layers.split(",")):
            sets[f"layer{i % args.layers}"] = (x, *mlps[i])
    else:
        kind, _, size = args.layout.partition(":")
        nbytes = int(float(size or 0) * (1 << 30)) if not args.dry_run else 1 << 20
        if kind == "after":
            kept.append(torch.empty(nbytes, dtype=torch.uint8, device=device))
        elif kind == "reserve":
            block = torch.empty(nbytes, dtype=torch.uint8, device=device)
            del block  # stays in the allocator's cache: the operands are carved out of it
        elif kind != "first":
            raise SystemExit(f"unknown layout {args.layout!r}")
        sets["first"] = (x, *weights(d, h, dt, device))
    kept.append(torch.empty(pad_gib << 30 if pad_gib else 1, dtype=torch.uint8, device=device))
    first = next(iter(sets.values()))
    sets["later"] = (x, *(w.clone() for w in first[1:]))  # the same values, allocated now
    fns, errs = {}, {}
    with torch.inference_mode():
        for name, ops in sets.items():
            ref = swiglu_eager(*(t.double() for t in ops))
            fns[f"ours_{name}"] = lambda ops=ops: fm.gated_mlp(*ops, "silu")
            fns[f"compile_{name}"] = lambda ops=ops: compiled(*ops)
            for n in (f"ours_{name}", f"compile_{name}"):
                errs[n] = ((fns[n]().double() - ref).norm() / ref.norm()).item()
        bad = {n: e for n, e in errs.items() if not e < 2e-2}  # bf16 / fp16 outputs of an O(1) block
        if bad:
            raise SystemExit(f"[alloc-regime] wrong results (rel. error against fp64): {bad}")
        if args.dry_run:
            print("[alloc-regime] dry run:", {n: f"{e:.1e}" for n, e in errs.items()})
            return
        graphs = {n: graphed(f) for n, f in fns.items()}
        times = interleaved_us(graphs, reps=args.reps, rounds=args.rounds)
    rows = []
    for n, (us, per_round) in times.items():
        rows.append({"call": n, "us": us, "rounds_us": per_round, "rel_err_vs_fp64": errs[n]})
        print(f"[alloc-regime] {args.layout} {args.dtype} {n:>16s}: {us:7.2f} us (rounds "
              + " ".join(f"{t:.2f}" for t in per_round) + ")", flush=True)
    write_report(args.out, rows, layout=args.layout, m=args.m, dtype=args.dtype)


if __name__ == "__main__":
    main()
