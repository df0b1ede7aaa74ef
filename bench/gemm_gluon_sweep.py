"""Sweep of the SM90 Gluon block-scaled GEMM (rtp_fp8/gemm/triton/sm90_gluon.py) on the GPU:
every candidate (ring depth, grouped-M width) is first checked against the Triton kernel of
block_scaled.py (outputs poisoned with NaN; max abs difference and relative L2 printed), then
timed on bench/gemm.py's shapes (CUDA-graph replays, medians).

    PYTHONPATH=. python3 bench/gemm_gluon_sweep.py [--out results.json]
"""

from __future__ import annotations

import argparse
import functools
import math

import torch

from bench.common import dump, environment, fp8_gemm_tflops, graph_ms
from bench.gemm import DENSE, GROUPED
from rtp_fp8.gemm.triton import block_scaled as G
from rtp_fp8.gemm.triton import sm90_gluon as S
from rtp_fp8.quant import block as B
from rtp_fp8.quant import token_group as T

# (ring depth, grouped-M width, diag): diag 1 skips the scale loads (wrong results, timed only, to
# show what the scale loads cost)
CANDIDATES = [(4, 8, 0), (5, 8, 0), (4, 8, 1)]


def operands(g, m, n, k, ids=None):
    x = torch.randn(g * m if ids is None else ids.numel(), k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(g, n, k, device="cuda", dtype=torch.bfloat16) / k**0.5
    a, sa = T.per_token_group_quant(x, 128, scale_layout="col_tma")
    b, sb = B.quantize_weight_blocks(w)
    return a, sa, b, sb


def run(mode, a, sa, b, sb, grp, cnt, out, stages, gm, diag=0):
    e, n, k = b.shape
    m = a.shape[0]
    nprog = min(-(-m // 128) * -(-n // 128), torch.cuda.get_device_properties(0).multi_processor_count)
    S.launch(mode, a, b.reshape(-1, k), out, sa, sb, grp, cnt, m, n, k, e, gm, nprog, stages, diag)


def check(mode, a, sa, b, sb, grp, stages, gm):
    e, n, k = b.shape
    m = a.shape[0]
    ref = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    c_ref = torch.zeros(2, device="cuda", dtype=torch.int32)
    if mode == 0:
        G.fp8_gemm_nt(a, sa, b[0], sb[0], out=ref)
    else:
        G.m_grouped_fp8_gemm_nt_contiguous(a, sa, b, sb, grp, out=ref, counters=c_ref)
    out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    cnt = torch.zeros(2, device="cuda", dtype=torch.int32)
    run(mode, a, sa, b, sb, grp, cnt, out, stages, gm)
    torch.cuda.synchronize()
    diff = (out.float() - ref.float())
    rel = float(diff.norm() / ref.float().norm().clamp_min(1e-30))
    return {"nan": bool(out.isnan().any()), "max_abs": float(diff.abs().max()), "rel_l2": rel,
            "exact": bool(torch.equal(out, ref)), "counters_equal": bool(torch.equal(cnt, c_ref)) if mode else True}


def key(stages, gm, diag):
    return f"s{stages}_g{gm}" + ("_noscale" if diag else "")


def ragged_ids():
    """4 experts with 100, 0, 300, 57 rows, 128-aligned segments (-1 padding), then 3 unused tiles."""
    parts = []
    for ex, rows in enumerate((100, 0, 300, 57)):
        seg = -(-rows // 128) * 128
        parts += [torch.full((rows,), ex), torch.full((seg - rows,), -1)]
    parts += [torch.full((384,), -1)]
    ids = torch.cat(parts).to(torch.int32).cuda()
    ids[5] = 7  # an id no expert owns inside a valid tile: a zero row, counted
    return ids


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    a_ = ap.parse_args()
    ceiling = fp8_gemm_tflops()
    checks, rows = [], []
    for stages, gm, diag in CANDIDATES:
        if diag:
            continue
        for name, (mode, g, m, n, k, ids) in {
            "dense 4096x2112x7168": (0, 1, 4096, 2112, 7168, None),
            "dense 1000x384x640 (partial tiles)": (0, 1, 1000, 384, 640, None),
            "dense 7x4096x7168": (0, 1, 7, 4096, 7168, None),
            "contiguous ragged": (1, 4, 0, 512, 1024, ragged_ids()),
        }.items():
            ops = operands(g, m, n, k, ids)
            grp = ids if ids is not None else torch.zeros(1, device="cuda", dtype=torch.int32)
            checks.append({"stages": stages, "group_m": gm, "case": name,
                           **check(mode, ops[0], ops[1], ops[2], ops[3], grp, stages, gm)})
            print(checks[-1], flush=True)
    for m, n, k in DENSE:
        a, sa, b, sb = operands(1, m, n, k)
        out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        grp = torch.zeros(1, device="cuda", dtype=torch.int32)
        cnt = torch.zeros(2, device="cuda", dtype=torch.int32)
        r = {"kind": "dense", "shape": [m, n, k]}
        r["triton_ms"] = graph_ms(functools.partial(G.fp8_gemm_nt, a, sa, b[0], sb[0], out=out))
        for stages, gm, diag in CANDIDATES:
            r[key(stages, gm, diag)] = graph_ms(functools.partial(run, 0, a, sa, b, sb, grp, cnt, out, stages, gm,
                                                                  diag))
        rows.append(r)
        print(r, flush=True)
    for g, m, n, k in GROUPED:
        a, sa, b, sb = operands(g, m, n, k)
        ids = torch.arange(g, device="cuda", dtype=torch.int32).repeat_interleave(m)
        out = torch.empty(g * m, n, device="cuda", dtype=torch.bfloat16)
        cnt = torch.zeros(2, device="cuda", dtype=torch.int32)
        r = {"kind": f"contiguous G={g}", "shape": [g * m, n, k]}
        r["triton_ms"] = graph_ms(functools.partial(G.m_grouped_fp8_gemm_nt_contiguous, a, sa, b, sb, ids, out=out,
                                                    counters=cnt))
        for stages, gm, diag in CANDIDATES:
            r[key(stages, gm, diag)] = graph_ms(functools.partial(run, 1, a, sa, b, sb, ids, cnt, out, stages, gm,
                                                                  diag))
        rows.append(r)
        print(r, flush=True)
    for r in rows:
        fl = 2 * math.prod(r["shape"])
        r["tflops"] = {key: fl / (v * 1e-3) / 1e12 for key, v in r.items() if key.endswith("_ms") or key.startswith("s")
                       and key[1].isdigit()}
    if a_.out:
        dump(a_.out, {"bench": "gemm_gluon_sweep", "env": environment(), "cublaslt_fp8_tflops": ceiling,
                      "checks": checks, "results": rows})
    print(environment())
    print(f"cuBLASLt per-tensor 8192^3: {ceiling:.0f} TFLOP/s")
    keys = ["triton_ms"] + [key(*c) for c in CANDIDATES]
    print(f"{'kind':16s} {'shape':>20s} " + " ".join(f"{k_[:9]:>9s}" for k_ in keys))
    for r in rows:
        print(f"{r['kind']:16s} {str(tuple(r['shape'])):>20s} " + " ".join(f"{r['tflops'][k_]:9.0f}" for k_ in keys))
    for kind in ("dense", "contiguous"):
        sel = [r for r in rows if r["kind"].startswith(kind) and r["shape"][0] >= 4096]
        print(kind, "geomean M>=4096: " + ", ".join(
            f"{k_} {math.exp(sum(math.log(r['tflops'][k_]) for r in sel) / len(sel)):.0f}" for k_ in keys))
    bad = [c for c in checks if c["nan"] or c["rel_l2"] > 1e-2 or not c["counters_equal"]]
    print("checks:", len(checks), "bad:", len(bad), "exact:", sum(c["exact"] for c in checks))


if __name__ == "__main__":
    main()
