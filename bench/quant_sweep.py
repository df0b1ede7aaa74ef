"""Launch-shape sweep of the CUDA per-token-group kernel (group 128, bf16 -> fp8) on the GPU.

    PYTHONPATH=. python3 bench/quant_sweep.py [--out results.json] [--m 4096 32768] [--layouts col_tma]

Builds csrc/per_token_group_quant_8bit.cu once more with -DRTP_FP8_TUNING (sm_90a only,
into a temp folder: a library of its own, `torch.ops.rtp_fp8_C_tuning.cfg`, never shipped)
and times every compiled (threads per block, groups per thread, threads per group, load kind) instance
beside the Triton op and the copy ceiling, at M in {128, 4096, 32768}, K=7168. Each
instance is first checked bit-exact against the shipped op's result. The winners become
the shipped kernel's launch shapes (csrc), the numbers go to docs/perf.md's notes.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import pathlib
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tools import build_ext as B  # noqa: E402

LOADS = {0: "", 1: " cs", 2: " ef", 3: " na", 4: " nc256"}  # load16 in the .cu: plain, .cs, evict-first,
#                                                       L1 no-allocate, read-only + 256 B L2 prefetch
# (threads per block, groups per thread, threads per group)
SHAPES = [(64, 1, 8), (128, 1, 8), (128, 2, 8), (256, 1, 8), (128, 1, 16), (128, 2, 16), (256, 2, 16)]


def build_tuning(out_dir: pathlib.Path, compile_only: bool = False, extra=()) -> pathlib.Path:
    exe = B.nvcc()
    cflags, ldflags = B.torch_flags()
    if compile_only:
        cflags = cflags + B._cpu_torch_shims(out_dir)
    src = ROOT / B.SOURCES[0]
    obj = out_dir / "tuning.o"
    subprocess.run([exe, *B.COMMON, *B.gencode_flags(["sm_90a"])[:1], *cflags, "-DRTP_FP8_TUNING", *extra, "-c",
                    str(src), "-o", str(obj)], check=True)
    if compile_only:
        return obj
    so = out_dir / "tuning.so"
    subprocess.run(["g++", "-shared", str(obj), *ldflags, f"-L{B.cuda_library_dir(exe)}", "-lcudart", "-o", str(so)],
                   check=True)
    return so


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--compile-only", action="store_true", help="only compile the tuning build (no GPU)")
    ap.add_argument("--m", type=int, nargs="+", default=[128, 4096, 32768], help="rows to time")
    ap.add_argument("--layouts", nargs="+", default=["row", "col_tma", "ue8m0"], help="scale layouts to time")
    ap.add_argument("--loads", type=int, nargs="+", default=list(LOADS), choices=list(LOADS),
                    help="load kinds to time (0 plain, as shipped)")
    ap.add_argument("--nvcc-flag", action="append", default=[], help="extra nvcc flag for the tuning build "
                    "(e.g. --nvcc-flag=-maxrregcount=32)")
    a = ap.parse_args()
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="rtp_fp8_tuning_"))
    if a.compile_only:
        print("compiled", build_tuning(tmp, compile_only=True, extra=a.nvcc_flag))
        return
    import torch

    from bench.common import copy_bandwidth_gbs, dump, environment, graph_ms
    from rtp_fp8.quant import layout as L
    from rtp_fp8.quant import token_group as T

    torch.ops.load_library(str(build_tuning(tmp, extra=a.nvcc_flag)))
    env = environment() | {"nvcc_flags": a.nvcc_flag}
    copy = copy_bandwidth_gbs()
    k = 7168
    rows = []
    for m in a.m:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        for layout in a.layouts:
            want_q, want_s = T.per_token_group_quant(x, 128, scale_layout=layout, backend="cuda")
            q = torch.empty_like(want_q)
            s = L.alloc_scales((), m, k // 128, layout, "cuda")
            nbytes = x.numel() * 2 + q.numel() + s.untyped_storage().nbytes()
            q2, s2 = torch.empty_like(want_q), L.alloc_scales((), m, k // 128, layout, "cuda")
            tri = graph_ms(functools.partial(T.per_token_group_quant_into, x, q2, s2, 128, layout, backend="triton"))
            rows.append({"m": m, "layout": layout, "impl": "triton", "us": tri * 1e3,
                         "gbs": nbytes / (tri * 1e-3) / 1e9})
            shipped = graph_ms(functools.partial(T.per_token_group_quant_into, x, q2, s2, 128, layout, backend="cuda"))
            rows.append({"m": m, "layout": layout, "impl": "cuda shipped", "us": shipped * 1e3,
                         "gbs": nbytes / (shipped * 1e-3) / 1e9})
            for (th, it, tpg), ld in itertools.product(SHAPES, a.loads):
                q.view(torch.uint8).fill_(0x7B)
                s.view(torch.uint8).fill_(0x7B) if s.is_contiguous() else s.fill_(-1)
                fn = functools.partial(torch.ops.rtp_fp8_C_tuning.cfg, x, q, s, layout, th, it, tpg, ld)
                fn()
                torch.cuda.synchronize()
                exact = torch.equal(q.view(torch.uint8), want_q.view(torch.uint8)) and torch.equal(
                    s.view(torch.int32) if s.dtype == torch.float32 else s,
                    want_s.view(torch.int32) if want_s.dtype == torch.float32 else want_s)
                ms = graph_ms(fn)
                rows.append({"m": m, "layout": layout, "impl": f"cuda t{th} i{it} g{tpg}{LOADS[ld]}",
                             "us": ms * 1e3, "gbs": nbytes / (ms * 1e-3) / 1e9, "exact": exact})
    for r in rows:
        r["ratio"] = r["gbs"] / copy
    if a.out:
        dump(a.out, {"bench": "quant_sweep", "env": env, "copy_gbs": copy, "results": rows})
    print(env)
    print(f"copy {copy:.0f} GB/s")
    for m in a.m:
        for layout in a.layouts:
            sel = sorted((r for r in rows if r["m"] == m and r["layout"] == layout), key=lambda r: r["us"])
            print(f"M={m} {layout}: " + ", ".join(
                f"{r['impl']} {r['us']:.1f}us {r['ratio']:.2f}{'' if r.get('exact', True) else ' INEXACT'}"
                for r in sel))


if __name__ == "__main__":
    main()
