"""The Triton interpreter's narrowing casts, fixed by rtp_fp8.triton_env, equal torch's.

Runs a real Triton kernel (under the interpreter on CPU, compiled on a GPU) that casts
fp32/bf16/fp16 to float8_e4m3fn / float8_e5m2 / bf16 and compares bytes with torch's
own casts: every bf16 bit pattern, every fp16 bit pattern, a dense fp32 sweep over the
fp8 range, and every exact tie between neighbouring fp8 values (+-1 ulp).
"""

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from rtp_fp8 import triton_env


@triton.jit
def _cast_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(y_ptr + offs, x.to(y_ptr.dtype.element_ty), mask=mask)


def _triton_cast(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    y = torch.empty(x.shape, dtype=dtype, device=x.device)
    y.view(torch.uint8 if y.element_size() == 1 else torch.int16).fill_(0x55)  # poison
    block = 4096
    _cast_kernel[(triton.cdiv(x.numel(), block),)](x, y, x.numel(), BLOCK=block)
    return y


def _device():
    return "cuda" if torch.cuda.is_available() else "cpu"


def _assert_same(x: torch.Tensor, dtype: torch.dtype, clamp: bool):
    if clamp:  # the GPU's fp8 cast saturates, torch's gives NaN: compare in range only
        fmax = torch.finfo(dtype).max
        x = x.float().clamp(-fmax, fmax).to(x.dtype)
    got = _triton_cast(x.to(_device()), dtype).cpu()
    want = x.to(dtype)
    gbits = got.view(torch.uint8 if got.element_size() == 1 else torch.int16)
    wbits = want.view(torch.uint8 if want.element_size() == 1 else torch.int16)
    nan = torch.isnan(want.float())
    assert torch.equal(torch.isnan(got.float()), nan)
    bad = (gbits != wbits) & ~nan
    assert not bad.any(), (
        f"{int(bad.sum())} mismatches, first: x={x[bad][:5].tolist()} got={got[bad][:5].float().tolist()} "
        f"want={want[bad][:5].float().tolist()}"
    )


FP8 = [torch.float8_e4m3fn, torch.float8_e5m2]


def _clamp_needed():
    return torch.cuda.is_available()


@pytest.mark.parametrize("dtype", FP8)
def test_every_bf16_bit_pattern(dtype):
    x = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    _assert_same(x, dtype, clamp=_clamp_needed())


@pytest.mark.parametrize("dtype", FP8)
def test_every_fp16_bit_pattern(dtype):
    x = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(torch.float16)
    _assert_same(x, dtype, clamp=_clamp_needed())


@pytest.mark.parametrize("dtype", FP8)
def test_dense_fp32_sweep(dtype):
    lo = np.float32(2.0**-20).view(np.uint32)
    hi = np.float32(float(torch.finfo(dtype).max) * 1.2).view(np.uint32)
    bits = np.arange(lo, hi, 97, dtype=np.uint32)
    x = torch.from_numpy(bits.view(np.float32).copy())
    x = torch.cat([x, -x, torch.tensor([0.0, -0.0, float("inf"), float("-inf"), float("nan")])])
    _assert_same(x, dtype, clamp=_clamp_needed())


@pytest.mark.parametrize("dtype", FP8)
def test_every_fp8_tie_and_neighbours(dtype):
    vals = torch.arange(0, 256, dtype=torch.int32).to(torch.uint8).view(dtype).float()
    vals = vals[torch.isfinite(vals) & (vals >= 0)].unique().sort().values.double()
    mid = ((vals[1:] + vals[:-1]) / 2).float()  # exact in fp32
    up = torch.nextafter(mid, torch.full_like(mid, float("inf")))
    down = torch.nextafter(mid, torch.zeros_like(mid))
    x = torch.cat([mid, up, down, vals.float()])
    x = torch.cat([x, -x])
    _assert_same(x, dtype, clamp=_clamp_needed())


def test_fp32_to_bf16_rounds_to_nearest_even():
    x = torch.randn(1 << 16) * torch.logspace(-20, 20, 1 << 16)
    x = torch.cat([x, torch.tensor([1.00390625, 1.01171875, -1.00390625])])  # exact bf16 ties
    _assert_same(x, torch.bfloat16, clamp=False)


def test_documented_example_127_56():
    x = torch.tensor([127.56, -127.56, 448.0, 0.0], dtype=torch.float32)
    got = _triton_cast(x.to(_device()), torch.float8_e4m3fn).float().cpu()
    assert got.tolist() == [128.0, -128.0, 448.0, 0.0]


@pytest.mark.skipif(not triton_env.interpreting(), reason="the defect is in the Triton interpreter; not interpreting")
def test_upstream_interpreter_cast_still_wrong():
    """Documents triton#8322 on the installed Triton: when this fails, upstream is fixed
    and rtp_fp8.triton_env's replacement can be dropped."""
    from triton.runtime import interpreter

    conv = interpreter._convert_float
    original = getattr(conv, "__wrapped__", conv)
    from triton._C.libtriton import ir

    x = np.array([127.56], dtype=np.float32)
    y = original(x, tl.float32, tl.float8e4nv, ir.ROUNDING_MODE.RTNE).view(np.uint8)
    assert torch.from_numpy(y.copy()).view(torch.float8_e4m3fn).float().item() == 64.0


@triton.jit
def _maxmin_kernel(x_ptr, y_ptr, mx_ptr, mn_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs)
    y = tl.load(y_ptr + offs)
    tl.store(mx_ptr + offs, tl.maximum(x, y))
    tl.store(mn_ptr + offs, tl.minimum(x, y))


def test_maximum_minimum_ignore_nan_like_the_gpu():
    """tl.maximum / tl.minimum are maxnum / minnum: the non-NaN operand wins (torch.fmax / fmin)."""
    nan = float("nan")
    x = torch.tensor([nan, 1.0, nan, -2.0, 3.0, -0.0, float("inf"), nan], device=_device())
    y = torch.tensor([1.0, nan, nan, 5.0, -3.0, 0.0, 2.0, -float("inf")], device=_device())
    mx, mn = torch.empty_like(x), torch.empty_like(x)
    _maxmin_kernel[(1,)](x, y, mx, mn, BLOCK=8)
    torch.testing.assert_close(mx.cpu(), torch.fmax(x, y).cpu(), equal_nan=True)
    torch.testing.assert_close(mn.cpu(), torch.fmin(x, y).cpu(), equal_nan=True)


def test_runs_on_is_the_one_device_rule(monkeypatch):
    """Triton takes CUDA tensors always and CPU tensors only under the interpreter; the GEMM
    backends and the quantizer all ask triton_env.runs_on."""
    import torch

    for on in (True, False):
        monkeypatch.setattr(triton_env, "interpreting", lambda on=on: on)
        assert triton_env.runs_on(torch.device("cuda", 0)) and triton_env.runs_on("cuda:1")
        assert triton_env.runs_on(torch.device("cpu")) is on and triton_env.runs_on("cpu") is on
