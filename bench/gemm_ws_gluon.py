"""Experiment: the warp-specialized Gluon GEMM (bench/sm90_ws_gemm.py) against the shipped
Triton kernel on an SM90 GPU: bench/gemm.py's dense M=4096 and grouped contiguous shapes.

    PYTHONPATH=. python3 bench/gemm_ws_gluon.py [--out results.json] [--stages 4 5] [--unroll 1 2]
        [--epi-tma 0 1] [--sb-tma 0 1]

First, bit-exact checks against the Triton kernel (outputs poisoned first) on ragged dense
shapes with an odd number of K steps and on a grouped layout with padding (-1) rows, rows of
an out-of-range id and an empty expert (counters compared too); then every timed result is
compared as well. Both kernels are timed in the same run (CUDA-graph replays).
"""

from __future__ import annotations

import argparse
import functools
import math

import torch

from bench import sm90_ws_gemm as W
from bench.common import dump, environment, graph_ms
from bench.gemm import DENSE, GROUPED
from rtp_fp8.gemm.triton import block_scaled as G
from rtp_fp8.quant import block as B
from rtp_fp8.quant import token_group as T

DENSE_CHECKS = [(1, 128, 128), (300, 200, 640), (257, 384, 1152)]


def _act(m, k):
    return T.per_token_group_quant(torch.randn(m, k, device="cuda", dtype=torch.bfloat16), 128,
                                   scale_layout="col_tma")


def _weights(lead, n, k):
    return B.quantize_weight_blocks(torch.randn(*lead, n, k, device="cuda", dtype=torch.bfloat16) / k**0.5)


def problems(timed=True):
    """(label, flops, triton(out, cnt), ws(out, cnt, stages, unroll, epi_tma, sb_tma), timed) per shape."""
    shapes = [(m, n, k, False) for m, n, k in DENSE_CHECKS]
    shapes += [(m, n, k, True) for m, n, k in DENSE if m == 4096] if timed else []
    for m, n, k, t in shapes:
        (a, sa), (b, sb) = _act(m, k), _weights((), n, k)
        assert W.applies(a, sa, b, sb)
        yield (f"dense {m}x{n}x{k}", 2 * m * n * k, lambda out, cnt, a=a, sa=sa, b=b, sb=sb: G.fp8_gemm_nt(
            a, sa, b, sb, out=out), lambda out, cnt, st, un, ep, sbt, a=a, sa=sa, b=b, sb=sb: W.fp8_gemm_nt_ws(
            a, sa, b, sb, out=out, stages=st, unroll=un, epi_tma=ep, sb_tma=sbt), t)
    # grouped check: expert 0 256 rows, 128 padding rows, expert 2 128 rows, 128 rows of id 7 (E=4), none for 1 and 3
    ids = torch.cat([torch.full((256,), 0), torch.full((128,), -1), torch.full((128,), 2), torch.full((128,), 7)])
    layouts = [("grouped check", 4, ids.to(torch.int32).cuda(), 256, 640, False)]
    for g, m, n, k in (GROUPED if timed else []):
        layouts.append((f"grouped {g}x{m}x{n}x{k}", g, torch.arange(g, device="cuda", dtype=torch.int32)
                        .repeat_interleave(m), n, k, True))
    for label, g, mi, n, k, t in layouts:
        (a, sa), (b, sb) = _act(mi.numel(), k), _weights((g,), n, k)
        assert W.applies(a, sa, b, sb, grouped=True)
        flops = 2 * int((mi >= 0).sum()) * n * k
        yield (label, flops, lambda out, cnt, a=a, sa=sa, b=b, sb=sb, mi=mi: G.m_grouped_fp8_gemm_nt_contiguous(
            a, sa, b, sb, mi, out=out, counters=cnt), lambda out, cnt, st, un, ep, sbt, a=a, sa=sa, b=b, sb=sb, mi=mi:
            W.m_grouped_fp8_gemm_nt_contiguous_ws(a, sa, b, sb, mi, out=out, counters=cnt, stages=st, unroll=un,
                                                  epi_tma=ep, sb_tma=sbt), t)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--stages", type=int, nargs="+", default=[4])
    ap.add_argument("--unroll", type=int, nargs="+", default=[2])
    ap.add_argument("--epi-tma", type=int, nargs="+", default=[0, 1], help="0: pointer stores, 1: TMA stores")
    ap.add_argument("--sb-tma", type=int, nargs="+", default=[1], help="B scales 1: with the slot's TMA, 0: loads")
    args = ap.parse_args()
    variants = [(st, un, ep, sbt) for st in args.stages for un in args.unroll for ep in args.epi_tma
                for sbt in args.sb_tma]
    rows = []
    for label, flops, tri, ws, timed in problems():
        cnt_ref = torch.zeros(2, dtype=torch.int32, device="cuda")
        ref = tri(None, cnt_ref)
        t_tri = flops / (graph_ms(functools.partial(tri, ref, cnt_ref), rep=20) * 1e-3) / 1e12 if timed else None
        for st, un, ep, sbt in variants:
            out = torch.full_like(ref, float("nan"))
            cnt = torch.zeros(2, dtype=torch.int32, device="cuda")
            ws(out, cnt, st, un, ep, sbt)
            torch.cuda.synchronize()
            exact = torch.equal(out, ref) and torch.equal(cnt, cnt_ref)
            r = {"shape": label, "stages": st, "unroll": un, "epi_tma": ep, "sb_tma": sbt, "exact": exact,
                 "triton_tflops": t_tri}
            if timed:
                call = functools.partial(ws, out, cnt, st, un, ep, sbt)
                r["ws_tflops"] = flops / (graph_ms(call, rep=20) * 1e-3) / 1e12
            rows.append(r)
            print(f"{label} stages={st} unroll={un} epi_tma={ep} sb_tma={sbt}: exact={exact}" + (
                f" ws {r['ws_tflops']:.0f} TFLOP/s, triton {t_tri:.0f}" if timed else ""), flush=True)
    for kind in ("dense", "grouped"):
        for st, un, ep, sbt in variants:
            sel = [r for r in rows if r["shape"].startswith(kind) and "ws_tflops" in r
                   and (r["stages"], r["unroll"], r["epi_tma"], r["sb_tma"]) == (st, un, ep, sbt)]
            if sel:
                geo = math.exp(sum(math.log(r["ws_tflops"]) for r in sel) / len(sel))
                tgeo = math.exp(sum(math.log(r["triton_tflops"]) for r in sel) / len(sel))
                print(f"geomean {kind} stages={st} unroll={un} epi_tma={ep} sb_tma={sbt}: ws {geo:.0f}, "
                      f"triton {tgeo:.0f}")
    if args.out:
        dump(args.out, {"bench": "gemm_ws_gluon", "env": environment(), "results": rows})


if __name__ == "__main__":
    main()
