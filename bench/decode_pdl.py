"""Decode GEMMs launched dependent on the kernel before them (block_scaled.DEP_MODE), an experiment
(issue #28): a model's decode step quantizes its activations, then multiplies them by weights that no
kernel before it writes.

    PYTHONPATH=. python3 bench/decode_pdl.py [--out pdl.json] [--reps 3]

Timed per operand set: the chain per_token_group_quant_into(x -> a, sa) then fp8_gemm_nt(a, sa, w, sw)
in one CUDA graph, over operand sets rotated past the L2 (bench.common.operand_sets: the weights
come from device memory), with DEP_MODE 0 (plain launches), 1 (the GEMM launched dependent, waiting
for the quantization before its first load: the launch overlaps the quantization's tail) and 2 (as
1, having first asked the L2 for its weight rows), each also with the quantization letting its
dependents launch at its start (token_group.PDL_TRIGGER: modes d1t, d2t), in turn `--reps` times (medians of each rep's
CUDA-graph median). The quantization alone is timed too; chain - quant is the GEMM's share. The
memory-bound time is the weight bytes (values and scales) over the copy bandwidth measured in the
same run (bytes read + written / time, so a read of W bytes takes W / that). Every mode's output must
equal plain launches' bit for bit (the same products and sums), else the row says so. Shapes whose dispatch
does not take the swapped kernel (sm90_ws at 64 rows and N=7168) run the same kernel in every mode
and say so.
"""

from __future__ import annotations

import argparse
import statistics
from unittest import mock

import torch

from bench.common import copy_bandwidth_gbs, dump, environment, operand_sets, output_of, rotated_ms
from bench.gemm import EXPERT_NK
from rtp_fp8.gemm.triton import block_scaled as G
from rtp_fp8.quant import block as QB
from rtp_fp8.quant import token_group as QT

MODES = {"d0": (0, False), "d1": (1, False), "d2": (2, False), "d1t": (1, True), "d2t": (2, True)}
SHAPES = [(m, n, k) for m in (1, 16, 64) for n, k in EXPERT_NK]


def make(m, n, k):
    """(x, a, sa, w, sw, out): bf16 activations, their FP8 buffers, block-quantized weights, output."""
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    a, sa = QT.per_token_group_quant(x, 128, scale_layout="col_tma")
    w, sw = QB.quantize_weight_blocks(torch.randn(n, k, device="cuda", dtype=torch.bfloat16))
    return x, a, sa, w, sw, torch.empty(m, n, device="cuda", dtype=torch.bfloat16)


def quant(x, a, sa, w, sw, out):
    QT.per_token_group_quant_into(x, a, sa, 128, scale_layout="col_tma")


def chain(x, a, sa, w, sw, out):
    QT.per_token_group_quant_into(x, a, sa, 128, scale_layout="col_tma")
    G.fp8_gemm_nt(a, sa, w, sw, out=out)


def kernel(m, n, k):
    """Which GEMM kernel the dispatch runs for this shape (DEP_MODE reaches only the swapped one)."""
    return "sm90_ws" if G.ws_before_swap(m, n, k, torch.device("cuda")) else "swap"


def measure(call, sets, oi, reps):
    """{chain_us: {mode: median us}, chain_reps_us: each rep's}, or {error: why}: call(*ops) timed in
    each of MODES (block_scaled.DEP_MODE, token_group.PDL_TRIGGER) in turn, reps times; each mode's
    output (ops[oi]) on set 0 must equal the first mode's (plain launches) bit for bit."""
    times = {mode: [] for mode in MODES}
    ref = None
    for _ in range(reps):
        for mode, (dep, trigger) in MODES.items():
            with mock.patch.object(G, "DEP_MODE", dep), mock.patch.object(QT, "PDL_TRIGGER", trigger):
                got = output_of(call, sets[0], sets[0][oi])
                if ref is None:
                    ref = got
                elif not torch.equal(got, ref):
                    return {"error": f"mode {mode}'s output differs from plain launches'"}
                times[mode].append(rotated_ms(call, sets) * 1e3)
    return {"chain_us": {m: statistics.median(t) for m, t in times.items()}, "chain_reps_us": times}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    copy_gbs = copy_bandwidth_gbs()
    rows = []
    for m, n, k in SHAPES:
        sets = operand_sets(lambda m=m, n=n, k=k: make(m, n, k))
        w_bytes = n * k + (n // 128) * (k // 128) * 4
        r = {"shape": [m, n, k], "kernel": kernel(m, n, k), "operand_sets": len(sets),
             "quant_us": rotated_ms(quant, sets) * 1e3, "memory_bound_us": w_bytes / (copy_gbs * 1e3),
             **measure(chain, sets, 5, args.reps)}
        if "chain_us" in r:
            r["gemm_us"] = {mode: t - r["quant_us"] for mode, t in r["chain_us"].items()}
            r["gemm_vs_memory_bound"] = {mode: t / r["memory_bound_us"] for mode, t in r["gemm_us"].items()}
        rows.append(r)
        print(r, flush=True)
    res = {"env": environment(), "copy_gbs": copy_gbs, "rows": rows}
    if args.out:
        dump(args.out, res)
    print(f"copy {copy_gbs:.0f} GB/s (read + written)")
    print(f"{'shape':<18}{'kernel':<9}{'quant':>7}{'mem':>7}" + "".join(f"{'chain' + str(m):>9}" for m in MODES)
          + "".join(f"{'gemm/mem' + str(m):>11}" for m in MODES))
    for r in rows:
        head = f"{str(r['shape']):<18}{r['kernel']:<9}{r['quant_us']:7.2f}{r['memory_bound_us']:7.2f}"
        if "chain_us" not in r:
            print(head + "  " + r["error"])
            continue
        print(head + "".join(f"{r['chain_us'][m]:9.2f}" for m in MODES)
              + "".join(f"{r['gemm_vs_memory_bound'][m]:11.2f}" for m in MODES))


if __name__ == "__main__":
    main()
