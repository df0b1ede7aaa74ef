"""Benchmark helpers: ceilings measured in the same run, medians, environment line."""

from __future__ import annotations

import argparse
import json
import platform
import subprocess

import torch
import triton
from triton.testing import do_bench, do_bench_cudagraph

from rtp_fp8.arch import detect


def nk_pair(text):
    """An argparse type: "NxK" -> (N, K), both >= 1."""
    try:
        n, k = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected NxK, e.g. 7168x2048, got {text!r}") from None
    if n < 1 or k < 1:
        raise argparse.ArgumentTypeError(f"{text!r} needs N, K >= 1")
    return n, k


def median_ms(fn, warmup=25, rep=200) -> float:
    """Eager calls: includes the Python launch cost whenever it exceeds the kernel time."""
    return float(do_bench(fn, warmup=warmup, rep=rep, return_mode="median"))


def graph_ms(fn, rep=100) -> float:
    """CUDA-graph replays of fn: the kernel time, without Python launch cost."""
    fn()
    torch.cuda.synchronize()
    return float(do_bench_cudagraph(fn, rep=rep, return_mode="median"))


def operand_sets(make, cold: bool = True, cache_factor: int = 4, most: int = 32) -> list:
    """[make(), make(), ...]: fresh operand tuples enough that one pass over them moves at least
    cache_factor x the GPU's L2 (at most `most`), so that each call of a pass finds its operands in
    device memory, as a model's layers find their weights, not in the cache that the call before left
    them in (timing one small operand set over and over measures the L2). cold=False: one set."""
    first = make()
    if not cold:
        return [first]
    nbytes = sum(t.numel() * t.element_size() for t in first if torch.is_tensor(t))
    l2 = torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size
    n = min(most, max(1, -(-cache_factor * l2 // max(nbytes, 1))))
    return [first] + [make() for _ in range(n - 1)]


def rotated_ms(fn, sets, rep=100) -> float:
    """graph_ms per call of fn(*ops), the calls taking the operand sets in turn."""
    return graph_ms(lambda: [fn(*ops) for ops in sets], rep) / len(sets)


def output_of(call, ops, out):
    """What call(*ops) writes into out, a copy; out is NaN-poisoned first, so that what the call does
    not write cannot pass for a reference's values."""
    out.fill_(float("nan"))
    call(*ops)
    return out.clone()


def rel_l2(out, ref) -> float:
    """The relative L2 distance of out to ref, in float64."""
    return float((out.double() - ref.double()).norm() / ref.double().norm())


def copy_ms(nbytes: int, graph: bool = False) -> tuple[float, int]:
    """Device-to-device copy of a bf16 buffer of about nbytes: (median ms, bytes read + written).
    graph=True times CUDA-graph replays (as graph_ms), else eager calls (as median_ms)."""
    a = torch.empty(nbytes // 2, dtype=torch.bfloat16, device="cuda").normal_()
    b = torch.empty_like(a)
    fn = lambda: b.copy_(a)  # noqa: E731
    return (graph_ms(fn) if graph else median_ms(fn)), 2 * a.numel() * a.element_size()


def copy_bandwidth_gbs(nbytes: int = 2 << 30) -> float:
    """Device-to-device copy, bytes read + written, median."""
    ms, moved = copy_ms(nbytes)
    return moved / (ms * 1e-3) / 1e9


def fp8_gemm_tflops(n: int = 8192) -> float:
    """cuBLASLt per-tensor FP8 GEMM (torch._scaled_mm), median TFLOP/s."""
    a = torch.randn(n, n, device="cuda").to(torch.float8_e4m3fn)
    b = torch.randn(n, n, device="cuda").to(torch.float8_e4m3fn).t()
    one = torch.tensor(1.0, device="cuda")
    ms = median_ms(lambda: torch._scaled_mm(a, b, one, one, out_dtype=torch.bfloat16))
    return 2 * n**3 / (ms * 1e-3) / 1e12


def environment() -> dict:
    try:
        drv = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True).stdout.strip()
    except OSError:
        drv = "?"
    return {
        "gpu": torch.cuda.get_device_name(), "arch": str(detect()),
        "torch": torch.__version__, "cuda": torch.version.cuda, "triton": triton.__version__,
        "driver": drv, "python": platform.python_version(),
    }


def dump(path, payload):
    with open(path, "w") as f:
        json.dump(payload, f, indent=2)
