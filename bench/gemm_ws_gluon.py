"""Experiment: the warp-specialized Gluon GEMM (bench/sm90_ws_gemm.py) against the
shipped Triton kernel on the dense M=4096 shapes of bench/gemm.py, on an SM90 GPU.

    PYTHONPATH=. python3 bench/gemm_ws_gluon.py [--out results.json] [--stages 4 5]

Each WS result is compared with the Triton kernel's output (exact expected: the same per-step
products and promotion) before it is timed; both are timed in the same run.
"""

from __future__ import annotations

import argparse
import functools
import math

import torch

from bench import sm90_ws_gemm as W
from bench.common import dump, environment, graph_ms
from bench.gemm import DENSE
from rtp_fp8.gemm.triton import block_scaled as G
from rtp_fp8.quant import block as B
from rtp_fp8.quant import token_group as T

CHECKS = [(1, 128, 128), (300, 200, 640), (257, 384, 1152)]


def _operands(m, n, k):
    a, sa = T.per_token_group_quant(torch.randn(m, k, device="cuda", dtype=torch.bfloat16), 128,
                                    scale_layout="col_tma")
    b, sb = B.quantize_weight_blocks(torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5)
    assert W.applies(a, sa, b, sb)
    return a, sa, b, sb


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--stages", type=int, nargs="+", default=[4])
    ap.add_argument("--unroll", type=int, nargs="+", default=[2])
    args = ap.parse_args()
    rows = []
    checks = []
    for m, n, k in CHECKS:  # ragged M / N, an odd number of K steps (the unrolled loop's tail)
        a, sa, b, sb = _operands(m, n, k)
        ref = G.fp8_gemm_nt(a, sa, b, sb)
        for un in args.unroll:
            out = torch.full_like(ref, float("nan"))
            W.fp8_gemm_nt_ws(a, sa, b, sb, out=out, stages=args.stages[0], unroll=un)
            torch.cuda.synchronize()
            checks.append({"shape": [m, n, k], "unroll": un, "exact": torch.equal(out, ref)})
            print(f"check {(m, n, k)} unroll={un}: exact={checks[-1]['exact']}", flush=True)
    for m, n, k in [s for s in DENSE if s[0] == 4096]:
        a, sa, b, sb = _operands(m, n, k)
        ref = G.fp8_gemm_nt(a, sa, b, sb)
        flops = 2 * m * n * k
        tri = flops / (graph_ms(functools.partial(G.fp8_gemm_nt, a, sa, b, sb, out=ref), rep=20) * 1e-3) / 1e12
        for st, un in [(st, un) for st in args.stages for un in args.unroll]:
            out = torch.full_like(ref, float("nan"))
            W.fp8_gemm_nt_ws(a, sa, b, sb, out=out, stages=st, unroll=un)
            torch.cuda.synchronize()
            exact = torch.equal(out, ref)
            err = float((out.float() - ref.float()).norm() / ref.float().norm())
            ws_call = functools.partial(W.fp8_gemm_nt_ws, a, sa, b, sb, out=out, stages=st, unroll=un)
            ws = flops / (graph_ms(ws_call, rep=20) * 1e-3) / 1e12
            rows.append({"shape": [m, n, k], "stages": st, "unroll": un, "ws_tflops": ws, "triton_tflops": tri,
                         "exact": exact, "rel_l2": err})
            print(f"{(m, n, k)} stages={st} unroll={un}: ws {ws:.0f} TFLOP/s, triton {tri:.0f}, exact={exact} "
                  f"rel_l2={err:.2e}", flush=True)
    for st, un in [(st, un) for st in args.stages for un in args.unroll]:
        sel = [r for r in rows if r["stages"] == st and r["unroll"] == un]
        geo = math.exp(sum(math.log(r["ws_tflops"]) for r in sel) / len(sel))
        tgeo = math.exp(sum(math.log(r["triton_tflops"]) for r in sel) / len(sel))
        print(f"geomean stages={st} unroll={un}: ws {geo:.0f}, triton {tgeo:.0f}")
    if args.out:
        dump(args.out, {"bench": "gemm_ws_gluon", "env": environment(), "checks": checks, "results": rows})


if __name__ == "__main__":
    main()
