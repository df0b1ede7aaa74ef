"""rtp_fp8.nn.FP8Linear on the GPU: what the module costs beyond its GEMM, against BF16 nn.Linear.

    PYTHONPATH=. python3 bench/nn_linear.py [--out results.json]

For each shape (M tokens, N, K from DeepSeek-V3's dense layers) and backend (DeepGEMM where it
runs this GPU's Arch, Triton): the module's forward (activation quantization + GEMM + output
cast) and the bare GEMM on pre-quantized operands, both as CUDA-graph replay medians, and
torch's BF16 nn.Linear (cuBLAS) on the same input. TFLOP/s = 2*M*N*K / time; `ceiling` is
torch._scaled_mm (per-tensor FP8, cuBLASLt) at 8192^3 measured in the same run.
"""

from __future__ import annotations

import argparse

import torch

from bench.common import dump, environment, fp8_gemm_tflops, graph_ms
from rtp_fp8 import arch as A
from rtp_fp8 import nn as fp8nn
from rtp_fp8.gemm import backends as BK
from rtp_fp8.quant import quantize_activation

SHAPES = [(128, 7168, 16384), (128, 4096, 7168), (4096, 4096, 7168), (4096, 7168, 2048)]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    args = ap.parse_args()
    env = environment()
    ceiling = fp8_gemm_tflops()
    arch = A.detect()
    rows = []
    for m, n, k in SHAPES:
        torch.manual_seed(0)
        lin = torch.nn.Linear(k, n, bias=False, dtype=torch.bfloat16, device="cuda")
        x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
        flops = 2 * m * n * k
        with torch.no_grad():
            bf16_ms = graph_ms(lambda lin=lin, x=x: lin(x))
        for backend in ("deepgemm", "triton"):
            why = BK.unavailable_reason(backend, arch, n, k, device="cuda")
            if why:
                rows.append({"m": m, "n": n, "k": k, "backend": backend, "skipped": why})
                continue
            mod = fp8nn.FP8Linear.from_linear(lin, backend=backend)
            run = mod.prepare()
            a, sa = quantize_activation(x, 128, arch=run["arch"])
            gemm_ms = graph_ms(lambda run=run, a=a, sa=sa: run["backend"].gemm_nt(a, sa, run["q"], run["s"]))
            with torch.no_grad():
                mod_ms = graph_ms(lambda mod=mod, x=x: mod(x))
            rows.append({"m": m, "n": n, "k": k, "backend": backend, "module_us": mod_ms * 1e3,
                         "gemm_us": gemm_ms * 1e3, "bf16_linear_us": bf16_ms * 1e3,
                         "module_tflops": flops / (mod_ms * 1e-3) / 1e12,
                         "gemm_tflops": flops / (gemm_ms * 1e-3) / 1e12,
                         "module_over_ceiling": flops / (mod_ms * 1e-3) / 1e12 / ceiling,
                         "speedup_vs_bf16": bf16_ms / mod_ms})
    print(f"{env['gpu']}, torch {env['torch']}, triton {env['triton']}, CUDA {env['cuda']}; "
          f"FP8 ceiling {ceiling:.0f} TFLOP/s")
    print("| M | N | K | backend | module us | GEMM us | BF16 nn.Linear us | module TFLOP/s | vs ceiling | "
          "vs BF16 |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if "skipped" in r:
            print(f"| {r['m']} | {r['n']} | {r['k']} | {r['backend']} | skipped: {r['skipped']} |||||")
            continue
        print(f"| {r['m']} | {r['n']} | {r['k']} | {r['backend']} | {r['module_us']:.1f} | {r['gemm_us']:.1f} | "
              f"{r['bf16_linear_us']:.1f} | {r['module_tflops']:.0f} | {r['module_over_ceiling']:.2f} | "
              f"{r['speedup_vs_bf16']:.2f}x |")
    if args.out:
        dump(args.out, {"env": env, "fp8_ceiling_tflops": ceiling, "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
