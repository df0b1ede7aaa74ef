"""Block-scaled FP8 GEMM (rtp_fp8.gemm.triton) on the GPU against cuBLASLt's per-tensor FP8 GEMM.

    PYTHONPATH=. python3 bench/gemm.py [--out results.json]

Shapes from DeepSeek-V3 (the issue's list). TFLOP/s = 2*M*N*K / median kernel time (CUDA-graph
replays); the ratio is to torch._scaled_mm (per-tensor scales, cuBLASLt) at 8192^3 measured in
the same run. The eager column is one Python call (validation, TMA descriptors, launch), which
bounds small shapes outside graphs. `kernel` names what the shipped dispatch ran: sm90_ws 128xBN
(the warp-specialized Gluon kernel, BN its tile width, sm90_ws.tile_n) or triton; where it is
sm90_ws the Triton kernel is timed too (block_scaled.USE_WS off), and both outputs must be
bit-identical.

DeepGEMM, where it is importable and runs this GPU's Arch (./dev gpu-test builds it from the
archive pinned in deps/toolchains.toml; bench/gpu_run.sh puts it on PYTHONPATH), is timed on the
same operands in the same run: `dg` TFLOP/s, `ours/dg`, and `same` (bit-identical outputs on the
rows the contract specifies, else the relative L2 between the two). Masked shapes: G experts,
expected_m = masked_m rows each, capacity 2 * expected_m.
"""

from __future__ import annotations

import argparse
import contextlib

import torch

from bench.common import dump, environment, fp8_gemm_tflops, graph_ms, median_ms
from rtp_fp8 import arch as A
from rtp_fp8.gemm import deepgemm as D
from rtp_fp8.gemm.triton import block_scaled as G
from rtp_fp8.quant import block as B
from rtp_fp8.quant import token_group as T

DENSE = [(4096, 2112, 7168), (4096, 24576, 1536), (4096, 32768, 512), (4096, 7168, 16384), (4096, 4096, 7168),
         (4096, 7168, 2048), (128, 7168, 16384), (128, 4096, 7168)]
GROUPED = [(8, 4096, 4096, 7168), (8, 4096, 7168, 2048), (32, 512, 4096, 7168)]
MASKED = [(8, 64, 4096, 7168), (8, 256, 7168, 2048), (32, 64, 4096, 7168), (32, 256, 7168, 2048)]


def _deepgemm():
    """DeepGEMM's capabilities when it can run this GPU's Arch, else (None, why)."""
    here = A.detect()
    ok, why = D.supports(here, device="cuda")
    return (D.capabilities(), "") if ok else (None, why)


def _beside(r, flops, call_dg, ours, theirs, rows=None):
    """Time DeepGEMM's call on the same operands; compare its output with ours (on `rows` only)."""
    ms = graph_ms(call_dg)
    r["dg_tflops"] = flops / (ms * 1e-3) / 1e12
    r["ours_over_dg"] = r["tflops"] / r["dg_tflops"]
    o, t = (ours, theirs) if rows is None else (ours[rows], theirs[rows])
    r["same"] = "bit" if torch.equal(o, t) else f"{float((o.double() - t.double()).norm() / t.double().norm()):.1e}"
    return r


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


def dense(m, n, k, dg=None):
    a, sa, b, sb, out = dense_inputs(m, n, k)
    r = _measure(2 * m * n * k, lambda: G.fp8_gemm_nt(a, sa, b, sb, out=out), out,
                 _kernel(G.ws_refusal(G.DENSE, a, sa, b, sb, out), m, n))
    if dg is not None:
        out_dg = torch.empty_like(out)
        _beside(r, 2 * m * n * k, lambda: D.fp8_gemm_nt(a, sa, b, sb, out_dg, A.detect(), dg), out, out_dg)
    return r


def grouped(g, m, n, k, dg=None):
    a, sa, b, sb, ids, out, cnt = grouped_inputs(g, m, n, k)

    def call():
        G.m_grouped_fp8_gemm_nt_contiguous(a, sa, b, sb, ids, out=out, counters=cnt)

    flops = 2 * g * m * n * k
    r = _measure(flops, call, out, _kernel(G.ws_refusal(G.CONTIGUOUS, a, sa, b, sb, out), g * m, n))
    if dg is not None:
        out_dg = torch.empty_like(out)
        with D.mk_alignment(128, dg):
            _beside(r, flops, lambda: D.m_grouped_fp8_gemm_nt_contiguous(a, sa, b, sb, ids, out_dg, A.detect(), dg),
                    out, out_dg)
    return r


def masked_inputs(g, em, n, k):
    """(a, sa, b, sb, masked_m, out): g experts, capacity 2 * em rows, em of them valid."""
    from rtp_fp8.quant import layout as L

    cap = 2 * em
    x = torch.randn(g * cap, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(g, n, k, device="cuda", dtype=torch.bfloat16) / k**0.5
    a, sa_flat = T.per_token_group_quant(x, 128, scale_layout="row")
    sa = L.alloc_scales((g,), cap, k // 128, "col_tma", "cuda")
    sa.copy_(sa_flat.view(g, cap, k // 128))
    b, sb = B.quantize_weight_blocks(w)
    masked = torch.full((g,), em, device="cuda", dtype=torch.int32)
    return a.view(g, cap, k), sa, b, sb, masked, torch.empty(g, cap, n, device="cuda", dtype=torch.bfloat16)


def masked(g, em, n, k, dg=None):
    a, sa, b, sb, mm, out = masked_inputs(g, em, n, k)
    flops = 2 * g * em * n * k
    r = _measure(flops, lambda: G.m_grouped_fp8_gemm_nt_masked(a, sa, b, sb, mm, expected_m=em, out=out), out,
                 "triton")
    if dg is not None:
        out_dg = torch.empty_like(out)
        _beside(r, flops, lambda: D.m_grouped_fp8_gemm_nt_masked(a, sa, b, sb, mm, em, out_dg, A.detect(), dg),
                out, out_dg, rows=(slice(None), slice(0, em)))
    return r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    args = ap.parse_args()
    ceiling = fp8_gemm_tflops()
    dg, why = _deepgemm()
    rows = []
    for m, n, k in DENSE:
        r = dense(m, n, k, dg)
        rows.append({"kind": "dense", "shape": [m, n, k], **r, "ratio": r["tflops"] / ceiling})
    for g, m, n, k in GROUPED:
        r = grouped(g, m, n, k, dg)
        rows.append({"kind": f"contiguous G={g}", "shape": [m, n, k], **r, "ratio": r["tflops"] / ceiling})
    for g, em, n, k in MASKED:
        r = masked(g, em, n, k, dg)
        rows.append({"kind": f"masked G={g}", "shape": [em, n, k], **r, "ratio": r["tflops"] / ceiling})
    env = environment()
    env["deep_gemm"] = dg.version if dg is not None else f"absent: {why}"
    if args.out:
        dump(args.out, {"env": env, "cublaslt_fp8_tflops": ceiling, "results": rows})
    print(env)
    print(f"cuBLASLt per-tensor FP8 GEMM 8192^3: {ceiling:.0f} TFLOP/s")
    print(f"{'kind':18s} {'M,N,K':>20s} {'kernel':>15s} {'ms':>8s} {'TFLOP/s':>8s} {'ratio':>6s} {'eager ms':>9s} "
          f"{'triton':>7s} {'dg':>7s} {'ours/dg':>7s} {'same':>7s}")
    for r in rows:
        tri = f"{r['triton_tflops']:7.0f}" if "triton_tflops" in r else f"{'-':>7s}"
        dgc = (f"{r['dg_tflops']:7.0f} {r['ours_over_dg']:7.2f} {r['same']:>7s}" if "dg_tflops" in r
               else f"{'-':>7s} {'-':>7s} {'-':>7s}")
        print(f"{r['kind']:18s} {str(tuple(r['shape'])):>20s} {r['kernel']:>15s} {r['ms']:8.3f} {r['tflops']:8.0f} "
              f"{r['ratio']:6.2f} {r['eager_ms']:9.3f} {tri} {dgc}")
    if rows and all("dg_tflops" in r for r in rows):
        import math

        geo = math.exp(sum(math.log(r["ours_over_dg"]) for r in rows) / len(rows))
        print(f"ours/dg geomean over {len(rows)} shapes: {geo:.3f}")


if __name__ == "__main__":
    main()
