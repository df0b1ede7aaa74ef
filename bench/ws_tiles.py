"""The SM90 warp-specialized GEMM's tile width on the GPU: 128x128 tiles against 128x256
(sm90_ws.WIDE_BN) and 128x64 (sm90_ws.NARROW_BN), all through sm90_ws.launch.

    PYTHONPATH=. python3 bench/ws_tiles.py [--out results.json] [--stages 3 4]

bench/gemm.py's M=4096 dense shapes and its grouped shapes; TFLOP/s of CUDA-graph replays and the
ratio to cuBLASLt's per-tensor FP8 GEMM (8192^3) measured in the same run. Each wide and narrow
output must equal the 128-wide one bit for bit (same FP32 promotion order), else the run stops. --stages
sweeps sm90_ws.STAGES_WIDE (slots of the wide ring; four fill 226 KB of shared memory).
"""

from __future__ import annotations

import argparse
import functools

import torch

from bench.common import dump, environment, fp8_gemm_tflops, graph_ms
from bench.gemm import DENSE, GROUPED, dense_inputs, grouped_inputs
from rtp_fp8.gemm.triton import block_scaled as G
from rtp_fp8.gemm.triton import sm90_ws as W


def _row(flops, launch, out, stages):
    base = graph_ms(functools.partial(launch, bn=128))
    shipped = out.clone()
    row = {"tflops_128": flops / (base * 1e-3) / 1e12}
    old = W.STAGES_WIDE
    try:
        for s in stages:
            W.STAGES_WIDE = s
            out.fill_(float("nan"))
            ms = graph_ms(functools.partial(launch, bn=W.WIDE_BN))
            if not torch.equal(out, shipped):
                raise AssertionError(f"128x{W.WIDE_BN} tiles ({s} stages) differ from 128x128")
            row[f"tflops_{W.WIDE_BN}_s{s}"] = flops / (ms * 1e-3) / 1e12
    finally:
        W.STAGES_WIDE = old
    out.fill_(float("nan"))
    ms = graph_ms(functools.partial(launch, bn=W.NARROW_BN))
    if not torch.equal(out, shipped):
        raise AssertionError(f"128x{W.NARROW_BN} tiles differ from 128x128")
    row[f"tflops_{W.NARROW_BN}"] = flops / (ms * 1e-3) / 1e12
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--stages", type=int, nargs="+", default=[W.STAGES_WIDE])
    args = ap.parse_args()
    ceiling = fp8_gemm_tflops()
    rows = []
    for m, n, k in DENSE:
        if m == 4096:
            a, sa, b, sb, out = dense_inputs(m, n, k)
            launch = functools.partial(W.launch, G.DENSE, a, sa, b, sb, sb, sb, 1, out)
            rows.append({"kind": "dense", "shape": [m, n, k], **_row(2 * m * n * k, launch, out, args.stages)})
    for g, m, n, k in GROUPED:
        a, sa, b, sb, ids, out, cnt = grouped_inputs(g, m, n, k)
        launch = functools.partial(W.launch, G.CONTIGUOUS, a, sa, b, sb, ids, cnt, g, out)
        rows.append({"kind": f"contiguous G={g}", "shape": [m, n, k],
                     **_row(2 * g * m * n * k, launch, out, args.stages)})
    if args.out:
        dump(args.out, {"bench": "ws_tiles", "env": environment(), "cublaslt_fp8_tflops": ceiling, "results": rows})
    print(f"cuBLASLt per-tensor FP8 GEMM 8192^3: {ceiling:.0f} TFLOP/s")
    for r in rows:
        cols = " ".join(f"{key[7:]}={v:.0f} ({v / ceiling:.2f})" for key, v in r.items() if key.startswith("tflops_"))
        print(f"{r['kind']:18s} {str(tuple(r['shape'])):>20s} {cols}")


if __name__ == "__main__":
    main()
