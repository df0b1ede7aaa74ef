"""Block-scaled FP8 GEMM (rtp_fp8.gemm.triton) on the GPU against cuBLASLt's per-tensor FP8 GEMM.

    PYTHONPATH=. python3 bench/gemm.py [--out results.json] [--pairs 2]

Shapes from DeepSeek-V3 (the issue's list). TFLOP/s = 2*M*N*K / median kernel time (CUDA-graph
replays); the ratio is to torch._scaled_mm (per-tensor scales, cuBLASLt) at 8192^3 measured in
the same run. The eager column is one Python call (validation, TMA descriptors, launch), which
bounds small shapes outside graphs. `kernel` names what the shipped dispatch ran: sm90_ws 128xBN
(the warp-specialized Gluon kernel, BN its tile width, sm90_ws.tile_n) or triton; where it is
sm90_ws the Triton kernel is timed too (block_scaled.USE_WS off), and both outputs must be
bit-identical.

DeepGEMM, where it is importable and runs this GPU's Arch (./dev gpu-test builds it from the
archive pinned in deps/toolchains.toml; bench/gpu_run.sh puts it on PYTHONPATH), is timed on the
same operands in the same run: `dg` TFLOP/s, `ours/dg`, and `same` (bit-identical outputs on the
rows the contract specifies, else the relative L2 between the two). Masked shapes: G experts,
expected_m = masked_m rows each, capacity 2 * expected_m. Per shape the timings run: ours, the
Triton kernel, then --pairs rounds of DeepGEMM, DeepGEMM as a programmatic dependent, ours; each
kernel's time is the median of its timings (all kept in ms_each), so that neither kernel's times all
follow the same neighbour (bench/order_probe.py, an H100 at its 700 W limit: the SM clock ran at
1215-1635 MHz under the M=4096 GEMMs, and up to 1980 after the lighter Triton kernel).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics

import torch

from bench.common import (
    copy_bandwidth_gbs,
    copy_ms,
    dump,
    environment,
    fp8_gemm_tflops,
    median_ms,
    operand_sets,
    rel_l2,
    rotated_ms,
)
from bench.read_floor import read_floor_us
from rtp_fp8 import arch as A
from rtp_fp8.gemm import deepgemm as D
from rtp_fp8.gemm.triton import block_scaled as G
from rtp_fp8.quant import block as B
from rtp_fp8.quant import token_group as T

EXPERT_NK = ((4096, 7168), (7168, 2048))  # DeepSeek-V3's expert gate_up and down (N, K)
DENSE = [(4096, 2112, 7168), (4096, 24576, 1536), (4096, 32768, 512), (4096, 7168, 16384), (4096, 4096, 7168),
         (4096, 7168, 2048), (128, 7168, 16384)] + [(m, n, k) for m in (1, 16, 64, 128, 256) for n, k in EXPERT_NK]
GROUPED = [(8, 4096, 4096, 7168), (8, 4096, 7168, 2048), (32, 512, 4096, 7168)]
MASKED = [(g, em, n, k) for g in (8, 32) for em in (16, 64, 256) for n, k in EXPERT_NK]
PAIRS = 2  # rounds of DeepGEMM, its PDL launch and ours timed in turn per shape (_beside; --pairs)


def _deepgemm():
    """DeepGEMM's capabilities when it can run this GPU's Arch, else (None, why)."""
    here = A.detect()
    ok, why = D.supports(here, device="cuda")
    return (D.capabilities(), "") if ok else (None, why)


def _beside(r, flops, call_dg, ours, sets, oi, rows=None, pairs=PAIRS):
    """Time DeepGEMM's call_dg(*ops) on the same operand sets, writing the same outputs (ops[oi]);
    compare set 0's output with ours (on `rows` only). The timings alternate: `pairs` rounds of
    DeepGEMM, DeepGEMM launched as a programmatic dependent, then ours(*ops) again, so
    that each kernel is timed after the others, and no one kernel's times all follow the lighter
    Triton kernel (an H100 at its power limit runs each at the clock the last load left: 1215-1635
    MHz under the M=4096 GEMMs, up to 1980 after the Triton kernel, bench/order_probe.py). ms, dg and
    dg_pdl are the medians of each kernel's times, all kept."""
    out = sets[0][oi]
    ours_out = out.clone()
    out.fill_(float("nan"))  # what DeepGEMM does not write cannot pass for ours
    call_dg(*sets[0])
    r["same"] = _same(ours_out, out, rows)
    each = {"ours": [r["ms"]], "dg": [], "dg_pdl": []}
    pdl_error = None
    for _ in range(pairs):
        each["dg"].append(rotated_ms(call_dg, sets))
        # launched as programmatic dependents of the call before (deep_gemm.set_pdl, off by default):
        # the ratio is to the faster of the two
        if pdl_error is None:
            try:
                with D.pdl_launches():
                    each["dg_pdl"].append(rotated_ms(call_dg, sets))
            except RuntimeError as exc:
                pdl_error = exc
        each["ours"].append(rotated_ms(ours, sets))
    r["ms_each"] = each
    r["ms"] = statistics.median(each["ours"])
    r["tflops"] = flops / (r["ms"] * 1e-3) / 1e12
    r["dg_tflops"] = flops / (statistics.median(each["dg"]) * 1e-3) / 1e12
    r["dg_pdl_tflops"] = (flops / (statistics.median(each["dg_pdl"]) * 1e-3) / 1e12 if pdl_error is None
                          else f"not run: {pdl_error}")
    best = max(v for v in (r["dg_tflops"], r.get("dg_pdl_tflops")) if isinstance(v, float))
    r["ours_over_dg"] = r["tflops"] / best
    return r


def _same(out, ref, rows=None):
    """"bit" where out and ref (on `rows` only) are bit-identical, else their relative L2 to ref."""
    o, t = (out, ref) if rows is None else (out[rows], ref[rows])
    return "bit" if torch.equal(o, t) else f"{rel_l2(o, t):.1e}"


@contextlib.contextmanager
def patched(**values):
    """Set block_scaled's module flags (USE_WS, USE_SWAP, FORCE_SPLIT_K, SWAP_*) for the block."""
    old = {k: getattr(G, k) for k in values}
    for k, v in values.items():
        setattr(G, k, v)
    try:
        yield
    finally:
        for k, v in old.items():
            setattr(G, k, v)


def flagged(call, **values):
    """call(*ops) run with block_scaled's flags set to values (patched) for each call."""

    def run(*ops):
        with patched(**values):
            call(*ops)

    return run


def _kernel(refusal, m, n, k, rows=None, ws_splits=1, cluster=False, narrow=False):
    """(label, flags) of what the dispatch runs: "sm90_ws BMxBN[/S]" (tile_shape's tile on this GPU,
    ws_splits S; "128x256 | BMxBN/S" where sm90_ws.column_split runs N's whole wide tiles apart from
    the other columns' call; "cluster 2x128x256" where the CUDA kernel with 2-CTA clusters runs
    the 128x256 tiles of a dense or contiguous call: cluster, block_scaled.cluster_refusal None),
    "narrow 64xBN/sS" (the CUDA narrow kernel of a dense call of 16 to 128 rows: narrow,
    block_scaled.narrow_refusal None; S ring slots),
    "swap TxBN/S" (the swapped decode kernel: token tile T, BN weight rows, S K splits) or "triton"
    (TMA / pointer); flags: the patched() values that take the kernel it replaces (the Triton kernels
    split as sm90_ws split; the unswapped dispatch), None for triton."""
    dense = rows is None
    rows = m if rows is None else rows
    sms = A.num_sms(0)
    if dense and narrow:  # beside it the Triton kernel unsplit: the same bits
        bn = G.narrow_block_n(m, n, sms)
        return f"narrow 64x{bn}/s{G.narrow_stages(k, bn)}", {
            "USE_NARROW": False, "USE_WS": False, "USE_SWAP": False, "FORCE_SPLIT_K": 1}
    if dense and refusal is None and G.ws_before_swap(m, n, k, torch.device("cuda", 0)):  # 64-row tiles first
        bm, bn = G.sm90_ws.tile_shape(m, n, sms)
        return f"sm90_ws {bm}x{bn}", {"USE_WS": False, "FORCE_SPLIT_K": None}
    n0 = G.sm90_ws.column_split(m, n, sms) if dense and refusal is None else 0
    if n0:  # N's whole wide tiles, then the rest through the dispatch: its K split is not the Triton kernel's
        bm, bn, _, splits = G.sm90_ws.grid(m, n - n0, k, sms)
        wide = "cluster 2x" if cluster else "sm90_ws "
        return f"{wide}{G.sm90_ws.BM}x{G.sm90_ws.WIDE_BN} | {bm}x{bn}/{splits}", {"USE_WS": False,
                                                                                 "FORCE_SPLIT_K": 1}
    if G.USE_SWAP and rows <= G.SWAP_MAX_ROWS:  # tried first (dense and masked)
        bn, bt, _, splits = G.swap_config(rows, n, k, m if dense else None, A.num_sms(0))
        return f"swap {bt}x{bn}/{splits}", {"USE_SWAP": False}
    if refusal is None:
        bm, bn = G.sm90_ws.tile_shape(m, n, A.num_sms(0), dense)
        wide = cluster and G.wide_tiles(G.DENSE if dense else G.CONTIGUOUS, m, n, ws_splits, A.num_sms(0))
        label = f"{'cluster 2x' if wide else 'sm90_ws '}{bm}x{bn}"
        return label + (f"/{ws_splits}" if ws_splits > 1 else ""), {
            "USE_WS": False, "FORCE_SPLIT_K": ws_splits if dense else None}
    return "triton", None


def _measure(flops, call, sets, oi, kernel, rows=None):
    """{ms, tflops, eager_ms, kernel, operand_sets} of the shipped dispatch, call(*ops) taking the
    operand sets in turn (bench.common.operand_sets; ops[oi] is the output; kernel: _kernel's (label,
    flags)); beside sm90_ws the Triton kernel's TFLOP/s (bit-identical output, checked), beside the
    swapped kernel the one it replaced (and whether their outputs are bit-identical or how far apart;
    masked: on `rows`, those below masked_m). Outputs are compared on set 0."""
    label, flags = kernel
    out = sets[0][oi]
    out.fill_(float("nan"))
    ms = rotated_ms(call, sets)
    r = {"ms": ms, "tflops": flops / (ms * 1e-3) / 1e12, "eager_ms": median_ms(lambda: call(*sets[0])),
         "kernel": label, "operand_sets": len(sets)}
    if flags is not None:
        shipped = out.clone()
        out.fill_(float("nan"))
        with patched(**flags):
            tms = rotated_ms(call, sets)
        r["triton_tflops"] = flops / (tms * 1e-3) / 1e12
        r["vs_triton"] = _same(shipped, out, rows)
        if label.startswith(("sm90_ws", "cluster", "narrow")) and "|" not in label and r["vs_triton"] != "bit":
            raise AssertionError(f"{label} and the Triton kernel differ")
        out.copy_(shipped)  # DeepGEMM is compared with what the dispatch wrote
    return r


def dense_inputs(m, n, k):
    """(a, sa, b, sb, out) for M x N x K in the SM90 formats."""
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5
    a, sa = T.per_token_group_quant(x, 128, scale_layout="col_tma")
    b, sb = B.quantize_weight_blocks(w)
    return a, sa, b, sb, torch.empty(m, n, device="cuda", dtype=torch.bfloat16)


def dense_call(a, sa, b, sb, out):
    """The shipped dense GEMM on a dense_inputs tuple."""
    G.fp8_gemm_nt(a, sa, b, sb, out=out)


def grouped_call(a, sa, b, sb, ids, out, cnt):
    """The shipped contiguous grouped GEMM on a grouped_inputs tuple."""
    G.m_grouped_fp8_gemm_nt_contiguous(a, sa, b, sb, ids, out=out, counters=cnt)


def grouped_inputs(g, m, n, k):
    """(a, sa, b, sb, ids, out, counters): g experts of m rows each."""
    x = torch.randn(g * m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(g, n, k, device="cuda", dtype=torch.bfloat16) / k**0.5
    a, sa = T.per_token_group_quant(x, 128, scale_layout="col_tma")
    b, sb = B.quantize_weight_blocks(w)
    ids = torch.arange(g, device="cuda", dtype=torch.int32).repeat_interleave(m)
    out = torch.empty(g * m, n, device="cuda", dtype=torch.bfloat16)
    return a, sa, b, sb, ids, out, torch.zeros(2, device="cuda", dtype=torch.int32)


def dense(m, n, k, dg=None, cold=True, pairs=PAIRS):
    sets = operand_sets(lambda: dense_inputs(m, n, k), cold)
    a, sa, b, sb, out = sets[0]
    r = _measure(2 * m * n * k, dense_call, sets, 4,
                 _kernel(G.ws_refusal(G.DENSE, a, sa, b, sb, out), m, n, k, ws_splits=G.ws_splits(G.DENSE, a, b),
                         cluster=G.cluster_refusal(a, out) is None,
                         narrow=G.narrow_refusal(a, sa, b, sb, out) is None))
    if dg is not None:
        _beside(r, 2 * m * n * k, lambda a, sa, b, sb, out: D.fp8_gemm_nt(a, sa, b, sb, out, A.detect(), dg),
                dense_call, sets, 4, pairs=pairs)
    return r


def grouped(g, m, n, k, dg=None, cold=True, pairs=PAIRS):
    sets = operand_sets(lambda: grouped_inputs(g, m, n, k), cold)
    a, sa, b, sb, ids, out, cnt = sets[0]
    flops = 2 * g * m * n * k
    r = _measure(flops, grouped_call, sets, 5,
                 _kernel(G.ws_refusal(G.CONTIGUOUS, a, sa, b, sb, out), g * m, n, k, rows=1 << 30,
                         cluster=G.cluster_refusal(a, out) is None))
    if dg is not None:
        with D.mk_alignment(128, dg):
            _beside(r, flops, lambda a, sa, b, sb, ids, out, cnt: D.m_grouped_fp8_gemm_nt_contiguous(
                a, sa, b, sb, ids, out, A.detect(), dg), grouped_call, sets, 5, pairs=pairs)
    return r


def masked_inputs(g, em, n, k):
    """(a, sa, b, sb, masked_m, out): g experts, capacity 2 * em rows, em of them valid."""
    from rtp_fp8.quant import layout as L

    cap = max(2 * em, 128)  # DeepGEMM 2.6.1 gives wrong rows at 32 (docs/perf.md); its tests use 4096
    x = torch.randn(g * cap, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(g, n, k, device="cuda", dtype=torch.bfloat16) / k**0.5
    a, sa_flat = T.per_token_group_quant(x, 128, scale_layout="row")
    sa = L.alloc_scales((g,), cap, k // 128, "col_tma", "cuda")
    sa.copy_(sa_flat.view(g, cap, k // 128))
    b, sb = B.quantize_weight_blocks(w)
    masked = torch.full((g,), em, device="cuda", dtype=torch.int32)
    return a.view(g, cap, k), sa, b, sb, masked, torch.empty(g, cap, n, device="cuda", dtype=torch.bfloat16)


def masked(g, em, n, k, dg=None, cold=True, pairs=PAIRS):
    sets = operand_sets(lambda: masked_inputs(g, em, n, k), cold)
    a, sa, b, sb, mm, out = sets[0]
    flops = 2 * g * em * n * k
    rows = (slice(None), slice(0, em))

    def ours(a, sa, b, sb, mm, out):
        G.m_grouped_fp8_gemm_nt_masked(a, sa, b, sb, mm, expected_m=em, out=out)

    r = _measure(flops, ours, sets, 5,
                 _kernel(G.ws_refusal(G.MASKED, a, sa, b, sb, out, expected_m=em), g * em, n, k, rows=em), rows=rows)
    if r["kernel"].startswith("sm90_ws"):
        r["kernel"] = r["kernel"].replace("sm90_ws", "sm90_ws masked")
    if dg is not None:
        _beside(r, flops, lambda a, sa, b, sb, mm, out: D.m_grouped_fp8_gemm_nt_masked(a, sa, b, sb, mm, em, out,
                                                                                        A.detect(), dg), ours, sets, 5,
                rows=rows, pairs=pairs)
    return r


def _line(r):
    tri = f"{r['triton_tflops']:7.0f}" if "triton_tflops" in r else f"{'-':>7s}"
    dgc = (f"{r['dg_tflops']:7.0f} {r['ours_over_dg']:7.2f} {r['same']:>7s}" if "dg_tflops" in r
           else f"{'-':>7s} {'-':>7s} {'-':>7s}")
    if isinstance(r.get("dg_pdl_tflops"), float):
        dgc += f" (dg pdl {r['dg_pdl_tflops']:.0f})"
    mem = (f" mem x{r['over_mem_limit']:.2f} (copy same bytes {r['copy_same_bytes_us']:.1f} us"
           + (f", read floor {r['read_floor_us']:.1f} us: x{r['over_read_floor']:.2f}" if "read_floor_us" in r else "")
           + ")" if "over_mem_limit" in r else "")
    return (f"{r['kind']:18s} {str(tuple(r['shape'])):>20s} {r['kernel']:>19s} {r['ms']:8.3f} {r['tflops']:8.0f} "
            f"{r['ratio']:6.2f} {r['eager_ms']:9.3f} {tri} {dgc}{mem}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--warm", action="store_true",
                    help="time one operand set over and over (small shapes then run from the L2), as runs before "
                         "2026-12-04k did")
    ap.add_argument("--pairs", type=int, default=PAIRS,
                    help="rounds of DeepGEMM, DeepGEMM as a programmatic dependent and ours, timed in turn after "
                         "ours and the Triton kernel; each kernel's time is the median of its timings")
    args = ap.parse_args()
    if args.pairs < 1:
        raise SystemExit(f"gemm: --pairs must be at least 1, got {args.pairs}")
    cold = not args.warm
    ceiling = fp8_gemm_tflops()
    copy = copy_bandwidth_gbs()
    dg, why = _deepgemm()
    env = environment()
    env["deep_gemm"] = dg.version if dg is not None else f"absent: {why}"
    env["operands"] = "rotated past the L2 (bench.common.operand_sets)" if cold else "one set (warm L2)"
    env["rotated"] = cold  # what report.py reads (runs filed before it carry only the text above)
    env["pairs"] = args.pairs  # runs before 2026-12-06 timed ours once, then DeepGEMM once (report.py reads it)
    print(env)
    print(f"cuBLASLt per-tensor FP8 GEMM 8192^3: {ceiling:.0f} TFLOP/s; copy {copy:.0f} GB/s")
    print(f"{'kind':18s} {'M,N,K':>20s} {'kernel':>19s} {'ms':>8s} {'TFLOP/s':>8s} {'ratio':>6s} {'eager ms':>9s} "
          f"{'triton':>7s} {'dg':>7s} {'ours/dg':>7s} {'same':>7s}", flush=True)
    rows = []

    def done(kind, shape, r):
        rows.append({"kind": kind, "shape": list(shape), **r, "ratio": r["tflops"] / ceiling})
        print(_line(rows[-1]), flush=True)
        if args.out:  # after every row: a run cut short keeps what it measured
            dump(args.out, {"env": env, "cublaslt_fp8_tflops": ceiling, "copy_gbs": copy, "results": rows})

    floors = {}  # weight bytes -> bench.read_floor.read_floor_us
    for m, n, k in DENSE:
        r = dense(m, n, k, dg, cold, args.pairs)
        if m <= 64:  # memory-bound: the weight's bytes at the copy bandwidth measured in this run
            r["mem_limit_us"] = n * k / (copy * 1e9) * 1e6
            r["over_mem_limit"] = r["ms"] * 1e3 / r["mem_limit_us"]
            # and a device copy moving the same bytes (N*K/2 read, N*K/2 written), graph-timed like the GEMM:
            # what a plain memory-bound kernel of this size takes, its fixed launch cost included
            r["copy_same_bytes_us"] = copy_ms(n * k // 2, graph=True)[0] * 1e3
            # and the read floor: a kernel that only reads the weight's bytes from device memory, timed as
            # the GEMM is (bench/read_floor.py): the GEMM reads at least these bytes
            if n * k not in floors:
                floors[n * k] = read_floor_us(n * k)
            r["read_floor_us"], r["read_floor_config"] = floors[n * k]
            r["over_read_floor"] = r["ms"] * 1e3 / r["read_floor_us"]
        done("dense", (m, n, k), r)
    for g, m, n, k in GROUPED:
        done(f"contiguous G={g}", (m, n, k), grouped(g, m, n, k, dg, cold, args.pairs))
    for g, em, n, k in MASKED:
        done(f"masked G={g}", (em, n, k), masked(g, em, n, k, dg, cold, args.pairs))
    if rows and all("dg_tflops" in r for r in rows):
        import math

        def geo(sel):
            return math.exp(sum(math.log(r["ours_over_dg"]) for r in sel) / len(sel)) if sel else float("nan")

        big = [r for r in rows if r["kind"] == "dense" and r["shape"][0] == 4096]
        print(f"ours/dg geomean over {len(rows)} shapes: {geo(rows):.3f}; dense M=4096: {geo(big):.3f}; "
              f"lowest {min(r['ours_over_dg'] for r in rows):.2f}")


if __name__ == "__main__":
    main()
