"""Does the order of bench/gemm.py's timings move its ratio to DeepGEMM? (issue #28)

    PYTHONPATH=. python3 bench/order_probe.py [--out o.json] [--pairs 3]

bench/gemm.py times, per shape: the shipped dispatch, then the Triton kernel it replaces (a lighter
load: about 60 % of the dispatch's TFLOP/s), then DeepGEMM, then DeepGEMM launched as a programmatic
dependent. An H100 running FP8 GEMMs at 1.1-1.3 PFLOP/s is held at its power limit, and its SM clock
follows the load of the last few milliseconds: a kernel timed right after a lighter one may start at a
higher clock. This probe times bench/gemm.py's dense M=4096 shapes on the same rotated operand sets
(bench.common.operand_sets) two ways:

- "gemm.py order": ours, the Triton kernel, DeepGEMM, as bench/gemm.py does (one time each);
- "alternating": DeepGEMM and ours in turn, --pairs times each, DeepGEMM first: each timing follows
  a timing of the other kernel. The ratio is the median of ours over the median of DeepGEMM's.

Beside each timing it records the SM clock (MHz) and board power (W) read through NVML just after it
(None where NVML's Python binding is not installed), so that a difference between the two orders can
be set against the clocks. Outputs are compared with DeepGEMM's on set 0: bit for bit, or within a
relative L2 of 1e-4 where the dispatch splits K (an AssertionError otherwise: a faster wrong kernel is
not a result).
"""

from __future__ import annotations

import argparse
import statistics

import torch

from bench.common import dump, environment, operand_sets, output_of, rel_l2, rotated_ms
from bench.gemm import DENSE, _deepgemm, dense_call, dense_inputs, flagged
from rtp_fp8 import arch as A
from rtp_fp8.gemm import deepgemm as D


def _nvml():
    """(SM clock MHz, board watts) now, or (None, None) where NVML's Python binding is not installed."""
    try:
        return torch.cuda.clock_rate(), torch.cuda.power_draw() / 1e3
    except (ModuleNotFoundError, RuntimeError):
        return None, None


def _timed(label, call, sets):
    us = rotated_ms(call, sets) * 1e3
    mhz, watts = _nvml()
    return {"label": label, "us": us, "sm_mhz": mhz, "watts": watts}


def probe(shape, dg, pairs):
    sets = operand_sets(lambda: dense_inputs(*shape))
    ours = dense_call
    triton = flagged(dense_call, USE_WS=False, USE_CLUSTER=False, FORCE_SPLIT_K=1)

    def deepgemm(a, sa, b, sb, o):
        D.fp8_gemm_nt(a, sa, b, sb, o, A.detect(), dg)

    want = output_of(deepgemm, sets[0], sets[0][4])
    got = output_of(ours, sets[0], sets[0][4])
    # bit-identical except where the dispatch splits K (the last columns of a column split)
    same = "bit" if torch.equal(got, want) else rel_l2(got, want)
    if same != "bit" and not same < 1e-4:
        raise AssertionError(f"{shape}: the dispatch's output is {same:.1e} (relative L2) from DeepGEMM's")
    first = [_timed("ours", ours, sets), _timed("triton", triton, sets), _timed("deepgemm", deepgemm, sets)]
    alt = []
    for _ in range(pairs):
        alt += [_timed("deepgemm", deepgemm, sets), _timed("ours", ours, sets)]

    def med(rows, label):
        return statistics.median(r["us"] for r in rows if r["label"] == label)

    return {"shape": list(shape), "operand_sets": len(sets), "same": same, "gemm_py_order": first, "alternating": alt,
            "ours_over_dg_gemm_py_order": first[2]["us"] / first[0]["us"],
            "ours_over_dg_alternating": med(alt, "deepgemm") / med(alt, "ours")}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--pairs", type=int, default=3)
    args = ap.parse_args()
    if args.pairs < 1:
        raise SystemExit(f"order_probe: --pairs must be at least 1, got {args.pairs}")
    dg, why = _deepgemm()
    if dg is None:
        raise SystemExit(f"order_probe: needs DeepGEMM ({why})")
    env = environment()
    env["deep_gemm"] = dg.version
    print(env, flush=True)
    rows = []
    for shape in [s for s in DENSE if s[0] == 4096]:
        r = probe(shape, dg, args.pairs)
        rows.append(r)
        clocks = " ".join(f"{t['label'][0]}{t['sm_mhz'] or '?'}" for t in r["gemm_py_order"] + r["alternating"])
        print(f"{str(tuple(shape)):>22s}  gemm.py order {r['ours_over_dg_gemm_py_order']:.3f}  "
              f"alternating {r['ours_over_dg_alternating']:.3f}  MHz {clocks}", flush=True)
        if args.out:
            dump(args.out, {"env": env, "rows": rows})

    def geo(key):
        return statistics.geometric_mean(r[key] for r in rows)

    print(f"geomean ours/dg: gemm.py order {geo('ours_over_dg_gemm_py_order'):.3f}, "
          f"alternating {geo('ours_over_dg_alternating'):.3f}")


if __name__ == "__main__":
    main()
