"""The CUDA SM90 narrow GEMM (csrc/fp8_gemm_sm90.cu: 64 x block_n tiles, one consumer warpgroup, a
deep ring) against the shipped dispatch and DeepGEMM at bench/gemm.py's small-M dense shapes (issue #28's
decode rows).

    PYTHONPATH=. python3 bench/sm90_narrow.py [--out n.json] [--block-n 32 64 128] [--stages 6 8 0]
        [--rows 16 64 128 256] [--nk 4096x7168 7168x2048] [--multicast off|on|both] [--pdl 0 1 2] [--reps 2]
        [--no-deepgemm]

Needs the extension built (python3 tools/build_ext.py). Operand sets are rotated past the L2
(bench.common.operand_sets), so each call reads its weights from device memory. Each rep times the
dispatch (as shipped), with block_scaled.USE_PDL off and with USE_NARROW off, the narrow kernel at
each --block-n, --stages (0: as many slots as fit, recorded under env.narrow_stages) and --multicast
setting, and DeepGEMM when it runs here, plainly and with deep_gemm.set_pdl(True); medians
over reps of each rep's CUDA-graph median. The narrow kernel's output on set 0 must equal the Triton
kernel's (unsplit) bit for bit (an AssertionError otherwise).
Beside the times: the memory-bound limit, the weight's bytes at the copy bandwidth measured in the
same run.
"""

from __future__ import annotations

import argparse

from bench.common import copy_bandwidth_gbs, dump, fp8_gemm_tflops, nk_pair, operand_sets
from bench.gemm import EXPERT_NK, dense_call, dense_inputs, flagged
from bench.sm90_cluster import extension_env, measure
from rtp_fp8 import _ext
from rtp_fp8 import arch as A
from rtp_fp8.gemm import deepgemm as D


def variants(block_ns, stages, dg, multicast=(False, True), pdl=(0,)):
    """[(label, call(a, sa, b, sb, out))]: the shipped dispatch, with programmatic dependent launches off
    (block_scaled.USE_PDL), with sm90_ws launched in pdl mode 1 or plainly (block_scaled.WS_PDL: "dispatch
    ws pdl1", "dispatch ws plain"), with USE_NARROW off (the swapped kernel or sm90_ws), the narrow kernel
    per block_n, stages ("narrow 64x64 s8"; s0: as many as fit), multicast setting (" mc": 2-CTA clusters
    sharing A) and pdl mode (" pdl1": a programmatic dependent, " pdl2": one that lets its dependents launch
    early; none: a plain launch), DeepGEMM plainly and with deep_gemm.set_pdl(True) ("deepgemm pdl")."""

    out = [("dispatch", dense_call), ("dispatch no pdl", flagged(dense_call, USE_PDL=False)),
           ("dispatch ws pdl1", flagged(dense_call, WS_PDL=1)), ("dispatch ws plain", flagged(dense_call, WS_PDL=0)),
           ("without narrow", flagged(dense_call, USE_NARROW=False))]
    out += [(f"narrow 64x{bn} s{st}{' mc' if mc else ''}{f' pdl{pd}' if pd else ''}",
             lambda a, sa, b, sb, o, bn=bn, st=st, mc=mc, pd=pd: _ext.fp8_gemm_sm90_narrow(a, sa, b, sb, o, bn, st,
                                                                                           mc, pd))
            for bn in block_ns for st in stages for mc in multicast for pd in pdl
            if st <= _ext.fp8_gemm_sm90_narrow_stages(bn)]
    if dg is not None:
        out.append(("deepgemm", lambda a, sa, b, sb, o: D.fp8_gemm_nt(a, sa, b, sb, o, A.detect(), dg)))

        def dg_pdl(a, sa, b, sb, o):
            with D.pdl_launches(dg):
                D.fp8_gemm_nt(a, sa, b, sb, o, A.detect(), dg)

        out.append(("deepgemm pdl", dg_pdl))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--block-n", type=int, nargs="+", default=[32, 64, 128])
    ap.add_argument("--stages", type=int, nargs="+", default=[6, 8, 0])
    ap.add_argument("--rows", type=int, nargs="+", default=[16, 64, 128, 256])
    ap.add_argument("--nk", nargs="+", type=nk_pair, default=list(EXPERT_NK),
                    help="NxK of the weights, e.g. 7168x2048 (default: DeepSeek-V3's expert gate_up and down)")
    ap.add_argument("--multicast", choices=["off", "on", "both"], default="both")
    ap.add_argument("--pdl", type=int, nargs="+", choices=[0, 1, 2], default=[0],
                    help="the narrow kernel's launch modes to time (0 plain, 1 a programmatic dependent, "
                         "2 one that lets its dependents launch early)")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--no-deepgemm", action="store_true")
    args = ap.parse_args()
    dg, env = extension_env("sm90_narrow", args.no_deepgemm)
    ceiling = fp8_gemm_tflops()
    bandwidth = copy_bandwidth_gbs()
    env["narrow_stages"] = {bn: _ext.fp8_gemm_sm90_narrow_stages(bn) for bn in args.block_n}
    print(env)
    print(f"cuBLASLt per-tensor FP8 GEMM 8192^3: {ceiling:.0f} TFLOP/s; copy {bandwidth:.0f} GB/s", flush=True)
    todo = variants(args.block_n, args.stages, dg, {"off": (False,), "on": (True,), "both": (False, True)}[
        args.multicast], tuple(args.pdl))
    rows = []
    for m in args.rows:
        for n, k in args.nk:
            sets = operand_sets(lambda s=(m, n, k): dense_inputs(*s))
            r = measure(sets, 4, todo, args.reps, exact="narrow", ref=0)
            r["tflops"] = {label: 2 * m * n * k / (us * 1e-6) / 1e12 for label, us in r["us"].items()}
            limit_us = n * k / (bandwidth * 1e9) * 1e6
            rows.append({"shape": [m, n, k], "operand_sets": len(sets), "limit_us": limit_us, **r})
            best = min((us, label) for label, us in r["us"].items() if label.startswith("narrow"))
            cells = "  ".join(f"{label} {us:6.1f}" for label, us in r["us"].items())
            print(f"{str((m, n, k)):>18s} limit {limit_us:5.1f} us  {cells}  best {best[1]}  same {r['same']}",
                  flush=True)
            if args.out:
                dump(args.out, {"env": env, "cublaslt_fp8_tflops": ceiling, "copy_gbs": bandwidth, "rows": rows})


if __name__ == "__main__":
    main()
