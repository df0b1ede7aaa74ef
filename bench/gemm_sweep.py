"""Launch-shape sweep of the persistent TMA GEMM on the GPU: CTAs per SM and split-N halves.

    PYTHONPATH=. python3 bench/gemm_sweep.py [--out results.json]

For bench/gemm.py's M=4096 dense shapes and the G=8 grouped one, each candidate (config
keys of configs.json plus CTAS_PER_SM, the persistent programs per SM, and HALVES, two
half-width products per K step so one's MMA can overlap the other's promotion) is checked
against the default config's output, then timed (CUDA-graph replays).
"""

from __future__ import annotations

import argparse
import math

import torch

from bench.common import dump, environment, fp8_gemm_tflops, graph_ms
from bench.gemm import DENSE
from rtp_fp8.gemm.triton import block_scaled as G
from rtp_fp8.quant import block as B
from rtp_fp8.quant import token_group as T


def cfg(bm, bn, w, s, ctas=1, halves=1):
    return {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": 128, "num_warps": w, "num_stages": s, "GROUP_M": 8,
            "CTAS_PER_SM": ctas, "HALVES": halves}


CANDIDATES = [cfg(128, 128, 8, 4), cfg(128, 128, 8, 4, halves=2), cfg(128, 128, 8, 5, halves=2),
              cfg(128, 256, 8, 3), cfg(128, 256, 8, 3, halves=2), cfg(64, 128, 4, 4, ctas=2),
              cfg(64, 128, 4, 4, ctas=2, halves=2), cfg(64, 128, 4, 3, ctas=3), cfg(128, 128, 8, 3, ctas=2),
              cfg(64, 256, 4, 3, halves=2)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    a = ap.parse_args()
    ceiling = fp8_gemm_tflops()
    shapes = [s for s in DENSE if s[0] == 4096]
    ops = []
    for m, n, k in shapes:
        a_, sa = T.per_token_group_quant(torch.randn(m, k, device="cuda", dtype=torch.bfloat16), 128,
                                         scale_layout="col_tma")
        b, sb = B.quantize_weight_blocks(torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5)
        out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        ops.append((f"dense {m},{n},{k}", 2 * m * n * k, lambda a_=a_, sa=sa, b=b, sb=sb, out=out:
                    G.fp8_gemm_nt(a_, sa, b, sb, out=out), out))
    g, m, n, k = 8, 4096, 4096, 7168
    x, sx = T.per_token_group_quant(torch.randn(g * m, k, device="cuda", dtype=torch.bfloat16), 128,
                                    scale_layout="col_tma")
    w, sw = B.quantize_weight_blocks(torch.randn(g, n, k, device="cuda", dtype=torch.bfloat16) / k**0.5)
    ids = torch.arange(g, device="cuda", dtype=torch.int32).repeat_interleave(m)
    gout = torch.empty(g * m, n, device="cuda", dtype=torch.bfloat16)
    ops.append(("grouped G=8 4096,4096,7168", 2 * g * m * n * k,
                lambda: G.m_grouped_fp8_gemm_nt_contiguous(x, sx, w, sw, ids, out=gout), gout))
    refs = []
    for _, _, fn, out in ops:
        fn()
        refs.append(out.clone())
    rows = []
    for c in CANDIDATES:
        res = {"config": c, "tflops": {}, "exact": True}
        try:
            with G.config_override(c):
                for (name, flop, fn, out), ref in zip(ops, refs):
                    out.fill_(float("nan"))
                    fn()
                    torch.cuda.synchronize()
                    err = float((out.float() - ref.float()).norm() / ref.float().norm())
                    res["exact"] &= err < 1e-3
                    res["tflops"][name] = flop / (graph_ms(fn, rep=50) * 1e-3) / 1e12
        except Exception as exc:  # noqa: BLE001 - a candidate that cannot run is reported, not fatal
            res["error"] = f"{type(exc).__name__}: {str(exc)[:100]}"
        vals = [v for kname, v in res["tflops"].items() if kname.startswith("dense")]
        res["geomean_dense"] = math.exp(sum(map(math.log, vals)) / len(vals)) if len(vals) == len(shapes) else 0.0
        rows.append(res)
        print(c, {k2: round(v) for k2, v in res["tflops"].items()}, f"geomean {res['geomean_dense']:.0f}",
              "" if res["exact"] else "MISMATCH", res.get("error", ""), flush=True)
    if a.out:
        dump(a.out, {"bench": "gemm_sweep", "env": environment(), "cublaslt_fp8_tflops": ceiling, "results": rows})
    print(f"cuBLASLt {ceiling:.0f}")
    for r in sorted(rows, key=lambda r: -r["geomean_dense"]):
        c = r["config"]
        print(f"{c['BLOCK_M']}x{c['BLOCK_N']} w{c['num_warps']} s{c['num_stages']} ctas{c['CTAS_PER_SM']} "
              f"h{c['HALVES']}: geomean {r['geomean_dense']:.0f} grouped "
              f"{r['tflops'].get('grouped G=8 4096,4096,7168', 0):.0f}{'' if r['exact'] else ' MISMATCH'}")


if __name__ == "__main__":
    main()
