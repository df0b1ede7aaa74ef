"""A/B of the swapped kernel's 32-token tiles (block_scaled.SWAP_HALVE_T) on dense decode shapes.

    PYTHONPATH=. python3 bench/decode_ab.py [--out ab.json]

For each shape: the dispatch with SWAP_HALVE_T on (shipped) and off (64-token tiles, more K
splits), DeepGEMM beside both in the same run when it is importable (bench/gemm.py's dense()).
"""

from __future__ import annotations

import argparse

from bench.common import dump, environment
from bench.gemm import _deepgemm, dense
from rtp_fp8.gemm.triton import block_scaled as G

SHAPES = [(m, n, k) for m in (33, 48, 64) for n, k in ((4096, 7168), (7168, 2048))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    args = ap.parse_args()
    dg, why = _deepgemm()
    rows = []
    for m, n, k in SHAPES:
        for halve in (True, False):
            G.SWAP_HALVE_T = halve
            r = {"shape": [m, n, k], "halve_t": halve, **dense(m, n, k, dg)}
            rows.append(r)
            print(r["shape"], "halve" if halve else "64-token", r["kernel"], f"{r['ms'] * 1e3:.1f} us",
                  f"ours/dg {r.get('ours_over_dg', float('nan')):.2f}", r.get("vs_triton"), r.get("same"), flush=True)
    G.SWAP_HALVE_T = True
    if args.out:
        dump(args.out, {"env": {**environment(), "deep_gemm": dg.version if dg else f"absent: {why}"},
                        "results": rows})


if __name__ == "__main__":
    main()
