"""Render docs/perf.md from the benchmark JSON files kept in docs/ (one run each).

    python3 bench/report.py docs/bench_quant_<date>.json docs/bench_gemm_<date>.json > docs/perf.md
"""

from __future__ import annotations

import argparse
import json
import os
import sys


def quant_section(d: dict, path: str) -> str:
    env = d["env"]
    rows = "\n".join(f"| {r['impl']} | {r['m']} | {r['layout']} | {r['us']:.1f} | {r['gbs']:.0f} | {r['ratio']:.2f} |"
                     for r in d["results"])
    return f"""## Per-token-group quantization bf16 -> fp8 (`bench/quant.py`)

Run: `{path}`. GPU {env['gpu']} ({env['arch']}), driver {env['driver']}, torch {env['torch']}
(CUDA {env['cuda']}), triton {env['triton']}, python {env['python']}.
Ceiling measured in the same run: device-to-device copy **{d['copy_gbs']:.0f} GB/s** (read + write).

K=7168, group 128; bytes = bf16 read + fp8 written + scales written. `triton` and
`cuda ext` rows at M <= 4096 are CUDA-graph replays (kernel time); "eager call" is the
Python call with launch overhead; `torch.compile(oracle)` is eager-timed. "copy, same bytes"
is torch's device copy of the row-scale byte count at that M, timed like the kernels: what a
plain memory-bound kernel reaches at that size, its fixed launch cost included.

| impl | M | scale layout | time (us) | GB/s | ratio to copy |
|---|---:|---|---:|---:|---:|
{rows}

Direct UE8M0 weight quantization 7168x16384 (GPU), peak memory beyond the result:
unchunked {d['chunk_extra_mib']['None']:.0f} MiB, 1024-row chunks {d['chunk_extra_mib']['1024']:.0f} MiB.
"""


def _cell(text: str) -> str:
    """A table cell: a label's '|' (sm90_ws's column split) escaped for Markdown."""
    return text.replace("|", "\\|")


def gemm_section(d: dict, path: str) -> str:
    env = d["env"]
    dg = any("dg_tflops" in r for r in d["results"])

    def row(r):
        eager = f"{r['eager_ms']:.3f}" if "eager_ms" in r else "-"
        tri = f"{r['triton_tflops']:.0f}" if "triton_tflops" in r else "-"
        if "vs_triton" in r:
            tri += f" ({r['vs_triton']})"
        dgt = f"{r['dg_tflops']:.0f}" if "dg_tflops" in r else ""
        if isinstance(r.get("dg_pdl_tflops"), float):  # DeepGEMM also timed with set_pdl(True)
            dgt += f" / {r['dg_pdl_tflops']:.0f} pdl"
        extra = (f" {dgt} | {r['ours_over_dg']:.2f} | {r['same']} |" if "dg_tflops" in r
                 else " - | - | - |") if dg else ""
        return (f"| {r['kind']} | {tuple(r['shape'])} | {_cell(r.get('kernel', 'triton'))} | {r['ms']:.3f} | "
                f"{r['tflops']:.0f} | {r['ratio']:.2f} | {eager} | {tri} |{extra}")

    rows = "\n".join(row(r) for r in d["results"])
    head = "| kind | M, N, K | kernel | ms | TFLOP/s | ratio to cuBLASLt | eager call (ms) | Triton kernel TFLOP/s |"
    rule = "|---|---|---|---:|---:|---:|---:|---:|"
    dg_text = ""
    if dg:
        import math

        ratios = [r["ours_over_dg"] for r in d["results"] if "dg_tflops" in r]
        geo = math.exp(sum(map(math.log, ratios)) / len(ratios))
        head += " DeepGEMM TFLOP/s | ours / DeepGEMM | same output |"
        rule += "---:|---:|---|"
        pdl = any(isinstance(r.get("dg_pdl_tflops"), float) for r in d["results"])
        dg_text = (f"\nDeepGEMM {env.get('deep_gemm')} (built from the archive pinned in deps/toolchains.toml) ran "
                   "on the same operands in the same run; \"same output\" is `bit` where both outputs are "
                   "bit-identical (masked: on the rows below masked_m, the rest being unspecified). "
                   + ("DeepGEMM was also timed launched as a programmatic dependent (deep_gemm.set_pdl, \"pdl\"); "
                      "the ratio is to its faster launch. " if pdl else "") +
                   (f"The timings alternate: per shape ours, the Triton kernel, then {env['pairs']} rounds of "
                    "DeepGEMM, DeepGEMM as a programmatic dependent and ours; each time is the median of that "
                    "kernel's timings (bench/order_probe.py: the SM clock follows the load). "
                    if env.get("pairs") else "") +
                   f"Geomean ours / DeepGEMM over {len(ratios)} shapes: **{geo:.3f}**. Masked shapes: "
                   "M = expected_m = masked_m rows per expert, capacity "
                   f"{'max(2 * expected_m, 128)' if 'copy_gbs' in d else '2 * expected_m'}.\n")
    mem = [r for r in d["results"] if "mem_limit_us" in r]
    rotated = env.get("rotated", "rotated" in env.get("operands", ""))  # the text: runs 2026-12-04k and before
    rotated_copy = ", which the GEMMs, reading their weights from device memory, cannot" if rotated else ""
    operands = ("\nEach shape is timed over as many fresh operand sets as move at least 4x the L2 per pass "
                "(`operand_sets` in the JSON rows; bench.common.operand_sets), the calls taking them in turn: "
                "each call finds its weights in device memory, as a model's layers do. Runs before 2026-12-04k "
                "timed one set over and over, so a small shape's weights stayed in the 50 MB L2.\n"
                if rotated else "")
    mem_text = ""  # a run without dense rows of M <= 64 (bench/gemm.py on a subset) has no such table
    if mem:
        floor = all("read_floor_us" in r for r in mem)  # runs before 2026-12-06 have no read floor
        mem_rows = "\n".join(f"| {tuple(r['shape'])} | {_cell(r['kernel'])} | {r['ms'] * 1e3:.1f} | "
                             f"{r['mem_limit_us']:.1f} | {r['over_mem_limit']:.2f} | {r['copy_same_bytes_us']:.1f} |"
                             + (f" {r['read_floor_us']:.1f} | {r['over_read_floor']:.2f} |" if floor else "")
                             for r in mem)
        floor_text = ("\n\"Read floor\" is the fastest kernel that only reads the weight's bytes from device memory "
                      "(bench/read_floor.py), timed as the GEMMs are: rotated past the L2, launch and drain included. "
                      "A GEMM of the row reads at least these bytes." if floor else "")
        floor_head = " read floor (us) | ours / floor |" if floor else ""
        floor_rule = "---:|---:|" if floor else ""
        mem_text = f"""
Memory-bound rows (dense M <= 64): the limit is the weight's bytes (N x K) at the copy bandwidth
measured in the same run ({d['copy_gbs']:.0f} GB/s, read + write); "copy, same bytes" is a device copy
moving N x K bytes in all, graph-timed over one buffer (its fixed launch cost included; at these sizes
the buffer fits in the 50 MB L2, so it can beat the bandwidth limit{rotated_copy}).{floor_text}

| M, N, K | kernel | us | limit (us) | ours / limit | copy, same bytes (us) |{floor_head}
|---|---|---:|---:|---:|---:|{floor_rule}
{mem_rows}
"""
    return f"""## Block-scaled FP8 GEMM (`bench/gemm.py`)

Run: `{path}`. GPU {env['gpu']} ({env['arch']}), torch {env['torch']}, triton {env['triton']}.
Ceiling measured in the same run: cuBLASLt per-tensor FP8 GEMM (torch._scaled_mm) 8192^3
**{d['cublaslt_fp8_tflops']:.0f} TFLOP/s**. FP32 scales (A 1x128 MN-major, B 128x128). Times are
CUDA-graph replays (kernel time); "eager call" is one Python call with its launch cost. "kernel"
is what the shipped dispatch ran: `sm90_ws BMxBN[/S]` (warp-specialized Gluon, SM90; BMxBN the tile
`sm90_ws.tile_shape` chose, 64-row tiles included, S its K splits; `sm90_ws masked` its masked mode;
`128x256 | BMxBN/S`: N's whole 128x256 tiles, then the other columns in their own call,
`sm90_ws.column_split`), `cluster 2x128x256` (the CUDA kernel of csrc/fp8_gemm_sm90.cu taking
sm90_ws's unsplit 128x256 tiles: 2-CTA clusters multicasting B, block_scaled.USE_CLUSTER),
`narrow 64xBN/sS` (the CUDA kernel's 64xBN tiles for dense calls of 1-128 rows, S ring slots,
block_scaled.USE_NARROW), `swap TxBN/S` (the decode kernel: T-token by BN-weight-row tiles, S K splits)
or `triton`; beside them the kernel the dispatch would take without them in the same run
(USE_WS / USE_SWAP off, the same K splits; unsplit beside a column split and beside the narrow
kernel), with `bit` where the outputs are bit-identical, else their relative L2 distance.
{operands}{dg_text}
{head}
{rule}
{rows}
{mem_text}"""


def _fanout(r: dict) -> str:
    if "fanout_copy_gbs" not in r:
        return "-"
    return f"x{r['fanout']}: {r['fanout_copy_gbs']:.0f} (scatter {r['scatter_gbs'] / r['fanout_copy_gbs']:.1f}x)"


def moe_section(d: dict, path: str) -> str:
    env, ex = d["env"], d["executor"]
    rows = "\n".join(f"| {r['t']} | {r['local_routes']} | {r['scatter_us']:.1f} | {r['scatter_gbs']:.0f} | "
                     f"{r['scatter_ratio']:.2f} | {_fanout(r)} | {r['gather_us']:.1f} | {r['gather_gbs']:.0f} | "
                     f"{r['gather_ratio']:.2f} |"
                     for r in d["results"])
    parts = "\n".join(f"| {k} | {v:.0f} |" for k, v in ex["parts_us"].items())
    silu = ""
    if "silu_gbs" in ex:
        silu = (f"\nsilu*mul+quant reads and writes only the {ex['silu_rows']} routed rows (padding skipped): "
                f"{ex['parts_us']['silu*mul+quant']:.0f} us = {ex['silu_gbs']:.0f} GB/s "
                f"({ex['silu_gbs'] / d['copy_gbs']:.2f} of copy). Over all {ex['cap']} workspace rows, as before, "
                f"it takes {ex['silu_all_rows_us']:.0f} us and the forward {ex['total_all_rows_us']:.0f} us "
                "(same run).\n")
    return f"""## MoE EP scatter / gather and the contiguous executor (`bench/moe.py`)

Run: `{path}`. GPU {env['gpu']} ({env['arch']}), torch {env['torch']}, triton {env['triton']}.
Ceiling measured in the same run: device-to-device copy **{d['copy_gbs']:.0f} GB/s** (read + write).

H=7168, topk=8, 32 local experts of 64 (about half the routes are another rank's), FP8 rows
with `{d['scale_layout']}` scales, CUDA-graph replays. Scatter = layout (count, starts,
m_indices) + copy; bytes as documented in bench/moe.py (each byte once). "torch fan-out":
torch's copy of an expanded source, each read row written `x` times (the scatter's
read:write shape), measured in the same run: a baseline for that traffic, not a ceiling.

| T | local routes | scatter (us) | GB/s | ratio to copy | torch fan-out GB/s | gather (us) | GB/s | ratio |
|---:|---:|---:|---:|---:|---:|---:|---:|---:|
{rows}

Contiguous executor, T={ex['t']}, I={ex['inter']} ({ex['local_routes']} local routes, workspace {ex['cap']} rows):
one forward **{ex['total_us']:.0f} us** ({ex['tflops']:.0f} TFLOP/s over the routed GEMMs) vs the sum of its
parts timed alone {ex['sum_parts_us']:.0f} us.

| part | us |
|---|---:|
{parts}
{silu}"""


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description="Render docs/perf.md's tables from bench JSON files.")
    ap.add_argument("paths", nargs="+", metavar="run.json", help="a bench/*.py --out file")
    paths = ap.parse_args(argv).paths
    for p in paths:
        if not os.path.isfile(p):
            ap.error(f"run.json: no such file: {p}")
    out = ["# Performance (measured on the lent GPU: each section names its card)\n",
           "Medians (`triton.testing.do_bench` / `do_bench_cudagraph`) from one run each, beside\n"
           "the ceiling measured in the same run. Rendered by `bench/report.py` from the JSON files\n"
           "named below; the commentary at the end is written by hand.\n"]
    for p in paths:
        d = json.load(open(p))
        if d.get("bench") == "moe":
            out.append(moe_section(d, p))
        else:
            out.append(gemm_section(d, p) if "cublaslt_fp8_tflops" in d else quant_section(d, p))
    sys.stdout.write("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
