"""sm90_ws's producer prefetching each tile's B-scale row into the L2 (sm90_ws.SB_PREFETCH_ROWS: the
tile heights that do), or staging it in shared memory (sm90_ws.SB_STAGE_TILES), against neither and
the shipped defaults, through the shipped dispatch, and with deeper rings (issue #28).

    PYTHONPATH=. python3 bench/sb_prefetch.py [--out pf.json] [--reps 3] [--stages 6 10]
                                              [--decode-only | --large-only] [--ws-split]

The ring profile (docs/perf.md, tenth session) showed that a deeper ring trades the consumers' waits
for a slot for FMULs waiting on the step's B scale, a global load issued one step ahead. A tile's
B-scale row is K/128 floats, two 128-byte lines at K=7168, so the wait is the first load of each line.
The operands come from device memory, so that load does too. With the prefetch the producer, a whole
ring ahead of the consumers, asks the L2 for those lines when it starts the tile. The tenth session's
run made it the default for 64-row tiles (docs/perf.md). Staging goes further: the producer copies the
row into shared memory with one TMA box when it starts the tile, and the consumers read each step's
scale there, with no global load left in their K loop (DeepGEMM's math warps stage it too).

Timed: the dispatch on the dense M=64-256 shapes (on the H200: sm90_ws's 64-row tiles at
(64, 7168, 2048) and (128, 4096, 7168), its 128-row tiles at the other M=128 and 256 shapes, and the
swapped kernel at (64, 4096, 7168), a control), and bench/gemm.py's M=4096 dense and contiguous
shapes. Operand sets are rotated past the L2 (bench.common.operand_sets). Each rep times off, on
(prefetch), stage (every tile of at most 128 columns, K-split grids too, at SB_STAGE_TILES's ring where
it lists one) and shipped, then on and stage with each `--stages` ring depth (shapes whose tile cannot
hold that ring say so; wide tiles cannot stage, so there "stage" is "off" again). Medians over reps of
each rep's CUDA-graph median; each rep's times are kept. Every variant's output on set 0 must equal
off's bit for bit (the same loads and products; only an L2 hint is added, or the same scales read from
shared memory), else the row says so. TFLOP/s beside cuBLASLt's FP8 GEMM measured in the same run.

--ws-split adds "stage ws": the stage variant with block_scaled.WS_SPLIT_BEFORE_SWAP on, ws_before_swap
then also taking 64-row sm90_ws grids that split K (shipped: only unsplit ones), so (64, 4096, 7168),
64 tiles of 64x64, runs sm90_ws in two K splits, staged, instead of the swapped kernel.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
from unittest import mock

import torch

from bench.common import dump, environment, fp8_gemm_tflops, operand_sets, output_of, rel_l2, rotated_ms
from bench.gemm import DENSE, EXPERT_NK, GROUPED, dense_call, dense_inputs, grouped_call, grouped_inputs
from rtp_fp8.gemm.triton import block_scaled as G
from rtp_fp8.gemm.triton import sm90_ws as W

DECODE = [(m, n, k) for m in (64, 128, 256) for n, k in EXPERT_NK]


def cases(decode_only=False, large_only=False):
    """(label, shape, flops, operand maker, call, index of the output in an operand tuple)."""
    for m, n, k in ([] if large_only else DECODE) + ([] if decode_only else [s for s in DENSE if s[0] == 4096]):
        yield "dense", [m, n, k], 2 * m * n * k, lambda m=m, n=n, k=k: dense_inputs(m, n, k), dense_call, 4
    for g, m, n, k in [] if decode_only else GROUPED:
        yield "contiguous", [g, m, n, k], 2 * g * m * n * k, lambda g=g, m=m, n=n, k=k: grouped_inputs(g, m, n, k), \
            grouped_call, 5


# every (mode, rows, width) a tile of at most 128 columns can have (sm90_ws.SB_STAGE_TILES's keys)
STAGE_TILES = [(mode, bm, bn) for mode in (0, 1, 2) for bm in (W.HALF_BM, W.BM) for bn in (W.NARROW_BN, W.BN)]


@contextlib.contextmanager
def variant(prefetch: bool | None, stages: int | None, stage: bool = False, ws_split: bool = False):
    """prefetch None: the shipped defaults, untouched. Else every tile height's prefetch on or off, every
    tile's staging on (at SB_STAGE_TILES's ring where it lists one; K-split grids too, SB_STAGE_SPLIT) or
    off, and every sm90_ws launch's ring at `stages` slots (None: the shipped depth). ws_split: dense
    calls whose sm90_ws grid is 64-row tiles take it before the swapped kernel, split or not
    (block_scaled.WS_SPLIT_BEFORE_SWAP)."""
    if prefetch is None:
        yield
        return
    both = frozenset({W.HALF_BM, W.BM})
    table = {t: stages or W.SB_STAGE_TILES.get(t) for t in STAGE_TILES} if stage else {}
    with contextlib.ExitStack() as stack:
        stack.enter_context(mock.patch.object(W, "SB_PREFETCH_ROWS", both if prefetch else frozenset()))
        stack.enter_context(mock.patch.object(W, "SB_STAGE_TILES", table))
        stack.enter_context(mock.patch.object(W, "SB_STAGE_SPLIT", stage))
        if stages is not None:
            stack.enter_context(mock.patch.object(W, "_stages", lambda bn, bm=W.BM: stages))
        if ws_split:
            stack.enter_context(mock.patch.object(G, "WS_SPLIT_BEFORE_SWAP", True))
        yield


WS_SPLIT_REL = 1e-3  # FP32 sums reordered by other K splits stay far below this; a wrong tile does not


def variants(stages, ws_split=False):
    """[(label, prefetch, stage, ring slots, ws_split)]: off, on and stage at the shipped rings and the
    shipped defaults, then on and stage at each of stages; "stage ws" last where ws_split."""
    return [("off", False, False, None, False), ("on", True, False, None, False),
            ("stage", False, True, None, False), ("shipped", None, False, None, False)] + [
        v for n in stages for v in ((f"on s{n}", True, False, n, False), (f"stage s{n}", False, True, n, False))] + (
        [("stage ws", False, True, None, True)] if ws_split else [])


def measure(call, sets, oi, reps, stages=(), ws_split=False):
    """{label: median us}, each rep's times under "reps_us", and {label: why} for a variant that differs
    from off's output or cannot run. A ws_split variant may split K where off did not (or otherwise), which
    reorders the FP32 sums: its relative L2 distance to off's output goes under "rel_l2", and it is timed
    unless that exceeds WS_SPLIT_REL."""
    out = sets[0][oi]
    todo = variants(stages, ws_split)
    times = {label: [] for label, *_ in todo}
    failed, rel = {}, {}
    ref = None
    for _ in range(reps):
        for label, prefetch, stage, ring, split in todo:
            if label in failed:
                continue
            with variant(prefetch, ring, stage, split):
                try:
                    got = output_of(call, sets[0], out)
                except Exception as exc:  # noqa: BLE001 - a ring too deep for the tile's shared memory
                    failed[label] = f"cannot run: {type(exc).__name__}: {str(exc)[:120]}"
                    continue
                if ref is None:
                    ref = got
                elif not torch.equal(got, ref):
                    d = rel_l2(got, ref)
                    if not split or not d <= WS_SPLIT_REL:
                        failed[label] = f"differs from the output with neither (relative L2 {d:.1e})"
                        continue
                    rel[label] = d
                times[label].append(rotated_ms(call, sets) * 1e3)
    res = {label: statistics.median(t) for label, t in times.items() if label not in failed and t}
    return {"us": res, "reps_us": {k: v for k, v in times.items() if k in res}, "failed": failed, "rel_l2": rel}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--stages", type=int, nargs="*", default=[])
    ap.add_argument("--decode-only", action="store_true", help="only the M=64-256 dense shapes")
    ap.add_argument("--large-only", action="store_true", help="only the M=4096 dense and the contiguous shapes")
    ap.add_argument("--ws-split", action="store_true", help="also 'stage ws': 64-row sm90_ws grids before the "
                    "swapped kernel, K splits too")
    args = ap.parse_args()
    ceiling = fp8_gemm_tflops()
    rows = []
    for kind, shape, flops, make, call, oi in cases(args.decode_only, args.large_only):
        sets = operand_sets(make)
        r = {"kind": kind, "shape": shape, "operand_sets": len(sets),
             **measure(call, sets, oi, args.reps, args.stages, args.ws_split)}
        r["vs_ceiling"] = {k: flops / (t * 1e-6) / 1e12 / ceiling for k, t in r["us"].items()}
        rows.append(r)
        print(r, flush=True)
    res = {"env": environment(), "fp8_gemm_tflops": ceiling, "rows": rows}
    if args.out:
        dump(args.out, res)
    labels = [label for label, *_ in variants(args.stages, args.ws_split)]
    print(f"cuBLASLt FP8 {ceiling:.0f} TFLOP/s")
    heads = "".join(f"{h:>8}" for h in ("off/on", "off/stg", "off/shp"))
    print(f"{'kind':<11}{'shape':<24}" + "".join(f"{label:>10}" for label in labels) + heads)
    for r in rows:
        us = r["us"]
        cells = "".join(f"{us[k]:10.2f}" if k in us else f"{'-':>10}" for k in labels)
        ratios = "".join(f"{us['off'] / us[k]:8.3f}" if {"off", k} <= us.keys() else f"{'nan':>8}"
                         for k in ("on", "stage", "shipped"))
        print(f"{r['kind']:<11}{str(r['shape']):<24}{cells}{ratios}  {r['failed'] or ''}")


if __name__ == "__main__":
    main()
