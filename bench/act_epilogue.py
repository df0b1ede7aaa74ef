"""The MoE activation fused into the contiguous gate/up GEMM's epilogue (sm90_ws ACT) against the
GEMM into bf16 gate_up followed by silu_mul_quant_into, on the H200, per case:

- `packed`: every row routed (E experts of R rows, no padding): the epilogue's cost per tile;
- `short-K`: the same rows with K=512, where the epilogue weighs most;
- `executor`: the executor's workspace at T=4096, I=2048 (bench/moe.py's routing), with its
  padding and its padding-only tail tiles.

Per case: the unfused GEMM (128x256 tiles, as the executor runs it), silu*mul+quant over the
routed rows, the fused GEMM, and the fused GEMM's extra time per 128x256 tile of an expert on
each SM ((fused - GEMM) / (expert tiles / SMs)). CUDA-graph medians; `same`: the fused FP8
activation and scales on the routed rows against the unfused pair's, `bit` or rows that differ.

    PYTHONPATH=. python bench/act_epilogue.py --out docs/bench_act_epilogue_<run>.json
"""

from __future__ import annotations

import argparse

import torch

from bench.common import dump, environment, graph_ms
from rtp_fp8 import arch as A
from rtp_fp8.gemm.triton import block_scaled as G
from rtp_fp8.quant import block as B
from rtp_fp8.quant import layout as L
from rtp_fp8.quant import token_group as T

H, ALIGN = 7168, 128


def _ids(counts, cap):
    """m_indices: expert e's counts[e] rows padded to ALIGN, then -1 rows up to cap."""
    parts = []
    for e, c in enumerate(counts):
        parts += [torch.full((c, ), e, dtype=torch.int32), torch.full((-c % ALIGN, ), -1, dtype=torch.int32)]
    ids = torch.cat(parts)
    return torch.cat([ids, torch.full((cap - ids.numel(), ), -1, dtype=torch.int32)]).cuda()


def case(name, counts, cap, k, inter, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    e = len(counts)
    ids = _ids(counts, cap)
    m = ids.numel()
    x = torch.randn(m, k, device="cuda", generator=g).to(torch.bfloat16)
    a, sa = T.per_token_group_quant(x, 128, scale_layout="col_tma")
    del x
    w = (torch.randn(e, 2 * inter, k, device="cuda", generator=g) / k**0.5).to(torch.bfloat16)
    b, sb = B.quantize_weight_blocks(w)
    del w
    gate_up = torch.empty(m, 2 * inter, dtype=torch.bfloat16, device="cuda")
    q0 = torch.empty(m, inter, dtype=torch.float8_e4m3fn, device="cuda")
    s0 = L.alloc_scales((), m, inter // 128, "col_tma", "cuda", zero=True)
    q1, s1 = torch.empty_like(q0), L.alloc_scales((), m, inter // 128, "col_tma", "cuda", zero=True)
    why = G.silu_quant_refusal(a, sa, b, sb, q1, s1, ALIGN)
    gemm = graph_ms(lambda: G.m_grouped_fp8_gemm_nt_contiguous(a, sa, b, sb, ids, out=gate_up, alignment=ALIGN))
    silu = graph_ms(lambda: T.silu_mul_quant_into(gate_up, q0, s0, 128, "col_tma", m_indices=ids))
    fused = None if why else graph_ms(lambda: G.m_grouped_fp8_gemm_nt_contiguous_silu_quant(
        a, sa, b, sb, ids, q1, s1, "col_tma", alignment=ALIGN))
    routed = ids >= 0
    diff = None if why else (int((q0.view(torch.uint8)[routed] != q1.view(torch.uint8)[routed]).any(1).sum())
                             + int((s0[routed] != s1[routed]).any(1).sum()))
    sms = A.num_sms(0)
    tiles = int((ids.view(-1, 128)[:, 0] >= 0).sum()) * (inter // 128)
    return {"case": name, "rows": m, "routed": int(routed.sum()), "k": k, "inter": inter, "experts": e,
            "expert_tiles": tiles, "gemm_us": gemm * 1e3, "silu_us": silu * 1e3,
            "fused_us": None if fused is None else fused * 1e3, "refused": why,
            "extra_per_tile_us": None if fused is None else (fused - gemm) * 1e3 / (tiles / sms),
            "same": None if diff is None else "bit" if diff == 0 else f"{diff} rows differ"}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    args = ap.parse_args()
    g = torch.Generator().manual_seed(3)
    routed = (torch.rand(32, generator=g) * 240 + 392).long().tolist()  # about 16400 routes over 32 experts
    rows = [case("packed", [512] * 8, 4096, H, 2048), case("short-K", [512] * 8, 4096, 512, 2048),
            case("executor", routed, 36864, H, 2048)]
    env = environment()
    if args.out:
        dump(args.out, {"bench": "act_epilogue", "env": env, "results": rows})
    print(env)
    print(f"{'case':>9s} {'routed':>7s} {'K':>5s} {'tiles':>6s} {'gemm us':>8s} {'silu us':>8s} {'sum':>7s} "
          f"{'fused us':>8s} {'extra/tile':>10s} same")
    for r in rows:
        fused = f"{r['fused_us']:8.1f} {r['extra_per_tile_us']:10.2f}" if r["fused_us"] else f"{r['refused']}"
        print(f"{r['case']:>9s} {r['routed']:7d} {r['k']:5d} {r['expert_tiles']:6d} {r['gemm_us']:8.1f} "
              f"{r['silu_us']:8.1f} {r['gemm_us'] + r['silu_us']:7.1f} {fused} {r['same']}")


if __name__ == "__main__":
    main()
