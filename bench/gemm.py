"""Block-scaled FP8 GEMM (rtp_fp8.gemm.triton) on the GPU against cuBLASLt's per-tensor FP8 GEMM.

    PYTHONPATH=. python3 bench/gemm.py [--out results.json]

Shapes from DeepSeek-V3 (the issue's list). TFLOP/s = 2*M*N*K / median kernel time (CUDA-graph
replays); the ratio is to torch._scaled_mm (per-tensor scales, cuBLASLt) at 8192^3 measured in
the same run. The eager column is one Python call (validation, TMA descriptors, launch), which
bounds small shapes outside graphs. `kernel` names what the shipped dispatch ran: sm90_ws 128xBN
(the warp-specialized Gluon kernel, BN its tile width, sm90_ws.tile_n) or triton; where it is
sm90_ws the Triton kernel is timed too (block_scaled.USE_WS off), and both outputs must be
bit-identical.
"""

from __future__ import annotations

import argparse
import contextlib

import torch

from bench.common import dump, environment, fp8_gemm_tflops, graph_ms, median_ms
from rtp_fp8 import arch as A
from rtp_fp8.gemm.triton import block_scaled as G
from rtp_fp8.quant import block as B
from rtp_fp8.quant import token_group as T

DENSE = [(4096, 2112, 7168), (4096, 24576, 1536), (4096, 32768, 512), (4096, 7168, 16384), (4096, 4096, 7168),
         (4096, 7168, 2048), (128, 7168, 16384), (128, 4096, 7168)]
GROUPED = [(8, 4096, 4096, 7168), (8, 4096, 7168, 2048), (32, 512, 4096, 7168)]


@contextlib.contextmanager
def _triton_only():
    G.USE_WS, old = False, G.USE_WS
    try:
        yield
    finally:
        G.USE_WS = old


def _kernel(refusal, m, n):
    """What the dispatch runs: "sm90_ws 128xBN" (tile_n's width on this GPU) or "triton"."""
    if refusal is not None:
        return "triton"
    return f"sm90_ws {G.sm90_ws.BM}x{G.sm90_ws.tile_n(m, n, A.num_sms(0))}"


def _measure(flops, call, out, kernel):
    """{ms, tflops, eager_ms, kernel} of the shipped dispatch (+ triton_tflops beside sm90_ws)."""
    ms = graph_ms(call)
    r = {"ms": ms, "tflops": flops / (ms * 1e-3) / 1e12, "eager_ms": median_ms(call), "kernel": kernel}
    if kernel != "triton":
        shipped = out.clone()
        with _triton_only():
            tms = graph_ms(call)
            r["triton_tflops"] = flops / (tms * 1e-3) / 1e12
            if not torch.equal(out, shipped):
                raise AssertionError("sm90_ws and the Triton kernel differ")
    return r


def dense_inputs(m, n, k):
    """(a, sa, b, sb, out) for M x N x K in the SM90 formats."""
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5
    a, sa = T.per_token_group_quant(x, 128, scale_layout="col_tma")
    b, sb = B.quantize_weight_blocks(w)
    return a, sa, b, sb, torch.empty(m, n, device="cuda", dtype=torch.bfloat16)


def grouped_inputs(g, m, n, k):
    """(a, sa, b, sb, ids, out, counters): g experts of m rows each."""
    x = torch.randn(g * m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(g, n, k, device="cuda", dtype=torch.bfloat16) / k**0.5
    a, sa = T.per_token_group_quant(x, 128, scale_layout="col_tma")
    b, sb = B.quantize_weight_blocks(w)
    ids = torch.arange(g, device="cuda", dtype=torch.int32).repeat_interleave(m)
    out = torch.empty(g * m, n, device="cuda", dtype=torch.bfloat16)
    return a, sa, b, sb, ids, out, torch.zeros(2, device="cuda", dtype=torch.int32)


def dense(m, n, k):
    a, sa, b, sb, out = dense_inputs(m, n, k)
    return _measure(2 * m * n * k, lambda: G.fp8_gemm_nt(a, sa, b, sb, out=out), out,
                    _kernel(G.ws_refusal(G.DENSE, a, sa, b, sb, out), m, n))


def grouped(g, m, n, k):
    a, sa, b, sb, ids, out, cnt = grouped_inputs(g, m, n, k)

    def call():
        G.m_grouped_fp8_gemm_nt_contiguous(a, sa, b, sb, ids, out=out, counters=cnt)

    return _measure(2 * g * m * n * k, call, out, _kernel(G.ws_refusal(G.CONTIGUOUS, a, sa, b, sb, out), g * m, n))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    args = ap.parse_args()
    ceiling = fp8_gemm_tflops()
    rows = []
    for m, n, k in DENSE:
        r = dense(m, n, k)
        rows.append({"kind": "dense", "shape": [m, n, k], **r, "ratio": r["tflops"] / ceiling})
    for g, m, n, k in GROUPED:
        r = grouped(g, m, n, k)
        rows.append({"kind": f"contiguous G={g}", "shape": [m, n, k], **r, "ratio": r["tflops"] / ceiling})
    if args.out:
        dump(args.out, {"env": environment(), "cublaslt_fp8_tflops": ceiling, "results": rows})
    print(environment())
    print(f"cuBLASLt per-tensor FP8 GEMM 8192^3: {ceiling:.0f} TFLOP/s")
    print(f"{'kind':18s} {'M,N,K':>20s} {'kernel':>15s} {'ms':>8s} {'TFLOP/s':>8s} {'ratio':>6s} {'eager ms':>9s} "
          f"{'triton':>7s}")
    for r in rows:
        tri = f"{r['triton_tflops']:7.0f}" if "triton_tflops" in r else f"{'-':>7s}"
        print(f"{r['kind']:18s} {str(tuple(r['shape'])):>20s} {r['kernel']:>15s} {r['ms']:8.3f} {r['tflops']:8.0f} "
              f"{r['ratio']:6.2f} {r['eager_ms']:9.3f} {tri}")


if __name__ == "__main__":
    main()
