"""Per-token-group quantization bf16 -> fp8 on the GPU, against the copy ceiling.

    PYTHONPATH=. python3 bench/quant.py [--out results.json] [--sweep]

K=7168, group 128, M in {128, 4096, 32768}; scale layouts row (FP32), col_tma (FP32,
DeepGEMM SM90) and ue8m0 (packed, DeepGEMM SM100). Bytes = input read + fp8 written +
scales written. Beside it: torch.compile of the oracle (FP32 row scales), a device copy of
the same bytes timed the same way (what a plain memory-bound kernel reaches at that
size, fixed launch cost included), and the chunked direct UE8M0 weight quantization's
peak extra memory.
"""

from __future__ import annotations

import argparse
import itertools

import torch

from bench.common import copy_bandwidth_gbs, copy_ms, dump, environment, graph_ms, median_ms
from rtp_fp8 import _ext
from rtp_fp8.quant import block as B
from rtp_fp8.quant import layout as L
from rtp_fp8.quant import reference as R
from rtp_fp8.quant import token_group as T

K, GROUP = 7168, 128


def _bytes(m, layout):
    g = K // GROUP
    sbytes = m * (L.cdiv(g, 4) if layout == "ue8m0" else g) * 4
    return m * K * 2 + m * K + sbytes


def bench_kernel(m, layout, config=None, check=False, graph=False, backend="triton"):
    x = torch.randn(m, K, device="cuda", dtype=torch.bfloat16)
    q = torch.empty(m, K, device="cuda", dtype=torch.float8_e4m3fn)
    s = L.alloc_scales((), m, K // GROUP, layout, "cuda")
    fn = lambda: T.per_token_group_quant_into(x, q, s, GROUP, layout, backend=backend, _config=config)
    fn()
    if check:  # against the CPU oracle (tests cover every shape; this guards the benched config)
        qr, sr = R.per_token_group_quant_ref(x, GROUP, pow2=layout == "ue8m0")
        assert torch.equal(q.view(torch.uint8).cpu(), qr.view(torch.uint8)), "kernel != oracle"
    if graph:  # kernel time without Python launch overhead (how a serving engine replays it)
        ms = graph_ms(fn)
    else:
        ms = median_ms(fn)
    return ms, _bytes(m, layout) / (ms * 1e-3) / 1e9


def bench_copy(m, graph=False):
    """A copy moving the bytes of row-scale quantization at M (half read, half written)."""
    ms, moved = copy_ms(_bytes(m, "row") // 2, graph=graph)
    return ms, moved / (ms * 1e-3) / 1e9


def bench_compile(m):
    x = torch.randn(m, K, device="cuda", dtype=torch.bfloat16)
    def quant(x):  # the usual torch formulation (fp32 division on the device)
        xf = x.float().view(m, K // GROUP, GROUP)
        scale = xf.abs().amax(-1).clamp(min=1e-10) / 448.0
        return (xf / scale[..., None]).clamp(-448, 448).to(torch.float8_e4m3fn).view(m, K), scale

    f = torch.compile(quant)
    f(x)
    ms = median_ms(lambda: f(x))
    return ms, _bytes(m, "row") / (ms * 1e-3) / 1e9


def chunk_memory(n=7168, k=16384):
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    out = {}
    for chunk in (None, 1024):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        q, s = B.quantize_weight_blocks(w, pow2=True, chunk_rows=chunk)
        torch.cuda.synchronize()
        result_bytes = q.numel() + s.numel() * 4
        out[str(chunk)] = (torch.cuda.max_memory_allocated() - base - result_bytes) / 2**20
        del q, s
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--sweep", action="store_true")
    a = ap.parse_args()
    env = environment()
    copy = copy_bandwidth_gbs()
    rows = []
    if a.sweep:
        for m, layout in itertools.product((128, 32768), ("row", "ue8m0")):
            for seg, w in itertools.product((4, 8, 16, 32, 64), (1, 2, 4, 8)):
                try:
                    ms, gbs = bench_kernel(m, layout, (seg, w), graph=m <= 4096)
                except Exception as exc:  # noqa: BLE001 - a config that fails to compile is skipped
                    print("skip", m, layout, seg, w, exc)
                    continue
                print(f"sweep M={m:6d} {layout:6s} SEG={seg:2d} W={w}: {ms*1e3:8.1f} us {gbs:7.0f} GB/s")
                rows.append({"m": m, "layout": layout, "cfg": [seg, w], "us": ms * 1e3, "gbs": gbs})
    res = []
    for m in (128, 4096, 32768):
        for layout in ("row", "col_tma", "ue8m0"):
            ms, gbs = bench_kernel(m, layout, check=m == 4096, graph=m <= 4096)
            res.append({"impl": "triton", "m": m, "layout": layout, "us": ms * 1e3, "gbs": gbs, "ratio": gbs / copy})
            if _ext.available():
                ms, gbs = bench_kernel(m, layout, check=m == 4096, graph=m <= 4096, backend="cuda")
                res.append({"impl": "cuda ext", "m": m, "layout": layout, "us": ms * 1e3, "gbs": gbs,
                            "ratio": gbs / copy})
            if m == 128:
                ms, gbs = bench_kernel(m, layout)
                res.append({"impl": "triton (eager call)", "m": m, "layout": layout, "us": ms * 1e3, "gbs": gbs,
                            "ratio": gbs / copy})
        ms, gbs = bench_copy(m, graph=m <= 4096)
        res.append({"impl": "copy, same bytes", "m": m, "layout": "row", "us": ms * 1e3, "gbs": gbs,
                    "ratio": gbs / copy})
        ms, gbs = bench_compile(m)
        res.append({"impl": "torch.compile(oracle)", "m": m, "layout": "row", "us": ms * 1e3, "gbs": gbs,
                    "ratio": gbs / copy})
    mem = chunk_memory()
    a_ = torch.randn(1 << 20, device="cuda") * 100
    b_ = torch.rand(1 << 20, device="cuda") + 0.01
    exact = (a_.double() / b_.double()).float()
    div_mismatch = int(((a_ / b_) != exact).sum())
    if a.out:
        dump(a.out, {"env": env, "copy_gbs": copy, "results": res, "sweep": rows, "chunk_extra_mib": mem,
                         "torch_cuda_fp32_div_not_correctly_rounded": div_mismatch})
    print(env, "extension:", _ext.available() or _ext.unavailable_reason())
    print(f"copy bandwidth (read+write): {copy:.0f} GB/s")
    print(f"{'impl':24s} {'M':>6s} {'layout':8s} {'us':>9s} {'GB/s':>7s} {'ratio':>6s}")
    for r in res:
        print(f"{r['impl']:24s} {r['m']:6d} {r['layout']:8s} {r['us']:9.1f} {r['gbs']:7.0f} {r['ratio']:6.2f}")
    print(f"torch CUDA fp32 a/b not correctly rounded in {div_mismatch} of {1 << 20} cases")
    print("direct UE8M0 weight quant 7168x16384, peak extra MiB (unchunked vs 1024-row chunks):", mem)


if __name__ == "__main__":
    main()
