"""Experiment: a programmatic edge from our gate/up kernel to cuBLAS's down GEMM in a CUDA graph.

In a captured MLP forward the down GEMM's kernel starts only after the gate/up kernel has
finished and flushed: its launch, its CTAs' set-up and its first loads wait for the last CTA of
ours. The gate/up kernel signals `griddepcontrol.launch_dependents` once its CTAs are resident;
if the edge between the two kernel nodes is programmatic, the down GEMM's CTAs may be scheduled
on the SMs ours leaves idle or has left, and their `griddepcontrol.wait` (if cuBLAS's kernel
has one) holds their reads of h until our grid is done. This script

1. prints the captured graph of each case (node kinds, kernel names, edges with their types),
2. checks, with a sleeping Triton kernel that writes the GEMM's input late, that cuBLAS's
   kernel of each shape waits on a programmatic edge (NaN in its output if it does not),
3. times graph replays with the edge as captured and made programmatic, call by call
   alternating (bench_mlp.alternating_rounds, the micro A/Bs' timer), and compares the outputs
   bit for bit (output poisoned before each checked replay).

    python benchmarks/micro/pdl_edge.py OUT.json

The driver calls go through ctypes (libcuda.so.1, CUDA 12.3+ graph edge API): an experiment,
not the package's code path. The gated kernel's `launch_dependents` existed only in the build
session 30 measured (reverted after it): on a later build the edge still becomes programmatic
but our kernel triggers only as its CTAs exit. Session 30 found cuBLAS's few-token kernels do not
wait (check 2 fails): the timings of those cases race (NOTES.md, session 30). That session's file
was timed by 8139882's own loop (9 rounds of 200 back-to-back replays per graph, no L2 flush);
the script now takes the records' timer instead.
"""

import ctypes
import json
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/
import bench_mlp as B  # noqa: E402
from _common import local_package, run_info, warm_up  # noqa: E402

fm, = local_package()

cu = ctypes.CDLL("libcuda.so.1")
c_void_p, c_uint, c_size_t, c_ubyte = ctypes.c_void_p, ctypes.c_uint, ctypes.c_size_t, ctypes.c_ubyte


class KernelParams(ctypes.Structure):
    _fields_ = [("func", c_void_p), ("gx", c_uint), ("gy", c_uint), ("gz", c_uint), ("bx", c_uint),
                ("by", c_uint), ("bz", c_uint), ("smem", c_uint), ("params", c_void_p), ("extra", c_void_p),
                ("kern", c_void_p), ("ctx", c_void_p)]


class EdgeData(ctypes.Structure):
    _fields_ = [("from_port", c_ubyte), ("to_port", c_ubyte), ("type", c_ubyte), ("reserved", c_ubyte * 5)]


NODE_KINDS = {0: "kernel", 1: "memcpy", 2: "memset", 3: "host", 4: "graph", 5: "empty", 6: "wait_event",
              7: "event_record", 10: "mem_alloc", 11: "mem_free"}


def _ok(r: int, what: str) -> None:
    if r != 0:
        raise RuntimeError(f"{what}: CUresult {r}")


def graph_nodes(graph: int) -> list:
    n = c_size_t(0)
    _ok(cu.cuGraphGetNodes(c_void_p(graph), None, ctypes.byref(n)), "cuGraphGetNodes")
    arr = (c_void_p * n.value)()
    _ok(cu.cuGraphGetNodes(c_void_p(graph), arr, ctypes.byref(n)), "cuGraphGetNodes")
    return [arr[i] for i in range(n.value)]


def node_info(node: int) -> dict:
    t = ctypes.c_int(0)
    _ok(cu.cuGraphNodeGetType(c_void_p(node), ctypes.byref(t)), "cuGraphNodeGetType")
    info = {"kind": NODE_KINDS.get(t.value, str(t.value))}
    if t.value == 0:
        p = KernelParams()
        _ok(cu.cuGraphKernelNodeGetParams_v2(c_void_p(node), ctypes.byref(p)), "cuGraphKernelNodeGetParams")
        name = ctypes.c_char_p()
        if p.func:
            _ok(cu.cuFuncGetName(ctypes.byref(name), c_void_p(p.func)), "cuFuncGetName")
        else:
            _ok(cu.cuKernelGetName(ctypes.byref(name), c_void_p(p.kern)), "cuKernelGetName")
        info.update(name=name.value.decode(), grid=[p.gx, p.gy, p.gz], block=[p.bx, p.by, p.bz], smem=p.smem)
    return info


def graph_edges(graph: int) -> list:
    n = c_size_t(0)
    _ok(cu.cuGraphGetEdges_v2(c_void_p(graph), None, None, None, ctypes.byref(n)), "cuGraphGetEdges")
    a, b, d = (c_void_p * n.value)(), (c_void_p * n.value)(), (EdgeData * n.value)()
    _ok(cu.cuGraphGetEdges_v2(c_void_p(graph), a, b, d, ctypes.byref(n)), "cuGraphGetEdges")
    return [(a[i], b[i], d[i].from_port, d[i].type) for i in range(n.value)]


def describe(graph: int) -> dict:
    nodes = graph_nodes(graph)
    index = {n: i for i, n in enumerate(nodes)}
    return {"nodes": [node_info(n) for n in nodes],
            "edges": [[index[a], index[b], port, typ] for a, b, port, typ in graph_edges(graph)]}


def make_programmatic(graph: int, producer_substring: str) -> list:
    """Each edge from a kernel node whose name contains producer_substring to a kernel node
    becomes programmatic; returns the (from, to) names changed."""
    changed = []
    for a, b, port, typ in graph_edges(graph):
        ia, ib = node_info(a), node_info(b)
        if ia["kind"] != "kernel" or ib["kind"] != "kernel" or producer_substring not in ia["name"]:
            continue
        frm, to = (c_void_p * 1)(a), (c_void_p * 1)(b)
        old = (EdgeData * 1)()
        old[0].from_port, old[0].type = port, typ
        _ok(cu.cuGraphRemoveDependencies_v2(c_void_p(graph), frm, to, old, c_size_t(1)), "cuGraphRemoveDependencies")
        new = (EdgeData * 1)()
        new[0].from_port, new[0].type = 1, 1  # CU_GRAPH_KERNEL_NODE_PORT_PROGRAMMATIC, _DEPENDENCY_TYPE_PROGRAMMATIC
        _ok(cu.cuGraphAddDependencies_v2(c_void_p(graph), frm, to, new, c_size_t(1)), "cuGraphAddDependencies")
        changed.append([ia["name"][:80], ib["name"][:80]])
    return changed


def capture(fn, producer: str, link: bool):
    warm_up(fn)
    g = torch.cuda.CUDAGraph(keep_graph=True)
    with torch.cuda.graph(g):
        out = fn()
    raw = g.raw_cuda_graph()
    changed = make_programmatic(raw, producer) if link else []
    info = describe(raw)  # after the rewrite (session 30's file listed the edges before it)
    info["changed"] = changed
    g.instantiate()
    torch.cuda.synchronize()
    return g, out, info


# ---- does cuBLAS's kernel wait? a producer that writes the GEMM's input 200 us late ----------

import triton  # noqa: E402
import triton.language as tl  # noqa: E402


@triton.jit
def _late_copy(dst, src, n, delay_ns, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    tl.inline_asm_elementwise("griddepcontrol.launch_dependents;\nmov.b32 $0, $1;", "=r,r", [pid],
                              dtype=tl.int32, is_pure=False, pack=1)
    t0 = tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l,r", [pid], dtype=tl.int64, is_pure=False,
                                   pack=1)
    t = t0
    while t - t0 < delay_ns:
        t = tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l,r", [pid], dtype=tl.int64,
                                      is_pure=False, pack=1)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    tl.store(dst + offs, tl.load(src + offs, mask=offs < n), mask=offs < n)


def waits_check(h_src: torch.Tensor, w: torch.Tensor) -> dict:
    h = torch.full_like(h_src, float("nan"))
    n = h.numel()

    def fn():
        _late_copy[(triton.cdiv(n, 8192),)](h, h_src, n, 200_000, BLOCK=8192)
        return F.linear(h, w)

    g, out, info = capture(fn, "_late_copy", link=True)
    want = F.linear(h_src, w)
    bad = 0
    for _ in range(20):
        h.fill_(float("nan"))
        out.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        bad += int(not torch.equal(out, want))
    return {"changed": info["changed"], "nodes": [x.get("name", x["kind"])[:90] for x in info["nodes"]],
            "edges": info["edges"], "replays_wrong": bad, "of": 20}


# ---- timing ---------------------------------------------------------------------------------


def case(name: str, fn, rounds: int = 5) -> dict:
    g0, out0, info0 = capture(fn, "gated_gemm_kernel", link=False)
    g1, out1, info1 = capture(fn, "gated_gemm_kernel", link=True)
    same = True
    for _ in range(5):
        for g, o in ((g0, out0), (g1, out1)):
            o.fill_(float("nan"))
            g.replay()
        torch.cuda.synchronize()
        same &= torch.equal(out0, out1) and not bool(torch.isnan(out0).any())
    _, per = B.alternating_rounds({"plain": g0.replay, "pdl": g1.replay}, 1500, "cuda", rounds)
    t0, t1 = ([ms * 1e3 for ms in per[k]] for k in ("plain", "pdl"))
    ratios = [b / a for a, b in zip(t0, t1)]
    row = {"case": name, "plain_us": statistics.median(t0), "pdl_us": statistics.median(t1),
           "ratio_median": statistics.median(ratios), "ratios": ratios, "same_bits": same,
           "changed": info1["changed"], "nodes": [x.get("name", x["kind"])[:90] for x in info0["nodes"]],
           "edges_plain": info0["edges"], "edges_pdl": info1["edges"]}
    print(json.dumps({k: v for k, v in row.items() if k not in ("ratios",)}), flush=True)
    return row


def main() -> None:
    out_path = sys.argv[1] if len(sys.argv) > 1 else None
    torch.manual_seed(0)
    dev = "cuda"
    rows, checks = [], []
    dt = torch.bfloat16
    d, hdim = 4096, 14336
    wg = torch.randn(hdim, d, device=dev, dtype=dt) * d ** -0.5
    wu = torch.randn(hdim, d, device=dev, dtype=dt) * d ** -0.5
    wd = torch.randn(d, hdim, device=dev, dtype=dt) * hdim ** -0.5
    for m in (128, 64, 512):
        h = torch.randn(m, hdim, device=dev, dtype=dt)
        c = waits_check(h, wd)
        c["case"] = f"late h, down GEMM m{m}"
        print(json.dumps(c), flush=True)
        checks.append(c)
    for m in (128, 64, 512):
        x = torch.randn(m, d, device=dev, dtype=dt)
        rows.append(case(f"swiglu_m{m}_d4096_h14336_bf16", lambda x=x: fm.gated_mlp(x, wg, wu, wd, "silu")))
    d2, h2 = 768, 3072
    x = torch.randn(8192, d2, device=dev, dtype=dt)
    g2 = torch.randn(h2, d2, device=dev, dtype=dt) * d2 ** -0.5
    u2 = torch.randn(h2, d2, device=dev, dtype=dt) * d2 ** -0.5
    dn2 = torch.randn(d2, h2, device=dev, dtype=dt) * h2 ** -0.5
    c = waits_check(torch.randn(8192, h2, device=dev, dtype=dt), dn2)
    c["case"] = "late h, down GEMM geglu d768"
    print(json.dumps(c), flush=True)
    checks.append(c)
    rows.append(case("geglu_m8192_d768_h3072_bf16", lambda: fm.gated_mlp(x, g2, u2, dn2, "gelu_tanh")))
    b1 = torch.randn(h2, device=dev, dtype=dt) * 0.1
    b2 = torch.randn(d2, device=dev, dtype=dt) * 0.1
    rows.append(case("mlp_gelu_tanh_m8192_d768_h3072_bf16",
                     lambda: fm.mlp(x, g2, b1, dn2, b2, "gelu_tanh")))
    if out_path:
        Path(out_path).write_text(json.dumps({**run_info(), "checks": checks,
                                              "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
