"""MoE EP scatter/gather and the contiguous executor on the GPU, against the copy ceiling.

    PYTHONPATH=. python3 bench/moe.py [--out results.json]

H=7168, topk=8, 32 local experts of 64 (this rank owns [0, 32): about half the routes are
another rank's and are skipped), T in {256, 4096, 16384}, FP8 rows with the Arch's
activation scales. Times are CUDA-graph replays (kernel time, no Python launch cost).
Bytes, counted once each:
- scatter (layout + copy): ids read, token rows read once per token with a local route,
  rows + scale rows written per local route, m_indices written;
- gather: expert-output rows (bf16) read per local route, weights and output_index read,
  bf16 output rows written.
Beside the copy ceiling, torch's fan-out copy with the scatter's shape (each row read once
and written ~local routes / tokens times, an expanded-source copy_) is a baseline for that
traffic shape (not a ceiling: it is far below the copy bandwidth).
Executor (H=7168, I=2048, T=4096): one forward vs the sum of its parts timed alone; the
silu*mul+quant step and the forward also as that step was shipped before (FORMER_SILU_CONFIG tiles, a
program per row block).
"""

from __future__ import annotations

import argparse

import torch

from bench.common import copy_bandwidth_gbs, dump, environment, graph_ms
from rtp_fp8 import _ext
from rtp_fp8 import arch as A
from rtp_fp8.gemm.triton import block_scaled as G
from rtp_fp8.moe import ep_kernels as K
from rtp_fp8.moe import executors as X
from rtp_fp8.quant import activation_scale_layout
from rtp_fp8.quant import layout as L
from rtp_fp8.quant import token_group as T

H, TOPK, E_LOCAL, E_GLOBAL, ALIGN = 7168, 8, 32, 64, 128
FORMER_SILU_CONFIG = (4, 4, 4, 1)  # token_group.SILU_CONFIG before the persistent grid (a program per row block)


def routing(t, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    scores = torch.rand(t, E_GLOBAL, device="cuda", generator=g)
    w, ids = scores.topk(TOPK, dim=-1)
    return ids.to(torch.int32), torch.softmax(w, -1)


def layout_scatter(x, xs, ids, out, out_s, counters):
    """What "scatter" times: the contiguous layout for `out`'s rows and the copy (ep_dispatch, as
    the contiguous executor calls it)."""
    return K.ep_dispatch(x, xs, ids, E_LOCAL, out, out_s, ALIGN, num_global_experts=E_GLOBAL, counters=counters)[1]


def scatter_setup(t, layout):
    """(ids, weights, x, x_scales, out, out_scales, counters, local routes, tokens read, scatter bytes)."""
    ids, w = routing(t)
    x, xs = T.per_token_group_quant(torch.randn(t, H, device="cuda", dtype=torch.bfloat16), 128, scale_layout=layout)
    cap = K.workspace_rows(t * TOPK, E_LOCAL, ALIGN)
    out = torch.empty(cap, H, dtype=torch.float8_e4m3fn, device="cuda")
    out_s = L.alloc_scales((), cap, H // 128, layout, "cuda", zero=True)
    counters = torch.zeros(2, dtype=torch.int32, device="cuda")
    local = int(((ids >= 0) & (ids < E_LOCAL)).sum())
    tokens_read = int(((ids >= 0) & (ids < E_LOCAL)).any(dim=1).sum())
    srow = out_s.shape[1] * out_s.element_size()
    s_bytes = ids.numel() * 4 + tokens_read * (H + srow) + local * (H + srow) + cap * 4 + ids.numel() * 4
    return ids, w, x, xs, out, out_s, counters, local, tokens_read, s_bytes


def bench_scatter_gather(t, layout):
    ids, w, x, xs, out, out_s, counters, local, tokens_read, s_bytes = scatter_setup(t, layout)
    cap = out.shape[0]

    def scatter():
        return layout_scatter(x, xs, ids, out, out_s, counters)

    oidx = scatter()
    s_ms = graph_ms(scatter)
    y = torch.randn(cap, H, device="cuda", dtype=torch.bfloat16)
    yo = torch.empty(t, H, device="cuda", dtype=torch.bfloat16)
    g_ms = graph_ms(lambda: K.ep_gather(y, w, oidx, out=yo))
    g_bytes = local * H * 2 + w.numel() * 4 + oidx.numel() * 4 + t * H * 2
    # The scatter's traffic shape done by torch: each read row written `fan` times (copy_ of
    # an expanded source). A baseline, not a ceiling.
    fan = max(1, round(local / max(tokens_read, 1)))
    rows_n = min(local // fan, t)
    src, dst = x.view(torch.uint8)[:rows_n], out.view(torch.uint8)[:rows_n * fan].view(rows_n, fan, H)
    f_ms = graph_ms(lambda: dst.copy_(src.unsqueeze(1).expand(rows_n, fan, H)))
    f_gbs = rows_n * H * (1 + fan) / (f_ms * 1e-3) / 1e9
    return {"t": t, "local_routes": local, "scatter_us": s_ms * 1e3, "scatter_gbs": s_bytes / (s_ms * 1e-3) / 1e9,
            "gather_us": g_ms * 1e3, "gather_gbs": g_bytes / (g_ms * 1e-3) / 1e9, "fanout": fan,
            "fanout_copy_gbs": f_gbs}




def bench_executor(t=4096, inter=2048):
    arch = A.detect()
    g = torch.Generator(device="cuda").manual_seed(1)
    wg = torch.randn(E_LOCAL, inter, H, device="cuda", generator=g).div_(H**0.5).to(torch.bfloat16)
    wu = torch.randn(E_LOCAL, inter, H, device="cuda", generator=g).div_(H**0.5).to(torch.bfloat16)
    wd = torch.randn(E_LOCAL, H, inter, device="cuda", generator=g).div_(inter**0.5).to(torch.bfloat16)
    experts = X.QuantizedExperts.from_bf16(wg, wu, wd, arch)
    del wg, wu, wd
    ex = X.ContiguousExecutor(experts, t, TOPK, alignment=ALIGN, num_global_experts=E_GLOBAL)
    x = torch.randn(t, H, device="cuda", dtype=torch.bfloat16)
    ids, w = routing(t, seed=2)
    total = graph_ms(lambda: ex(x, ids, w))
    layout = ex.layout
    q, s = T.per_token_group_quant(x, 128, scale_layout=layout)
    lay, oidx = K.ep_dispatch(q, s, ids, E_LOCAL, ex.a, ex.a_scales, ALIGN, num_global_experts=E_GLOBAL)
    mi, c = lay[2], lay[3]
    parts = {
        "quant": graph_ms(lambda: T.per_token_group_quant(x, 128, scale_layout=layout)),
        "layout+scatter": graph_ms(lambda: layout_scatter(q, s, ids, ex.a, ex.a_scales, c)),
        "gemm gate_up": graph_ms(lambda: G.m_grouped_fp8_gemm_nt_contiguous(
            ex.a, ex.a_scales, experts.w13, experts.w13_scales, mi, out=ex.gate_up, alignment=ALIGN)),
        "silu*mul+quant": graph_ms(lambda: ex._silu_mul_quant(ex.gate_up, ex.act_q, ex.act_s, m_indices=mi)),
        "gemm down": graph_ms(lambda: G.m_grouped_fp8_gemm_nt_contiguous(
            ex.act_q, ex.act_s, experts.w2, experts.w2_scales, mi, out=ex.down, alignment=ALIGN)),
        "gather": graph_ms(lambda: K.ep_gather(ex.down, w, oidx)),
    }
    local = int(((ids >= 0) & (ids < E_LOCAL)).sum())
    flops = 2 * local * (2 * inter * H + inter * H)
    # before the padding rows were skipped: silu*mul+quant over every workspace row, and the forward with it
    all_rows = graph_ms(lambda: ex._silu_mul_quant(ex.gate_up, ex.act_q, ex.act_s))
    silu = ex._silu_mul_quant
    ex._silu_mul_quant = lambda gate_up, q_out, s_out, **skip: silu(gate_up, q_out, s_out)
    total_all_rows = graph_ms(lambda: ex(x, ids, w))
    ex._silu_mul_quant = silu
    # the step as shipped before the persistent grid: (4, 4, 4, 1) tiles, a program per row block (each
    # padding block a launch that returns)
    persist, tile = T.SILU_PROGRAMS_PER_SM, T.SILU_CONFIG
    T.SILU_PROGRAMS_PER_SM, T.SILU_CONFIG = 0, FORMER_SILU_CONFIG
    try:
        per_block = graph_ms(lambda: ex._silu_mul_quant(ex.gate_up, ex.act_q, ex.act_s, m_indices=mi))
        total_per_block = graph_ms(lambda: ex(x, ids, w))
    finally:
        T.SILU_PROGRAMS_PER_SM, T.SILU_CONFIG = persist, tile
    rows = int((mi >= 0).sum())
    silu_bytes = rows * (2 * inter * 2 + inter + 4 * inter // 128) + mi.numel() * 4  # bf16 in, fp8 + scales out, ids
    return {"t": t, "inter": inter, "cap": ex.cap, "local_routes": local, "total_us": total * 1e3,
            "parts_us": {k: v * 1e3 for k, v in parts.items()}, "sum_parts_us": sum(parts.values()) * 1e3,
            "tflops": flops / (total * 1e-3) / 1e12, "silu_rows": rows, "silu_bytes": silu_bytes,
            "silu_gbs": silu_bytes / (parts["silu*mul+quant"] * 1e-3) / 1e9, "silu_all_rows_us": all_rows * 1e3,
            "total_all_rows_us": total_all_rows * 1e3, "silu_programs_per_sm": persist, "silu_tile": list(tile),
            "silu_program_per_block_us": per_block * 1e3, "total_program_per_block_us": total_per_block * 1e3}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--no-cluster", action="store_true",
                    help="block_scaled.USE_CLUSTER off: the grouped GEMMs take the Triton kernels, not the extension's")
    a = ap.parse_args()
    G.USE_CLUSTER = not a.no_cluster
    env = environment()
    copy = copy_bandwidth_gbs()
    layout = activation_scale_layout(A.detect())
    rows = [bench_scatter_gather(t, layout) for t in (256, 4096, 16384)]
    for r in rows:
        r["scatter_ratio"], r["gather_ratio"] = r["scatter_gbs"] / copy, r["gather_gbs"] / copy
    ex = bench_executor()
    ext_grouped = _ext.has("fp8_gemm_sm90_contiguous")
    if a.out:
        dump(a.out, {"bench": "moe", "env": env, "copy_gbs": copy, "scale_layout": layout, "results": rows,
                     "executor": ex, "use_cluster": G.USE_CLUSTER, "extension_grouped_gemm": ext_grouped})
    print(env)
    print(f"copy bandwidth (read+write): {copy:.0f} GB/s; scales {layout}; USE_CLUSTER {G.USE_CLUSTER}, the "
          f"extension's grouped GEMM {'built' if ext_grouped else 'absent'}")
    print(f"{'T':>6s} {'routes':>7s} {'scatter us':>10s} {'GB/s':>6s} {'ratio':>5s} {'gather us':>9s} {'GB/s':>6s} "
          f"{'ratio':>5s}")
    for r in rows:
        print(f"{r['t']:6d} {r['local_routes']:7d} {r['scatter_us']:10.1f} {r['scatter_gbs']:6.0f} "
              f"{r['scatter_ratio']:5.2f} {r['gather_us']:9.1f} {r['gather_gbs']:6.0f} {r['gather_ratio']:5.2f}")
    print("torch fan-out copy (each row read once, written `fanout` times; copy_ of an expanded source): " +
          ", ".join(f"T={r['t']} x{r['fanout']} {r['fanout_copy_gbs']:.0f} GB/s" for r in rows))
    print(f"executor T={ex['t']} I={ex['inter']}: {ex['total_us']:.0f} us ({ex['tflops']:.0f} TFLOP/s) vs sum of parts "
          f"{ex['sum_parts_us']:.0f} us: " + ", ".join(f"{k} {v:.0f}" for k, v in ex["parts_us"].items()))
    print(f"silu*mul+quant over the {ex['silu_rows']} routed rows: {ex['parts_us']['silu*mul+quant']:.0f} us = "
          f"{ex['silu_gbs']:.0f} GB/s ({ex['silu_gbs'] / copy:.2f} of copy); over all {ex['cap']} workspace rows "
          f"{ex['silu_all_rows_us']:.0f} us; forward with the all-rows step {ex['total_all_rows_us']:.0f} us")
    print(f"silu*mul+quant: {ex['silu_tile']} tiles, {ex['silu_programs_per_sm']} row programs per SM "
          f"{ex['parts_us']['silu*mul+quant']:.1f} us (forward {ex['total_us']:.0f}); as before "
          f"({FORMER_SILU_CONFIG} tiles, a program per row block) {ex['silu_program_per_block_us']:.1f} us "
          f"(forward {ex['total_program_per_block_us']:.0f})")


if __name__ == "__main__":
    main()
