"""A/B (session 26): the gated training forward's gate/up stage fused (one kernel storing
g | u and h) against two cuBLAS GEMMs into g | u's halves + our silu_and_mul, then the down
GEMM, alternating calls, 3 rounds; "_only" rows without the down GEMM.

    KERNELS_CACHE=.hub-cache HF_HUB_OFFLINE=1 python3 benchmarks/micro/train_fwd_unfused_ab.py OUT.json"""
import datetime, importlib, json, sys, pathlib
import torch
import triton
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import bench_mlp as B
from kernels import get_kernel
fm = get_kernel("org/fused-mlp", version=1)
tg = importlib.import_module(fm.__name__ + ".triton_gemm")
act = fm.activations.ACTIVATION_IDS["silu"]
out = {"info": {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
                "date": datetime.datetime.now(datetime.timezone.utc).isoformat(), "command": " ".join(sys.argv)}}
for m, d, h in [(4096, 4096, 14336), (8192, 768, 3072)]:
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(m, d, device="cuda", dtype=torch.bfloat16, generator=g)
    wg = torch.randn(h, d, device="cuda", dtype=torch.bfloat16, generator=g) * d**-0.5
    wu = torch.randn(h, d, device="cuda", dtype=torch.bfloat16, generator=g) * d**-0.5
    wd = torch.randn(d, h, device="cuda", dtype=torch.bfloat16, generator=g) * h**-0.5
    gu = torch.empty(m, 2 * h, device="cuda", dtype=torch.bfloat16)
    hb = torch.empty(m, h, device="cuda", dtype=torch.bfloat16)
    def fused():
        tg.gated_linear(x, wg, wu, None, None, act, pre=gu, out=hb)
        return torch.nn.functional.linear(hb, wd)
    def unfused():
        torch.mm(x, wg.t(), out=gu[:, :h]); torch.mm(x, wu.t(), out=gu[:, h:])
        fm.silu_and_mul(hb, gu)
        return torch.nn.functional.linear(hb, wd)
    def fused_only():
        tg.gated_linear(x, wg, wu, None, None, act, pre=gu, out=hb)
    def unfused_only():
        torch.mm(x, wg.t(), out=gu[:, :h]); torch.mm(x, wu.t(), out=gu[:, h:])
        fm.silu_and_mul(hb, gu)
    y1 = fused().float(); gu1 = gu.clone(); y2 = unfused().float()
    err = ((y1 - y2).norm() / y2.norm()).item(); gerr = ((gu1.float() - gu.float()).norm() / gu.float().norm()).item()
    med, per = B.alternating_rounds({"fused": fused, "unfused": unfused, "fused_only": fused_only, "unfused_only": unfused_only}, 1500, "cuda", 3)
    key = f"m{m}_d{d}_h{h}"
    out[key] = {"median_ms": med, "rounds_ms": per, "y_rel_diff": err, "gu_rel_diff": gerr}
    print(key, json.dumps(out[key]), flush=True)
json.dump(out, open(sys.argv[1], "w"), indent=1)
