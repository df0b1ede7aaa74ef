"""Where sm90_ws loses to DeepGEMM, read from the hardware counters (issue #28): a program for ncu.

    ncu --clock-control none --profile-from-start off --set full -o prof \\
        python3 bench/ncu_probe.py [--shapes 128,4096,7168 64,7168,2048] [--ws-stages 6 10] [--cluster]
        [--narrow 32,16 64,13]

Each shape's operands are made and both GEMMs (our shipped dispatch and DeepGEMM when it imports)
run three times outside the profiled range, so compiles, autotuning and DeepGEMM's JIT stay out
of it. Then the profiler range (cudaProfilerStart / Stop) holds one call of each, so ncu's report
has one entry per kernel launched: compare their sections (SpeedOfLight, MemoryWorkloadAnalysis,
WarpStateStats, SourceCounters). Timing belongs to bench/gemm.py: ncu replays each kernel with its
caches flushed. Outputs are checked bit for bit against each other after the range.

--ws-stages: sm90_ws at the dispatch's tile with those ring depths too (one more entry each), for
why rings deeper than 6 slots ran slower over rotated operands (docs/perf.md, 2026-12-04k).
--cluster: the CUDA cluster kernel (csrc/fp8_gemm_sm90.cu) too, multicasting B and with multicast off
(two more entries), for where it loses time to sm90_ws and DeepGEMM (docs/perf.md, sixteenth session).
--narrow BN,S ...: the CUDA narrow kernel in 64 x BN tiles with an S-slot ring (one entry each), for
where it loses time to DeepGEMM's same tiles (DeepGEMM 2.6.1 runs 64x64 with 13 slots at (128, 4096,
7168), as it printed, and 64x32 with 16 at (64, 4096, 7168) as its heuristic reads, not printed;
docs/perf.md, eighteenth session).
"""

from __future__ import annotations

import argparse

import torch

from bench.gemm import _deepgemm, dense_inputs
from rtp_fp8 import _ext
from rtp_fp8 import arch as A
from rtp_fp8.gemm import deepgemm as D
from rtp_fp8.gemm.triton import block_scaled as G

SHAPES = [(128, 4096, 7168), (64, 7168, 2048), (4096, 7168, 16384)]


def _shape(text):
    try:
        m, n, k = (int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--shapes: expected M,N,K, got {text!r}") from None
    if min(m, n, k) <= 0 or k % 128 or n % 64:
        raise argparse.ArgumentTypeError(f"--shapes: {text!r} needs M, N, K > 0, K % 128 == 0, N % 64 == 0")
    return m, n, k


def _narrow(text):
    try:
        bn, st = (int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--narrow: expected BN,S, got {text!r}") from None
    if bn not in (32, 56, 64, 112, 128) or not 2 <= st <= 16:
        raise argparse.ArgumentTypeError(f"--narrow: {text!r} needs BN of 32, 56, 64, 112 or 128 and S of 2 to 16")
    return bn, st


def _variants(a, sa, b, sb, out, stages, dg, cluster=False, narrow=()):
    """[(label, call, its output)]: the shipped dispatch ("ours"), sm90_ws at the dispatch's tile with
    each ring depth in `stages` ("ours sN", the depth patched as bench/decode_sweep.py's ring sweep
    patches it, inside the call so that the profiled launch reads it), with `cluster` the CUDA cluster
    kernel multicasting B and not ("cluster", "cluster nomc"), the narrow kernel per (block_n, stages)
    in `narrow` ("narrow 64x32 s16"), DeepGEMM when it imports."""
    from bench.decode_sweep import _ws_ring

    def ours(o, depth=None):
        if depth is None:
            return lambda: G.fp8_gemm_nt(a, sa, b, sb, out=o)
        bm, bn = G.sm90_ws.tile_shape(a.shape[0], b.shape[0], A.num_sms(0))

        def call():
            with _ws_ring(bm, bn, depth):
                G.fp8_gemm_nt(a, sa, b, sb, out=o)
        return call

    out.fill_(float("nan"))
    calls = [("ours", ours(out), out)]
    for depth in stages:
        o = torch.full_like(out, float("nan"))
        calls.append((f"ours s{depth}", ours(o, depth), o))
    for label, mc in (("cluster", True), ("cluster nomc", False)) if cluster else ():
        o = torch.full_like(out, float("nan"))
        calls.append((label, lambda o=o, mc=mc: _ext.fp8_gemm_sm90(a, sa, b, sb, o, G.CLUSTER_GROUP_M, 0, mc), o))
    for bn, st in narrow:
        o = torch.full_like(out, float("nan"))
        calls.append((f"narrow 64x{bn} s{st}", lambda o=o, bn=bn, st=st: _ext.fp8_gemm_sm90_narrow(
            a, sa, b, sb, o, bn, st), o))
    if dg is not None:
        o = torch.full_like(out, float("nan"))
        calls.append(("deep_gemm", lambda: D.fp8_gemm_nt(a, sa, b, sb, o, A.detect(), dg), o))
    return calls


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", nargs="+", type=_shape, default=SHAPES, help="M,N,K (default: %(default)s)")
    p.add_argument("--ws-stages", nargs="+", type=int, default=[], metavar="N",
                   help="also sm90_ws at the dispatch's tile with an N-slot ring (shapes it takes)")
    p.add_argument("--cluster", action="store_true",
                   help="also the CUDA cluster kernel, multicasting B and not (needs the extension built)")
    p.add_argument("--narrow", nargs="+", type=_narrow, default=[], metavar="BN,S",
                   help="also the CUDA narrow kernel in 64xBN tiles with S ring slots (needs the extension built)")
    args = p.parse_args(argv)
    if (args.cluster or args.narrow) and not _ext.available():
        raise SystemExit(f"ncu_probe: --cluster and --narrow need the extension ({_ext.unavailable_reason()})")
    dg, why = _deepgemm()
    print(f"deep_gemm: {dg.version if dg is not None else 'absent: ' + why}")
    calls = []
    for m, n, k in args.shapes:
        torch.manual_seed(m + n + k)
        variants = _variants(*dense_inputs(m, n, k), args.ws_stages, dg, args.cluster, args.narrow)
        for _ in range(3):
            for _, call, _ in variants:
                call()
        calls.append(((m, n, k), variants))
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for shape, variants in calls:
        for label, call, _ in variants:
            torch.cuda.nvtx.range_push(f"{label} {shape}")
            call()
            torch.cuda.nvtx.range_pop()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    for shape, variants in calls:
        ref = variants[0][2]
        for label, _, out in variants[1:]:
            print(f"{shape}: ours vs {label}: {'bit' if torch.equal(out, ref) else 'differ'}")
        if dg is None:
            print(f"{shape}: ours vs deep_gemm: no deep_gemm")


if __name__ == "__main__":
    main()
