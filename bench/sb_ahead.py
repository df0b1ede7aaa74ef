"""sm90_ws's wide tiles with their B scales loaded a step ahead (sm90_ws.SB_AHEAD), an experiment
(issue #28): off against on, through the shipped dispatch.

    PYTHONPATH=. python3 bench/sb_ahead.py [--out sb.json] [--reps 3]

Nsight Compute put about 5 % of the 128x256 kernel's warp samples at (4096, 7168, 16384) on FMULs
waiting for the step's two B scales, which `_step_wide` loads from global memory in the step that
uses them (docs/perf.md, 2026-12-04k). With SB_AHEAD the step uses the scales the step before loaded
and loads the next step's.

Timed: bench/gemm.py's M=4096 dense and contiguous grouped shapes, over operand sets rotated past
the L2 (bench.common.operand_sets), off and on in turn `--reps` times each (medians of each rep's
CUDA-graph median, so that a clock drift lands on both). Shapes whose dispatch takes no wide tile
run the same kernel either way (on the H200 every one of these takes them); each rep's times are
kept, their spread is the noise. Each on-output must equal the
off-output bit for bit (the same products and sums, only loaded earlier), else the row says so.
TFLOP/s beside cuBLASLt's per-tensor FP8 GEMM measured in the same run.
"""

from __future__ import annotations

import argparse
import statistics
from unittest import mock

import torch

from bench.common import dump, environment, fp8_gemm_tflops, operand_sets, output_of, rotated_ms
from bench.gemm import DENSE, GROUPED, dense_inputs, grouped_inputs
from rtp_fp8 import arch as A
from rtp_fp8.gemm.triton import block_scaled as G
from rtp_fp8.gemm.triton import sm90_ws as W


def _dense(a, sa, b, sb, out):
    G.fp8_gemm_nt(a, sa, b, sb, out=out)


def _grouped(a, sa, b, sb, ids, out, cnt):
    G.m_grouped_fp8_gemm_nt_contiguous(a, sa, b, sb, ids, out=out, counters=cnt)


def cases():
    """(label, shape, flops, operand maker, call, index of the output in an operand tuple)."""
    for m, n, k in DENSE:
        if m == 4096:
            yield "dense", [m, n, k], 2 * m * n * k, lambda m=m, n=n, k=k: dense_inputs(m, n, k), _dense, 4
    for g, m, n, k in GROUPED:
        yield "contiguous", [g, m, n, k], 2 * g * m * n * k, lambda g=g, m=m, n=n, k=k: grouped_inputs(g, m, n, k), \
            _grouped, 5


def wide(kind, shape, num_sms):
    """Whether the dispatch runs 128x256 tiles for this shape (all or, by sm90_ws.column_split, part of N)."""
    m, n = (shape[0], shape[1]) if kind == "dense" else (shape[0] * shape[1], shape[2])
    return W.tile_n(m, n, num_sms) == W.WIDE_BN or (kind == "dense" and W.column_split(m, n, num_sms) > 0)


def measure(call, sets, oi, reps):
    """{off_us, on_us: medians over reps, speedup off / on, each rep's times}, or {on: why it does not
    count}: SB_AHEAD off and on in turn, reps times; on's output on set 0 must equal off's bit for bit."""
    out = sets[0][oi]
    times = {False: [], True: []}
    ref = None
    for _ in range(reps):
        for on in (False, True):
            with mock.patch.object(W, "SB_AHEAD", on):
                got = output_of(call, sets[0], out)
                if ref is None:
                    ref = got
                elif not torch.equal(got, ref):
                    return {"on": "differs from the output with SB_AHEAD off"}
                times[on].append(rotated_ms(call, sets) * 1e3)
    off, on = statistics.median(times[False]), statistics.median(times[True])
    return {"off_us": off, "on_us": on, "speedup": off / on, "off_reps_us": times[False], "on_reps_us": times[True]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    ceiling = fp8_gemm_tflops()
    sms = A.num_sms(0)
    rows = []
    for kind, shape, flops, make, call, oi in cases():
        sets = operand_sets(make)
        r = {"kind": kind, "shape": shape, "wide": wide(kind, shape, sms), "operand_sets": len(sets),
             **measure(call, sets, oi, args.reps)}
        if "off_us" in r:
            for key in ("off", "on"):
                r[f"{key}_tflops"] = flops / (r[f"{key}_us"] * 1e-6) / 1e12
                r[f"{key}_vs_ceiling"] = r[f"{key}_tflops"] / ceiling
        rows.append(r)
        print(r, flush=True)
    res = {"env": environment(), "fp8_gemm_tflops": ceiling, "rows": rows}
    if args.out:
        dump(args.out, res)
    print(f"{'kind':<11}{'shape':<24}{'wide':<6}{'off us':>9}{'on us':>9}{'off/on':>8}")
    for r in rows:
        if "off_us" in r:
            print(f"{r['kind']:<11}{str(r['shape']):<24}{str(r['wide']):<6}{r['off_us']:9.1f}{r['on_us']:9.1f}"
                  f"{r['speedup']:8.3f}")
        else:
            print(f"{r['kind']:<11}{str(r['shape']):<24}{r['on']}")


if __name__ == "__main__":
    main()
