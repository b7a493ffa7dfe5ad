"""The narrow tail on / off (FUSED_MLP_SM90_NARROW_TAIL=0 set around each "ours_notail" call) inside
our forward and training step, timed with the peers by bench_mlp.alternating (3 rounds), the two
forms' results bit-compared: the bf16 forward cases and the gated training cases whose names
contain one of the comma-separated patterns (session 23, NOTES).

    KERNELS_CACHE=.hub-cache HF_HUB_OFFLINE=1 python3 benchmarks/micro/narrow_tail_ab.py OUT.json swiglu_m4096
"""
import json
import os
import sys
import time

import torch
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1]))
import bench_mlp as B
import bench_train as T
from _common import run_info, with_env
from kernels import get_kernel

fm = get_kernel("org/fused-mlp", version=1)
res = {**run_info("cuda"), "command": "python3 benchmarks/micro/narrow_tail_ab.py " + " ".join(sys.argv[1:]), "rows": []}
pats = sys.argv[2].split(",")
ROUNDS = 3


def off(fn):
    """fn with the narrow tail switched off (the op reads the switch at each call)."""
    return with_env(fn, "FUSED_MLP_SM90_NARROW_TAIL", "0")


liger = B.load_liger()
os.environ.pop("FUSED_MLP_SM90_NARROW_TAIL", None)
for c in B.all_cases():
    if c.dtype != torch.bfloat16 or not any(p in c.name for p in pats):
        continue
    torch._dynamo.reset()
    compiled = {"gated": torch.compile(B.eager_gated, dynamic=False), "mlp": torch.compile(B.eager_mlp, dynamic=False)}
    t = B.make_inputs(c, "cuda", seed=1000)
    impl = {k: v for k, v in B.implementations(c, t, fm, compiled, liger).items() if v is not None}
    impl["ours_notail"] = off(impl["ours"])
    with torch.inference_mode():
        bit = torch.equal(impl["ours"](), impl["ours_notail"]())
        med, per = B.alternating_rounds(impl, 1500, "cuda", ROUNDS)
    best = min(med[p] for p in ("eager", "compile", "liger") if p in med)
    row = {"what": c.name, "ms": med, "rounds": per, "bit_identical": bit, "ours_over_best": med["ours"] / best,
           "notail_over_best": med["ours_notail"] / best, "tail_over_notail": med["ours"] / med["ours_notail"]}
    print(json.dumps({k: v for k, v in row.items() if k != "rounds"}), flush=True)
    res["rows"].append(row)
    del t, impl
    torch.cuda.empty_cache()
for c in T.all_cases():
    if not any(p in c.name for p in pats) or c.kind != "gated":
        continue
    torch._dynamo.reset()
    compiled = {"gated": torch.compile(B.eager_gated, dynamic=False), "mlp": torch.compile(B.eager_mlp, dynamic=False)}
    t = T.make_inputs(c, seed=1000)
    ps, dy = T.params(t), t["dy"]
    fwds = T.forward_fns(c, t, fm, compiled, liger)
    fwds.pop("ours_recompute")
    steps = {k: T.train_step(f, dy) for k, f in fwds.items() if f is not None}
    steps["ours_notail"] = off(steps["ours"])
    g1, g0 = T.grads_of(steps["ours"], ps), T.grads_of(steps["ours_notail"], ps)
    bit = all(torch.equal(a, b) for a, b in zip(g1, g0))

    def no_grads(ps=ps):
        for p in ps:
            p.grad = None

    med, per = B.alternating_rounds(steps, 2000, "cuda", ROUNDS, before=no_grads)
    best = min(med[p] for p in ("eager", "compile", "liger") if p in med)
    row = {"what": c.name, "ms": med, "rounds": per, "bit_identical": bit, "ours_over_best": med["ours"] / best,
           "notail_over_best": med["ours_notail"] / best, "tail_over_notail": med["ours"] / med["ours_notail"]}
    print(json.dumps({k: v for k, v in row.items() if k != "rounds"}), flush=True)
    res["rows"].append(row)
    del t, steps, fwds
    torch.cuda.empty_cache()
res["date"] = time.strftime("%Y-%m-%d %H:%M")
json.dump(res, open(sys.argv[1], "w"), indent=1)
