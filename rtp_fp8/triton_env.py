"""Triton set-up shared by every kernel module: interpreter detection and cast fix.

On machines without a GPU, Triton kernels run under the interpreter
(`TRITON_INTERPRET=1`). Its float conversion (`triton.runtime.interpreter._convert_float`)
is wrong for narrowing casts (triton issue #8322): fp32/bf16 -> fp8 rounds ties away
from zero and drops the carry when rounding overflows the mantissa (127.56 -> 64, not
128), and fp32 -> bf16 truncates. Every FP8 result computed under the interpreter would
be garbage, so `install_interpreter_cast_fix()` replaces that function, at the module
where the interpreter's builder looks it up, with a round-to-nearest-even conversion
checked against torch's own casts (tests/test_triton_interp_cast.py: every bf16 bit
pattern and a dense fp32 sweep). Overflow follows torch: float8_e4m3fn saturates to +-448
(inf too), float8_e5m2 overflows to inf; NaN stays NaN (float8_e4m3fn: always the
positive code 0x7F, as the GPU's satfinite cast gives it).

Two more interpreter semantics are made the GPU's: `tl.fma` rounds once (numpy computed
x * y + z with two roundings, which breaks the quantizers' exact division), and
maxnum/minnum (`tl.maximum`/`tl.minimum`) return the non-NaN operand as LLVM's maxnum does
(numpy's maximum returns NaN). tests/quant/test_fast_division.py checks the fma against
exact rational arithmetic.

The fix is a no-op outside interpreter mode. `RTP_FP8_TRITON_CAST_FIX=0` leaves the
upstream conversion in place, only to demonstrate the upstream defect.
"""

from __future__ import annotations

import functools
import os

import numpy as np


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def runs_on(device) -> bool:
    """Whether Triton kernels can take tensors on `device`: CUDA ones, or CPU ones under the
    interpreter. The one statement of that rule (GEMM backends and the quantizer ask it)."""
    return getattr(device, "type", str(device).split(":")[0]) == "cuda" or interpreting()


@functools.cache
def _fp8_grid(exp_bits: int, man_bits: int, bias: int, fn: bool):
    """Sorted non-negative values of an fp8 format, their codes, and the NaN code.

    One extra entry past the largest finite value stands for overflow: the value the
    next code would have (so ties are decided by RNE on codes), mapped to the largest
    finite value in fn formats (saturating, like torch and the GPU's satfinite cast)
    and to +inf in IEEE-like formats (like torch).
    """
    codes, values = [], []
    top = (1 << (exp_bits + man_bits)) - 1
    for code in range(top + 1):
        e, m = code >> man_bits, code & ((1 << man_bits) - 1)
        if fn and code == top:
            break  # S.1111.111 is NaN in e4m3fn
        if not fn and e == (1 << exp_bits) - 1:
            break  # inf / NaN in IEEE-like formats
        v = (m / (1 << man_bits)) * 2.0 ** (1 - bias) if e == 0 else (1 + m / (1 << man_bits)) * 2.0 ** (e - bias)
        codes.append(code)
        values.append(v)
    nan_code = top if fn else (((1 << exp_bits) - 1) << man_bits) | (1 << (man_bits - 1))
    inf_code = None if fn else ((1 << exp_bits) - 1) << man_bits
    step = values[-1] - values[-2]
    values.append(values[-1] + step)
    codes.append(codes[-1] if fn else inf_code)
    return np.array(values, dtype=np.float64), np.array(codes, dtype=np.uint8), nan_code, inf_code


_FP8 = {"fp8e4nv": (4, 3, 7, True), "fp8e5": (5, 2, 15, False)}


def _to_f64(data: np.ndarray, name: str) -> np.ndarray:
    if name == "bf16":
        return (data.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    if name in _FP8:
        return _fp8_decode(data, name)
    return data.astype(np.float64)


def _fp8_decode(data: np.ndarray, name: str) -> np.ndarray:
    values, codes, nan_code, inf_code = _fp8_grid(*_FP8[name])
    table = np.full(256, np.nan)
    table[codes[:-1]] = values[:-1]
    table[codes[:-1] | 0x80] = -values[:-1]
    if inf_code is not None:
        table[inf_code], table[inf_code | 0x80] = np.inf, -np.inf
    return table[data.view(np.uint8)]


def _fp8_encode(x: np.ndarray, name: str) -> np.ndarray:
    values, codes, nan_code, inf_code = _fp8_grid(*_FP8[name])
    a = np.abs(x)
    finite = np.isfinite(a)
    af = np.where(finite, a, 0.0)
    hi = np.clip(np.searchsorted(values, af, side="left"), 1, len(values) - 1)
    lo = hi - 1
    d_lo, d_hi = af - values[lo], values[hi] - af
    pick_hi = (d_hi < d_lo) | ((d_hi == d_lo) & (codes[hi] % 2 == 0))
    exact = values[hi] == af
    out = np.where(exact | pick_hi, codes[hi], codes[lo]).astype(np.uint8)
    out[af == 0] = 0
    out[np.isinf(a)] = codes[-1]  # inf (e5m2) or the saturated max (e4m3fn)
    sign = np.signbit(x).astype(np.uint8) << 7
    out |= sign
    # The GPU's cvt.rn.satfinite.e4m3x2 gives every NaN the positive code 0x7F (measured on the H200).
    out[np.isnan(x)] = nan_code
    return out


def _bf16_encode(x: np.ndarray) -> np.ndarray:
    bits = x.astype(np.float32).view(np.uint32)
    rounded = bits + np.uint32(0x7FFF) + ((bits >> 16) & 1)
    out = (rounded >> 16).astype(np.uint16)
    nan = np.isnan(x)
    out[nan] = ((bits[nan] >> 16) | 0x0040).astype(np.uint16)  # keep sign, quiet NaN
    return out


def _make_convert(original):
    from triton import language as tl

    names = {tl.bfloat16: "bf16", tl.float8e4nv: "fp8e4nv", tl.float8e5: "fp8e5",
             tl.float32: "f32", tl.float16: "f16", tl.float64: "f64"}

    def convert(input, input_dtype, output_dtype, rounding_mode):
        src, dst = names.get(input_dtype), names.get(output_dtype)
        narrowing = dst in _FP8 or (dst == "bf16" and src in ("f32", "f64"))
        widening_fp8 = src in _FP8 and dst in ("f16", "f32", "f64", "bf16")
        if src is None or dst is None or not (narrowing or widening_fp8):
            return original(input, input_dtype, output_dtype, rounding_mode)
        arr = np.asarray(input)
        with np.errstate(invalid="ignore"):
            x = _to_f64(arr, src)
        if dst == "bf16":
            out = _bf16_encode(x.astype(np.float32))  # sources here are exact in fp32
        elif dst in _FP8:
            out = _fp8_encode(x, dst)  # fp32/bf16/fp16 are exact in float64: one rounding
        else:
            out = x.astype({"f16": np.float16, "f32": np.float32, "f64": np.float64}[dst])
        return out.reshape(arr.shape)

    convert.__rtp_fp8_fixed__ = True
    convert.__wrapped__ = original
    return convert


def fma_f32(x: np.ndarray, y: np.ndarray, z: np.ndarray) -> np.ndarray:
    """x * y + z rounded once to float32 (the GPU's fma.rn.f32), for float32 arrays.

    The product is exact in float64; the float64 sum is made round-to-odd (nudged off an
    even last bit when it was inexact), and round-to-odd at 53 bits followed by one
    rounding to 24 bits equals a single rounding of the exact value.
    """
    p = x.astype(np.float64) * y.astype(np.float64)
    c = z.astype(np.float64)
    s = p + c
    bp = s - c
    err = (p - bp) + (c - (s - bp))  # TwoSum: s + err == p + c exactly
    bits = s.view(np.int64)
    nudge = (err != 0) & np.isfinite(s) & ((bits & 1) == 0)
    s = np.where(nudge, np.nextafter(s, np.where(err > 0, np.inf, -np.inf)), s)
    return s.astype(np.float32)


def _patch_builder(interpreter) -> None:
    """IEEE semantics for the interpreter's fma (one rounding, not two) and maxnum/minnum
    (the non-NaN operand wins, as on the GPU and in LLVM, not NaN as np.maximum gives)."""
    builder = interpreter.InterpreterBuilder

    def create_fma(self, x, y, z):
        if x.data.dtype == np.float32:
            return interpreter.TensorHandle(fma_f32(x.data, y.data, z.data), z.dtype.scalar)
        return interpreter.TensorHandle(x.data * y.data + z.data, z.dtype.scalar)

    builder.create_fma = create_fma
    builder.create_maxnumf = lambda self, lhs, rhs: self.binary_op(lhs, rhs, np.fmax)
    builder.create_minnumf = lambda self, lhs, rhs: self.binary_op(lhs, rhs, np.fmin)


def install_interpreter_cast_fix() -> bool:
    """Replace the interpreter's float conversion, fma and maxnum/minnum (no-op unless interpreting)."""
    if not interpreting() or os.environ.get("RTP_FP8_TRITON_CAST_FIX", "1") == "0":
        return False
    from triton.runtime import interpreter

    if getattr(interpreter._convert_float, "__rtp_fp8_fixed__", False):
        return True
    interpreter._convert_float = _make_convert(interpreter._convert_float)
    _patch_builder(interpreter)
    return True


install_interpreter_cast_fix()
