"""Where sm90_ws loses to DeepGEMM, read from the hardware counters (issue #28): a program for ncu.

    ncu --clock-control none --profile-from-start off --set full -o prof \\
        python3 bench/ncu_probe.py [--shapes 128,4096,7168 64,7168,2048]

Each shape's operands are made and both GEMMs (our shipped dispatch and DeepGEMM when it imports)
run three times outside the profiled range, so compiles, autotuning and DeepGEMM's JIT stay out
of it. Then the profiler range (cudaProfilerStart / Stop) holds one call of each, so ncu's report
has one entry per kernel launched: compare their sections (SpeedOfLight, MemoryWorkloadAnalysis,
WarpStateStats, SourceCounters). Timing belongs to bench/gemm.py: ncu replays each kernel with its
caches flushed. Outputs are checked bit for bit against each other after the range.
"""

from __future__ import annotations

import argparse

import torch

from bench.gemm import _deepgemm, dense_inputs
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


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", nargs="+", type=_shape, default=SHAPES, help="M,N,K (default: %(default)s)")
    args = p.parse_args(argv)
    dg, why = _deepgemm()
    print(f"deep_gemm: {dg.version if dg is not None else 'absent: ' + why}")
    calls = []
    for m, n, k in args.shapes:
        torch.manual_seed(m + n + k)
        a, sa, b, sb, out = dense_inputs(m, n, k)
        out_dg = torch.full_like(out, float("nan"))
        out.fill_(float("nan"))
        ours = (lambda a=a, sa=sa, b=b, sb=sb, out=out: G.fp8_gemm_nt(a, sa, b, sb, out=out))
        theirs = None if dg is None else (
            lambda a=a, sa=sa, b=b, sb=sb, o=out_dg: D.fp8_gemm_nt(a, sa, b, sb, o, A.detect(), dg))
        for _ in range(3):
            ours()
            if theirs is not None:
                theirs()
        calls.append(((m, n, k), ours, theirs, out, out_dg))
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for shape, ours, theirs, *_ in calls:
        torch.cuda.nvtx.range_push(f"ours {shape}")
        ours()
        torch.cuda.nvtx.range_pop()
        if theirs is not None:
            torch.cuda.nvtx.range_push(f"deep_gemm {shape}")
            theirs()
            torch.cuda.nvtx.range_pop()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    for shape, _, theirs, out, out_dg in calls:
        same = "no deep_gemm" if theirs is None else ("bit" if torch.equal(out, out_dg) else "differ")
        print(f"{shape}: ours vs deep_gemm: {same}")


if __name__ == "__main__":
    main()
