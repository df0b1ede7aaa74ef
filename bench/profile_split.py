"""Diagnostics on the GPU: where bench/moe.py's scatter time goes, and the SM90 GEMM's tile walk.

    PYTHONPATH=. python3 bench/profile_split.py --out results.json [--no-gemm]

- scatter split: bench/moe.py's layout + scatter (T in {4096, 16384}) captured in a CUDA
  graph, 20 replays under torch.profiler: each kernel's start (from the replay's first) and
  duration in us, beside the graph's median replay time. The profiler adds a few us.
- sm90_ws GROUP_M: the six dense M=4096 shapes of bench/gemm.py through sm90_ws.launch with
  GROUP_M in {4, 8, 16, 32} (row tiles per group of the persistent walk), TMA-store and pointer
  epilogues, TFLOP/s of CUDA-graph replays. The walk only reorders tiles: results do not change.
  The choice behind sm90_ws.WIDE_N_TILES / GROUP_M_WIDE.
"""

from __future__ import annotations

import argparse
import functools

import torch
from torch.profiler import ProfilerActivity, profile

from bench import moe as BM
from bench.common import dump, environment, graph_ms
from bench.gemm import DENSE
from rtp_fp8.gemm.triton import sm90_ws as W
from rtp_fp8.quant import block as B
from rtp_fp8.quant import token_group as T


def scatter_split(t: int) -> dict:
    ids, _, x, xs, out, out_s, counters, *_ = BM.scatter_setup(t, "col_tma")

    def fn():
        return BM.layout_scatter(x, xs, ids, out, out_s, counters)

    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    for _ in range(10):
        g.replay()
    torch.cuda.synchronize()
    replays = 20
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            g.replay()
        torch.cuda.synchronize()
    kernels = sorted((e.time_range.start, e.time_range.end, e.name[:40]) for e in prof.events()
                     if e.device_type.name == "CUDA")
    last = kernels[-(len(kernels) // replays):]  # the final replay
    t0 = last[0][0]
    return {"graph_us": graph_ms(fn) * 1e3,
            "timeline": [(name, round(s - t0, 2), round(e - s, 2)) for s, e, name in last]}


def group_sweep(m: int, n: int, k: int) -> dict:
    a, sa = T.per_token_group_quant(torch.randn(m, k, device="cuda", dtype=torch.bfloat16), 128,
                                    scale_layout="col_tma")
    b, sb = B.quantize_weight_blocks(torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5)
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    row = {}
    wide, base = W.GROUP_M_WIDE, W.GROUP_M
    try:
        for gm in (4, 8, 16, 32):
            W.GROUP_M = W.GROUP_M_WIDE = gm
            for epi in (True, False):
                ms = graph_ms(functools.partial(W.launch, 0, a, sa, b, sb, sb, sb, 1, out, epi_tma=epi))
                row[f"g{gm}_{'tma' if epi else 'ptr'}"] = 2 * m * n * k / (ms * 1e-3) / 1e12
    finally:
        W.GROUP_M, W.GROUP_M_WIDE = base, wide
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--no-gemm", action="store_true", help="only the scatter split")
    args = ap.parse_args()
    res = {"bench": "profile_split", "env": environment()}
    for t in (4096, 16384):
        res[f"scatter_{t}"] = r = scatter_split(t)
        print(f"scatter T={t}: graph {r['graph_us']:.1f} us; (kernel, start, us): {r['timeline']}")
    if not args.no_gemm:
        for m, n, k in DENSE:
            if m == 4096:
                res[f"gemm_{m}_{n}_{k}"] = r = group_sweep(m, n, k)
                print((m, n, k), {name: round(v) for name, v in r.items()})
    if args.out:
        dump(args.out, res)


if __name__ == "__main__":
    main()
