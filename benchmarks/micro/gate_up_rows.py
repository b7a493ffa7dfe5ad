#!/usr/bin/env python3
"""Why the gate/up stage is slower with fewer rows of x (session 79; a probe, nothing here is
used by the package).

Session 79's micro/general_small_m.py on an H100 timed the sm_90a gate/up kernel of Llama-3-8B's
MLP (x [M, 4096] against two [14336, 4096] weights) at 87.3 us per call at M 1 and 82.7 at M 64,
though its plan is the same for every M of 1-128 (one row block of 128 rows, the same tiles, the
same weight bytes). Two things differ with M: how many of the 128 rows the TMA box of x finds in
bounds (the rest are filled with zeros by the copy engine), and how many rows hold data at all.
This separates them, at each M, under CUDA graphs over LAYERS weight sets, interleaved:
    rows       x [M, D] with FUSED_MLP_SM90_FIT_X=0: the 128-row box (M rows in bounds, 128 - M
               filled), the op as it was before session 79
    zero_pad   x [128, D] whose first M rows are the same values and the rest zeros: every row
               in bounds, the same data as `rows` (its h is 128 rows, M of them the same)
    full       x [128, D] all random (the same at every M: the run's drift control)
    rows_fit   x [M, D] with FUSED_MLP_SM90_FIT_X=1: x's TMA box cut to M rows rounded up to 8
               (the op's default since session 79; a build without the switch times `rows` again)
If `zero_pad` runs at `full`'s time and `rows` does not, the cost is in the out-of-bounds fill
(and `rows_fit` should take it back); if `zero_pad` runs at `rows`' time, it is in what the rows
hold (zeros through the MMAs).

    KERNELS_CACHE=.hub-cache HF_HUB_OFFLINE=1 python3 benchmarks/micro/gate_up_rows.py [--out F]
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import graphed, local_package, rel_err, replay_rounds_us, with_env, write_report  # noqa: E402
from decode_loop_ab import D, H, TOL, layer_weights, loop_args  # noqa: E402

ROWS = 128  # the kernel's row block (kBM in gated_gemm_sm90.cu)


def main() -> None:
    args = loop_args(__doc__, "1,8,16,32,64,128")
    fm, tg = local_package("triton_gemm")
    act = fm.activations.ACTIVATION_IDS["silu"]
    gen = torch.Generator(device="cuda").manual_seed(0)
    dt = torch.bfloat16
    W = layer_weights(args.layers, gen, dt)
    full = torch.randn(ROWS, D, device="cuda", generator=gen).to(dt)

    rows = []
    for m in (int(s) for s in args.ms.split(",")):
        if not 0 < m <= ROWS:
            raise SystemExit(f"M {m}: this probe takes 1 <= M <= {ROWS}")
        x = torch.randn(m, D, device="cuda", generator=gen).to(dt)
        pad = torch.zeros(ROWS, D, device="cuda", dtype=dt)
        pad[:m] = x
        inputs = {"rows": x, "zero_pad": pad, "full": full}
        impls = {n: (lambda i, t=t: tg.gated_linear(t, W[i][0], W[i][1], None, None, act))
                 for n, t in inputs.items()}
        call = impls["rows"]  # x [M, D] under whatever FUSED_MLP_SM90_FIT_X says: pinned both ways
        impls["rows"] = lambda i: with_env(lambda: call(i), "FUSED_MLP_SM90_FIT_X", "0")()
        impls["rows_fit"] = lambda i: with_env(lambda: call(i), "FUSED_MLP_SM90_FIT_X", "1")()
        inputs["rows_fit"] = x
        # each against float64 (silu(x Wg^T) * (x Wu^T)); zero_pad's first M rows against rows'
        errs = {}
        for n, t in inputs.items():
            ref = torch.nn.functional.silu(t.double() @ W[0][0].double().t()) * (t.double() @ W[0][1].double().t())
            errs[n] = rel_err(impls[n](0), ref)
        errs["zero_pad_vs_rows"] = rel_err(impls["zero_pad"](0)[:m], impls["rows"](0).double())
        # the fitted box changes only what fills the unused rows: the stored rows bit for bit
        same_bits = bool(torch.equal(impls["rows_fit"](0), impls["rows"](0)))
        bad = {n: e for n, e in errs.items() if not e <= TOL}
        if bad:
            raise SystemExit(f"M {m}: outputs off the reference: {bad}")
        replays = {n: graphed(lambda fn=fn: [fn(i) for i in range(args.layers)]) for n, fn in impls.items()}
        row = {"m": m, "rel_err": errs, "rows_fit_bitwise_equal": same_bits,
               **replay_rounds_us(replays, args.rounds, args.reps, args.layers)}
        rows.append(row)
        print(f"M {m:4d}  " + "  ".join(f"{n} {row[n]['us']:6.1f}" for n in impls)
              + f"  rows_fit bitwise {'equal' if same_bits else 'DIFFERENT'}", flush=True)
    write_report(args.out, rows, layers=args.layers, reps=args.reps, rounds=args.rounds, d=D, h=H, row_block=ROWS)


if __name__ == "__main__":
    main()
