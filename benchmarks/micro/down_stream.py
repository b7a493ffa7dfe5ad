#!/usr/bin/env python3
"""Can a down GEMM of ours stream W_down at cuBLAS's rate in one kernel? (session 48, a probe;
nothing here is used by the package.)

Times `down_stream.cu`'s TMA stream of the bytes a single-kernel down GEMM at SwiGLU M 128 would
read (W_down's row block and, per K step, h's 128 x 64 box; K cut in parts that a cluster would
reduce), beside what the op runs today, in one process:

  linear           F.linear(h, W_down)
  bmm_only         cuBLAS's strided-batched GEMM over the two K halves (fp32 partial sums): the
                   main kernel of the op's down projection in graphs (its reduction excluded)
  ceiling          W_down's 117 MB read once by a grid-stride kernel (16-byte loads)
  s_rbR_pP_hH_sS   the probe: R W_down rows per CTA, P K parts, h by each CTA (H=1), by CTA pairs
                   with multicast (H=2) or not at all (H=0), S ring stages
  op               fused_mlp.gated_mlp (our gate/up kernel, then the split down projection)
  g[m|q]_sS[_pdl]  the GEMM on that ring (rb 64, 2 K parts in a cluster of 2, h per CTA, S
                   stages; one MMA warp group, the two partial tiles summed through DSMEM), with
                   a programmatic edge from the kernel before it (_pdl: W's first boxes load
                   before griddepcontrol.wait); gm: CTA pairs of adjacent row blocks multicast h
                   instead, and the two K parts meet through a global workspace; gq: both in
                   clusters of 4 (h multicast within a K part, K parts summed through DSMEM;
                   also with 4 stages, gq_s4, small enough for two CTAs an SM)
  gu_X             our gate/up kernel, then form X (the down GEMM's context in the op: L2 clean,
                   h just written)
  pkg, gu_pkg_pdl  the package's own down_gemm_sm90 (where the build has it: main since session
                   51), alone and after the gate/up kernel with its programmatic edge (its
                   cluster-of-4 form, pkg4, was dropped in session 52)
  op_split2        the op captured with FUSED_MLP_DOWN_SPLIT=2 (the split main's graphs pick at
  op_kernel        M 128 without the kernel) and with =kernel (down_gemm_sm90): the A/B that
                   decided the merge

--diag (session 51) times only the pair form's diagnostic variants beside the GEMM and its
stream, alone (no op context), to split the GEMM's time over its stream: g_s9 (9 stages),
g_s8_wait0 (a stage freed when its own MMAs retire), and, with wrong results on purpose,
g_s8_nomma (no MMAs), g_s8_nofinish (no hand-off, no stores), g_s8_nomma_nofinish. The two
whose results are right are checked as the GEMM forms are first.

--verdict F reads a results file of this script and says (exit status 0 / 1) whether op_kernel
beats op_split2 by at least --margin-us in both evictions (no GPU needed).

Each form is a CUDA graph, timed by events around replays, interleaved, L2 evicted by a 256 MiB
fill and by a read (_common.interleaved_us). Each probe form's landed bytes are checked once (a
sum of one word per box, against the same words summed here); the GEMM's output, poisoned
before each check, against fp64 on several shapes (odd M, K and N included) and run twice for
the same bits. --modes picks the GEMM forms (pair: g, global: gm, quad: gq, pkg: the package's;
default all); --check-only runs their checks and stops (gpu_session.sh checks each form in a
process of its own first, so that one that hangs costs only its own timeout).

    python3 benchmarks/micro/down_stream.py [--lib .probe/libdown_stream.so] [--out F] [--modes pair,quad]
    python3 benchmarks/micro/down_stream.py --diag [--out F]
    python3 benchmarks/micro/down_stream.py --verdict F [--margin-us 0.5]
    python3 benchmarks/micro/down_stream.py --list-modes
"""

from __future__ import annotations

import argparse
import ctypes
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
from _common import (graphed, interleaved_us, local_package, rel_err, swiglu_operands, with_env,  # noqa: E402
                     write_report)

CONFIGS = [  # (rows per CTA, K parts, h mode, stages)
    (64, 2, 0, 8),
    (64, 2, 1, 8),
    (64, 2, 2, 8),
    (64, 2, 1, 4),
    (128, 4, 0, 6),
    (128, 4, 1, 6),
    (128, 4, 2, 6),
    (64, 1, 1, 8),
    (128, 3, 0, 6),  # 3 K parts, 96 CTAs; session 53 (H100): 39 clusters of 3 fit, but it streams 1.5 us slower than the pair
    (128, 3, 1, 6),
]
# The configurations also timed after the gate/up kernel (gu_<name>), as the op runs them: the
# pair kernel's stream (rb 64, 2 parts) with and without h, and the 128-row blocks that read h
# half as often (session 52: s_rb128_p4_h1 streamed 1.8 us under the pair's s_rb64_p2_h1 alone).
GU_CONFIGS = CONFIGS[:4] + [(128, 4, 1, 6), (128, 3, 1, 6)]


def name_of(rb: int, parts: int, hmode: int, stages: int) -> str:
    return f"s_rb{rb}_p{parts}_h{hmode}_s{stages}"


def expected_sink(wd: torch.Tensor, h: torch.Tensor, rb: int, hmode: int) -> int:
    """What the consumers add up: one word of W_down's box per row block and K step, and (h
    mode 1 or 2) one word of h's box per CTA and K step (every row block sees every step once)."""
    w32 = wd.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    total = int(w32[::rb, ::32].sum())
    if hmode:
        h32 = h.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
        total += (wd.shape[0] // rb) * int(h32[0, ::32].sum())
    return total % (1 << 64)


# The GEMM's forms (--modes): down_stream.cu's GemmMode codes, and the package's kernel.
GEMM_MODES = {"pair": 0, "global": 1, "quad": 2}
# pkg: the package's down_gemm_sm90 (where the build has it), and the FUSED_MLP_DOWN_SPLIT value
# that makes the op take it (the op so captured: op_<value>)
PKG_FORMS = {"pkg": "kernel"}
MODES = tuple(GEMM_MODES) + tuple(PKG_FORMS)
MCAST_MODES = ("global", "quad")  # the probe's forms that multicast h between row blocks: N % 128
PREFIX = {"pair": "g", "global": "gm", "quad": "gq"}  # form names: PREFIX_s8[_pdl], gu_PREFIX_...
# (M, N, K): odd M, K not a multiple of 64 (nor of 128), N of 64 but not of 128 (the multicast
# forms take N % 128 == 0 and leave that one out)
CHECK_SHAPES = ((128, 4096, 14336), (1, 4096, 14336), (77, 1024, 3000), (128, 192, 256), (100, 384, 1000),
                (65, 256, 512))


def check_gemms(launchers: dict, counts) -> dict:
    """Each form's GEMM (name -> launch(h, w, y)) against fp64 on CHECK_SHAPES, output poisoned,
    run twice for the same bits (and the global form's counts back to zero); stops the script at
    the first wrong one. Returns {(M, N, K, name): rel err}."""
    errors = {}
    for mm, nn, kk in CHECK_SHAPES:
        gen = torch.Generator(device="cuda").manual_seed(mm * 7 + nn + kk)
        hh = torch.randn(mm, kk, device="cuda", dtype=torch.bfloat16, generator=gen)
        w = torch.randn(nn, kk, device="cuda", dtype=torch.bfloat16, generator=gen) * kk**-0.5
        exact = hh.double() @ w.double().t()
        base = rel_err(F.linear(hh, w), exact)
        for name, launch in launchers.items():
            if name in MCAST_MODES and nn % 128:
                continue
            outs = []
            for _ in range(2):
                y = torch.full((mm, nn), float("nan"), device="cuda", dtype=torch.bfloat16)
                launch(hh, w, y)
                torch.cuda.synchronize()
                outs.append(y)
            err = rel_err(outs[0], exact)
            errors[(mm, nn, kk, name)] = err
            same = torch.equal(outs[0], outs[1])
            zero = not bool(counts.any())
            ok = bool(torch.isfinite(outs[0]).all()) and err <= 2 * base + 1e-3 and same and zero
            print(f"[gemm check] {name} M {mm} N {nn} K {kk}: rel err vs fp64 {err:.2e} (F.linear {base:.2e}), "
                  f"same bits twice {same}, counts at zero {zero}: {'ok' if ok else 'WRONG'}", flush=True)
            if not ok:
                raise SystemExit(f"the {name} form is wrong; no timing")
    return errors


# --diag: the pair form's variants (down_stream.cu's GemmDiag bits) -> (stages, diag, result right)
DIAG_FORMS = {"g_s9": (9, 0, True), "g_s8_wait0": (8, 4, True), "g_s8_nomma": (8, 1, False),
              "g_s8_nofinish": (8, 2, False), "g_s8_nomma_nofinish": (8, 3, False)}


VERDICT_FORMS = tuple(f"op_{value}" for value in PKG_FORMS.values())  # op_kernel


def verdict(rows: list, margin_us: float) -> tuple[bool, str]:
    """Whether op_kernel's median is at least margin_us under op_split2's in every
    eviction the rows hold, and a line per form saying by how much. A form missing from an
    eviction's rows (a build without the kernel, a form whose check failed) does not pass."""
    us = {(r["eviction"], r["form"]): r["us"] for r in rows}
    evictions = sorted({r["eviction"] for r in rows})
    if not evictions:
        return False, "no rows"
    passed, lines = [], []
    for form in VERDICT_FORMS:
        if not all((ev, form) in us and (ev, "op_split2") in us for ev in evictions):
            lines.append(f"{form}: no rows in every eviction")
            continue
        gains = {ev: us[(ev, "op_split2")] - us[(ev, form)] for ev in evictions}
        if all(g >= margin_us for g in gains.values()):
            passed.append(form)
        lines.append(f"{form}: " + ", ".join(f"{ev} {us[(ev, form)]:.1f} us against op_split2 "
                                             f"{us[(ev, 'op_split2')]:.1f} (gain {g:+.2f})" for ev, g in gains.items()))
    head = f"KERNEL WINS ({', '.join(passed)})" if passed else "no kernel form wins"
    return bool(passed), f"{head} by the {margin_us} us margin: " + "; ".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", default=str(ROOT / ".probe" / "libdown_stream.so"))
    ap.add_argument("--out", default=None)
    ap.add_argument("--reps", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--verdict", default=None, help="a results file of this script: judge it and exit")
    ap.add_argument("--margin-us", type=float, default=0.5)
    ap.add_argument("--modes", default=",".join(MODES),
                    help=f"comma-separated GEMM forms to check and time (default all: {','.join(MODES)})")
    ap.add_argument("--check-only", action="store_true", help="only check the --modes forms against fp64")
    ap.add_argument("--diag", action="store_true", help="time only the pair form's diagnostic variants")
    ap.add_argument("--list-modes", action="store_true", help="print the GEMM forms' names (--modes) and exit")
    args = ap.parse_args()
    if args.list_modes:  # gpu_session.sh's micro-down step checks each of them in its own process
        print(" ".join(MODES))
        return
    if args.verdict is not None:
        ok, text = verdict(json.loads(Path(args.verdict).read_text())["rows"], args.margin_us)
        print(f"[verdict] {text}")
        raise SystemExit(0 if ok else 1)
    modes = [md for md in args.modes.split(",") if md]
    unknown = sorted(set(modes) - set(MODES))
    if unknown:
        raise SystemExit(f"--modes: unknown {unknown}; known {list(MODES)}")
    measure(args, modes)


def measure(args, modes: list) -> None:
    lib = ctypes.CDLL(args.lib)
    lib.down_stream_launch.argtypes = [ctypes.c_void_p, ctypes.c_void_p] + [ctypes.c_int] * 6 + [ctypes.c_void_p] * 2
    lib.down_stream_ceiling.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
    lib.down_stream_max_clusters.argtypes = [ctypes.c_int, ctypes.c_int]
    lib.down_gemm_launch.argtypes = ([ctypes.c_void_p] * 3 + [ctypes.c_int] * 3 + [ctypes.c_int64]
                                     + [ctypes.c_int] * 3 + [ctypes.c_void_p] * 2 + [ctypes.c_int, ctypes.c_void_p])
    # the global form's workspace: partial tiles and arrival counts (zero between launches)
    ws = torch.empty(4096 // 64 * 2 * 64 * 128, device="cuda", dtype=torch.float32)
    counts = torch.zeros(4096 // 64, device="cuda", dtype=torch.int32)

    def gemm(hh, w, y, stages, pdl, mode="pair", diag=0):
        glob = mode == "global"
        if glob and w.shape[0] > 4096:
            raise ValueError(f"the global form's workspace holds N <= 4096, got {w.shape[0]}")

        def run():
            rc = lib.down_gemm_launch(w.data_ptr(), hh.data_ptr(), y.data_ptr(), hh.shape[0], w.shape[0],
                                      hh.shape[1], y.stride(0), stages, int(pdl), GEMM_MODES[mode],
                                      ws.data_ptr() if glob else None, counts.data_ptr() if glob else None,
                                      diag, torch.cuda.current_stream().cuda_stream)
            if rc != 0:
                raise ValueError(f"shape not taken: h {tuple(hh.shape)}, w {tuple(w.shape)}, mode {mode}, diag {diag}")
        return run

    fm, tg = local_package("triton_gemm")
    pkg = getattr(fm.ops, "down_gemm_sm90", None)  # the package's kernel, where the build has it
    if pkg is None and set(modes) & set(PKG_FORMS):
        print("[gemm check] this build has no down_gemm_sm90: the pkg forms are left out", flush=True)
        modes = [md for md in modes if md not in PKG_FORMS]
    if args.diag:
        modes = ["pair"]
    launchers = {md: ((lambda hh, w, y: pkg(y, hh, w, None, False)) if md in PKG_FORMS
                      else (lambda hh, w, y, md=md: gemm(hh, w, y, 8, False, md)())) for md in modes}
    if args.diag:  # the variants whose result is right
        launchers.update({name: (lambda hh, w, y, st=st, d=d: gemm(hh, w, y, st, False, "pair", d)())
                          for name, (st, d, right) in DIAG_FORMS.items() if right})
    errors = check_gemms(launchers, counts)
    if args.check_only:
        return
    act = fm.activations.ACTIVATION_IDS["silu"]
    m = 128
    x, wg, wu, wd = swiglu_operands(m=m)
    n, k = wd.shape
    hbuf = torch.empty(m, k, device="cuda", dtype=torch.bfloat16)
    fm.ops.gated_gemm_sm90(hbuf, x, wg, wu, None, None, None, act, 0)
    h = hbuf.clone()
    sink = torch.zeros(1, device="cuda", dtype=torch.int64)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for size, smem in ((2, 8 * 24 * 1024), (4, 8 * 24 * 1024), (4, 4 * 24 * 1024), (4, 6 * 32 * 1024),
                       (4, 100 * 1024), (8, 6 * 32 * 1024), (3, 6 * 32 * 1024)):
        print(f"[occupancy] clusters of {size} with {smem // 1024} KB each: "
              f"{lib.down_stream_max_clusters(size, smem)} resident", flush=True)

    def stream(hh, rb, parts, hmode, stages):
        def run():
            rc = lib.down_stream_launch(wd.data_ptr(), hh.data_ptr(), n, k, rb, parts, hmode, stages, sink.data_ptr(),
                                        torch.cuda.current_stream().cuda_stream)
            if rc != 0:
                raise ValueError(f"configuration not taken: {(rb, parts, hmode, stages)}")
        return run

    hb = h.view(m, 2, k // 2).transpose(0, 1)
    hbb = hbuf.view(m, 2, k // 2).transpose(0, 1)
    wb = wd.view(n, 2, k // 2).permute(1, 2, 0)
    p = torch.empty(2, m, n, device="cuda", dtype=torch.float32)
    forms = {
        "linear": lambda: F.linear(h, wd),
        "bmm_only": lambda: torch.bmm(hb, wb, torch.float32, out=p),
        "ceiling": lambda: lib.down_stream_ceiling(wd.data_ptr(), wd.numel() * 2, 4 * sms, sink.data_ptr(),
                                                   torch.cuda.current_stream().cuda_stream),
    }
    checks = {}
    for cfg in CONFIGS[:2] if args.diag else CONFIGS:
        run = stream(h, *cfg)
        sink.zero_()
        run()
        torch.cuda.synchronize()
        got, want = int(sink.item()) % (1 << 64), expected_sink(wd, h, cfg[0], cfg[2])
        checks[name_of(*cfg)] = got == want
        print(f"[check] {name_of(*cfg)}: {'ok' if got == want else 'WRONG'}", flush=True)
        forms[name_of(*cfg)] = run

    yg = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    if args.diag:
        forms["g_s8"] = gemm(h, wd, yg, 8, False)
        for name, (stages, diag, _) in DIAG_FORMS.items():
            forms[name] = gemm(h, wd, yg, stages, False, "pair", diag)
        time_and_report(args, modes, forms, checks, errors, m)
        return
    gemm_modes = [md for md in modes if md in GEMM_MODES]
    if "pair" in modes:
        forms["g_s6"] = gemm(h, wd, yg, 6, False)
    if "quad" in modes:
        # 4 stages (98 KB): two CTAs fit an SM, so clusters of 4 need not find four free SMs
        # in one GPC (session 19: at most 30 clusters of 4 one-CTA-per-SM are resident on this
        # H200, and N 4096 needs 32)
        forms["gq_s4"] = gemm(h, wd, yg, 4, False, "quad")
        forms["gq_s4_pdl"] = gemm(h, wd, yg, 4, True, "quad")
    for md in gemm_modes:
        forms[f"{PREFIX[md]}_s8"] = gemm(h, wd, yg, 8, False, md)
        forms[f"{PREFIX[md]}_s8_pdl"] = gemm(h, wd, yg, 8, True, md)

    def gu():
        fm.ops.gated_gemm_sm90(hbuf, x, wg, wu, None, None, None, act, 0)

    forms["op"] = lambda: fm.gated_mlp(x, wg, wu, wd, "silu")
    ypkg = {}
    pkg_modes = [md for md in modes if md in PKG_FORMS]
    if pkg_modes:
        # the switch is read at each call: each graph keeps the form it was captured with
        def op_as(value):
            return with_env(lambda: fm.gated_mlp(x, wg, wu, wd, "silu"), "FUSED_MLP_DOWN_SPLIT", value)

        forms["op_split2"] = op_as("2")
        split2 = forms["op_split2"]()
    for md in pkg_modes:
        value = PKG_FORMS[md]
        ypkg[md] = yp = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        forms[md] = lambda yp=yp: pkg(yp, h, wd, None, False)
        forms[f"gu_{md}_pdl"] = lambda yp=yp: (gu(), pkg(yp, hbuf, wd, None, True))
        op_name = f"op_{value}"
        forms[op_name] = op_as(value)
        b = forms[op_name]()
        err = rel_err(b, split2.double())
        print(f"[gemm check] {op_name} against op_split2 (eager): rel err {err:.2e}", flush=True)
        if not bool(torch.isfinite(b).all()) or err > 1e-2:
            raise SystemExit(f"{op_name} is wrong; no timing")
    forms["gu_bmm_only"] = lambda: (gu(), torch.bmm(hbb, wb, torch.float32, out=p))
    for cfg in GU_CONFIGS:
        run_gu = stream(hbuf, *cfg)
        forms["gu_" + name_of(*cfg)] = lambda run_gu=run_gu: (gu(), run_gu())
    gu_checked = []
    for md, stages in [(md, 8) for md in gemm_modes] + ([("quad", 4)] if "quad" in modes else []):
        for pdl in (False, True):
            run_g = gemm(hbuf, wd, yg, stages, pdl, md)
            name = f"gu_{PREFIX[md]}_s{stages}" + ("_pdl" if pdl else "")
            forms[name] = lambda run_g=run_g: (gu(), run_g())
            gu_checked.append(name)
    replays = {name: graphed(f) for name, f in forms.items()}
    # What the op's timed choice (the "op" form's warm-up, its first default-mode call) measured
    # in this process (session 51 doubted it took the kernel here; session 52's run: it did).
    down_choice = down_choice_report(tg)
    # the GEMM after the gate/up kernel, in its graph, poisoned, against the op's output
    gu_outputs = {**{name: yg for name in gu_checked}, **{f"gu_{md}_pdl": ypkg[md] for md in pkg_modes}}
    for name, y in gu_outputs.items():
        y.fill_(float("nan"))
        replays[name]()
        torch.cuda.synchronize()
        ref = fm.gated_mlp(x, wg, wu, wd, "silu")
        err = rel_err(y, ref.double())
        print(f"[gemm check] {name}: rel err vs the op's output {err:.2e}", flush=True)
        if not bool(torch.isfinite(y).all()) or err > 1e-2:
            raise SystemExit(f"{name} is wrong; no timing")
    time_and_report(args, modes, replays, checks, errors, m, graphs=False, down_choice=down_choice)


def down_choice_report(tg) -> list:
    """The down projection's timed choices so far (the package's triton_gemm module `tg`: its
    _DOWN_CHOICE and _DOWN_TIMES), one printed line and one entry per shape bucket: the forms'
    median ms and the form taken (1 F.linear, 2 / 4 the splits, 0 the one-kernel form)."""
    out = []
    for key, times in tg._DOWN_TIMES.items():
        bucket, n, k = key[:3]
        entry = {"m_bucket": bucket, "n": n, "k": k, "dtype": str(key[3]), "bias": key[5],
                 "chosen": tg._DOWN_CHOICE.get(key), "ms": {str(f): t for f, t in times.items()}}
        out.append(entry)
        print(f"[choice] M bucket {bucket} N {n} K {k} {key[3]} bias {key[5]}: "
              + ", ".join(f"form {f} {t * 1e3:.1f} us" for f, t in times.items())
              + f" -> form {entry['chosen']}", flush=True)
    return out


def time_and_report(args, modes: list, forms: dict, checks: dict, errors: dict, m: int, graphs: bool = True,
                    down_choice: list | None = None) -> None:
    """Each form as a CUDA graph (unless already), interleaved under both evictions; rows printed
    and written to --out with the verdict."""
    replays = {name: graphed(f) for name, f in forms.items()} if graphs else forms
    rows = []
    for mode in ("fill", "read"):
        for name, (us, rounds) in interleaved_us(replays, mode, args.reps, args.rounds).items():
            rows.append({"m": m, "eviction": mode, "form": name, "us": us, "rounds_us": rounds,
                         "check": checks.get(name)})
            print(f"[stream] {mode:4s} {name:26s} {us:7.1f} us  rounds " + " ".join(f"{t:.1f}" for t in rounds),
                  flush=True)
    write_report(args.out, rows, modes=modes, down_choice=down_choice,  # run_info gives the command line
                 gemm_rel_err_vs_fp64={f"m{a}_n{b}_k{c}_{md}": e for (a, b, c, md), e in errors.items()})
    if not args.diag:
        print(f"[verdict] {verdict(rows, args.margin_us)[1]}", flush=True)


if __name__ == "__main__":
    main()
