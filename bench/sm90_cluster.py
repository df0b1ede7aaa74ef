"""The CUDA SM90 GEMM with 2-CTA clusters multicasting B (csrc/fp8_gemm_sm90.cu) against the dispatch
without it (block_scaled.USE_CLUSTER off: sm90_ws's Gluon 128x256 tiles at these shapes), the dispatch
with it (as shipped) and DeepGEMM, on bench/gemm.py's M=4096 dense and contiguous grouped shapes (issue #28).

    PYTHONPATH=. python3 bench/sm90_cluster.py [--out c.json] [--group-m 8 16] [--clusters 0 66]
        [--no-multicast] [--reps 2] [--only cluster deepgemm] [--dense]

Needs the extension built (python3 tools/build_ext.py). Operand sets are rotated past the L2
(bench.common.operand_sets). Each rep times the dispatch without the cluster kernel and with it, the
cluster kernel called directly at each --group-m and --clusters cap (0: as many clusters as fit, the
count the run records under env.clusters_fit), and DeepGEMM when it runs here; medians over reps of
each rep's CUDA-graph median, each rep's times kept. The cluster kernel's output on set 0 must equal
the Triton kernel's (unsplit) bit for bit (an AssertionError otherwise); the others' are compared and
reported. TFLOP/s beside cuBLASLt's FP8 GEMM measured in the same run.
"""

from __future__ import annotations

import argparse
import statistics

import torch

from bench.common import dump, environment, fp8_gemm_tflops, operand_sets, output_of, rel_l2, rotated_ms
from bench.gemm import (
    DENSE,
    GROUPED,
    _deepgemm,
    dense_call,
    dense_inputs,
    flagged,
    grouped_call,
    grouped_inputs,
    patched,
)
from rtp_fp8 import _ext
from rtp_fp8 import arch as A
from rtp_fp8.gemm import deepgemm as D
from rtp_fp8.gemm.triton import block_scaled as G

SHAPES = [("dense", s) for s in DENSE if s[0] == 4096] + [("contiguous", s) for s in GROUPED]


def _label(g, c, mc=True):
    return f"cluster g{g}" + (f" c{c}" if c else "") + ("" if mc else " nomc")


def _knobs(group_ms, caps, multicast):
    return [(g, c, mc) for g in group_ms for c in caps for mc in multicast]


def variants(kind, group_ms, dg, caps=(0,), multicast=(True,)):
    """[(label, call(*ops))] for a dense_inputs / grouped_inputs tuple: the dispatch without the cluster
    kernel (sm90_ws), the dispatch with it (block_scaled.USE_CLUSTER on, as shipped), the cluster kernel
    called directly per group_m, clusters cap (0: as many as fit; a dense call's tail columns in it
    too, no column split) and multicast setting (False: "nomc", each CTA loads its own B), DeepGEMM."""
    shipped = dense_call if kind == "dense" else grouped_call

    out = [("sm90_ws", flagged(shipped, USE_CLUSTER=False)), ("dispatch", flagged(shipped, USE_CLUSTER=True))]
    if kind == "dense":
        out += [(_label(*k), lambda a, sa, b, sb, o, k=k: _ext.fp8_gemm_sm90(a, sa, b, sb, o, *k))
                for k in _knobs(group_ms, caps, multicast)]
        if dg is not None:
            out.append(("deepgemm", lambda a, sa, b, sb, o: D.fp8_gemm_nt(a, sa, b, sb, o, A.detect(), dg)))
    else:
        out += [(_label(*k), lambda a, sa, b, sb, ids, o, cnt, k=k: _ext.fp8_gemm_sm90_contiguous(
            a, sa, b, sb, ids, o, cnt, *k)) for k in _knobs(group_ms, caps, multicast)]
        if dg is not None:
            def deepgemm(a, sa, b, sb, ids, o, cnt):
                with D.mk_alignment(128, dg):
                    D.m_grouped_fp8_gemm_nt_contiguous(a, sa, b, sb, ids, o, A.detect(), dg)
            out.append(("deepgemm", deepgemm))
    return out


def measure(sets, oi, todo, reps, exact="cluster", ref=1, only=None):
    """{label: median us}, each rep's times, and how each output (ops[oi]) compares with the Triton
    kernel's, unsplit (the dispatch splits K in the last columns of a column split): todo[ref]'s
    variant, the dispatch, with block_scaled's flags set to take it. Variants whose label starts with
    `exact` must give its bits. `only`: label prefixes to compare and time (None: every variant); the
    reference is computed either way."""
    with patched(USE_WS=False, USE_SWAP=False, USE_NARROW=False, FORCE_SPLIT_K=1):
        want = output_of(todo[ref][1], sets[0], sets[0][oi])
    if only is not None:
        todo = [(label, call) for label, call in todo if label.startswith(tuple(only))]
    same = {}
    for label, call in todo:
        got = output_of(call, sets[0], sets[0][oi])
        same[label] = "bit" if torch.equal(got, want) else f"{rel_l2(got, want):.1e}"
        if label.startswith(exact) and same[label] != "bit":
            raise AssertionError(f"{label} differs from the Triton kernel (relative L2 {same[label]})")
    times = {label: [] for label, _ in todo}
    for _ in range(reps):
        for label, call in todo:
            times[label].append(rotated_ms(call, sets) * 1e3)
    return {"us": {k: statistics.median(v) for k, v in times.items()}, "reps_us": times, "same": same}


def extension_env(name, no_deepgemm):
    """(DeepGEMM or None, the run's environment naming its DeepGEMM) for a bench of the CUDA extension's
    kernels (this one and bench/sm90_narrow.py); a SystemExit naming `name` where the extension is not
    built."""
    if not _ext.available():
        raise SystemExit(f"{name}: the extension is not built ({_ext.unavailable_reason()})")
    dg, why = (None, "--no-deepgemm") if no_deepgemm else _deepgemm()
    env = environment()
    env["deep_gemm"] = dg.version if dg is not None else f"absent: {why}"
    return dg, env


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--group-m", type=int, nargs="+", default=[G.CLUSTER_GROUP_M])
    ap.add_argument("--clusters", type=int, nargs="+", default=[0],
                    help="caps on the 2-CTA clusters launched (0: as many as fit, fp8_gemm_sm90_clusters)")
    ap.add_argument("--no-multicast", action="store_true",
                    help="also each cluster variant with multicast off (each CTA loads its own B)")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--no-deepgemm", action="store_true")
    ap.add_argument("--only", nargs="+", metavar="PREFIX",
                    help="time only the variants whose label starts with one of these (e.g. 'cluster' 'deepgemm')")
    ap.add_argument("--dense", action="store_true", help="the dense shapes only")
    args = ap.parse_args()
    dg, env = extension_env("sm90_cluster", args.no_deepgemm)
    ceiling = fp8_gemm_tflops()
    # the clusters that fit at once (the grid when no cap is given), at the shortest and longest K
    env["clusters_fit"] = {k: _ext.fp8_gemm_sm90_clusters(k) for k in (512, 16384)}
    print(env)
    print(f"cuBLASLt per-tensor FP8 GEMM 8192^3: {ceiling:.0f} TFLOP/s", flush=True)
    rows = []
    for kind, shape in SHAPES:
        if args.dense and kind != "dense":
            continue
        if kind == "dense":
            sets, oi = operand_sets(lambda s=shape: dense_inputs(*s)), 4
            flops = 2 * shape[0] * shape[1] * shape[2]
        else:
            sets, oi = operand_sets(lambda s=shape: grouped_inputs(*s)), 5
            flops = 2 * shape[0] * shape[1] * shape[2] * shape[3]
        r = measure(sets, oi, variants(kind, args.group_m, dg, args.clusters,
                                            (True, False) if args.no_multicast else (True,)), args.reps,
                    only=args.only)
        r["tflops"] = {label: flops / (us * 1e-6) / 1e12 for label, us in r["us"].items()}
        rows.append({"kind": kind, "shape": list(shape), "operand_sets": len(sets), **r})
        cells = "  ".join(f"{label} {us:7.1f} us {r['tflops'][label]:5.0f}" for label, us in r["us"].items())
        print(f"{kind:10s} {str(tuple(shape)):>22s}  {cells}  same {r['same']}", flush=True)
        if args.out:
            dump(args.out, {"env": env, "cublaslt_fp8_tflops": ceiling, "rows": rows})


if __name__ == "__main__":
    main()
