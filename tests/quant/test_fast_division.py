"""The quantizers' division without a divide: `_div_fast` equals IEEE div.rn bit for bit.

The Triton kernel computes x / scale as q0 = x * inv, r = fma(-q0, scale, x), q0 + r * inv
(rounded once) with inv = 1 / scale rounded once per group. Scales are amax / 448 with amax
itself a value of the input dtype, so for bf16 and fp16 inputs the pairs (x, amax) are
finite sets: the GPU test walks every one of them (|x| <= amax, amax above the kernels'
2**-60 * 448 cut-off), comparing the fp8 bits with those from div.rn, and the fp32
quotient's bits too where x and the quotient are >= 2**-100 (below that subnormal
remainders and quotients round differently, and the quotient is an fp8 zero of x's sign
either way). On CPU the same
kernel runs under the interpreter (with rtp_fp8.triton_env's single-rounding fma) on a
sample of amax values, and the interpreter's fma is checked against exact rational
arithmetic.
"""

from fractions import Fraction

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from helpers import DEVICES
from rtp_fp8 import triton_env
from rtp_fp8.quant import token_group as T


@triton.jit
def _mismatch_kernel(x_ptr, a_ptr, bad_ptr, NX, QMAX: tl.constexpr, BLOCK: tl.constexpr):
    """One amax per program row; counts x with |x| <= amax where _div_fast != div_rn."""
    amax = tl.load(a_ptr + tl.program_id(1))
    scale = tl.math.div_rn(amax, QMAX)
    inv = tl.math.div_rn(1.0, scale)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < NX, other=0.0)
    s = tl.full([BLOCK], 0.0, tl.float32) + scale
    i = tl.full([BLOCK], 0.0, tl.float32) + inv
    fast = T._div_fast(x, s, i)
    exact = tl.math.div_rn(x, s)
    f8 = fast.to(tl.float8e4nv).to(tl.int8, bitcast=True)
    e8 = exact.to(tl.float8e4nv).to(tl.int8, bitcast=True)
    # fp32 bits equal unless x or the quotient is below 2**-100 (subnormal results and
    # remainders round differently; such quotients are fp8 zeros either way); fp8 bits always
    normal = (tl.abs(x) >= 7.888609e-31) & (tl.abs(exact) >= 7.888609e-31)
    differ = (fast.to(tl.int32, bitcast=True) != exact.to(tl.int32, bitcast=True)) & normal
    bad = (differ | (f8 != e8)) & (tl.abs(x) <= amax) & (offs < NX)
    tl.atomic_add(bad_ptr, tl.sum(bad.to(tl.int32), axis=0))


@triton.jit
def _pair_kernel(x_ptr, a_ptr, bad_ptr, N, QMAX: tl.constexpr, BLOCK: tl.constexpr):
    """Elementwise pairs (x[i], amax[i]); same comparison as _mismatch_kernel."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < N, other=0.0)
    amax = tl.load(a_ptr + offs, mask=offs < N, other=1.0)
    s = tl.math.div_rn(amax, QMAX)
    fast = T._div_fast(x, s, tl.math.div_rn(1.0, s))
    exact = tl.math.div_rn(x, s)
    f8 = fast.to(tl.float8e4nv).to(tl.int8, bitcast=True)
    e8 = exact.to(tl.float8e4nv).to(tl.int8, bitcast=True)
    normal = (tl.abs(x) >= 7.888609e-31) & (tl.abs(exact) >= 7.888609e-31)
    differ = (fast.to(tl.int32, bitcast=True) != exact.to(tl.int32, bitcast=True)) & normal
    tl.atomic_add(bad_ptr, tl.sum(((differ | (f8 != e8)) & (offs < N)).to(tl.int32), axis=0))


def _all_finite(dtype):
    bits = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(dtype)
    return bits[torch.isfinite(bits.float())].float()


def _mismatches(dtype, device, amax_sample=None):
    xs = _all_finite(dtype)
    amaxes = xs[xs > 448.0 * 2.0**-60].unique()
    if amax_sample is not None:
        g = torch.Generator().manual_seed(7)
        pick = torch.randperm(amaxes.numel(), generator=g)[:amax_sample]
        amaxes = torch.cat([amaxes[pick], amaxes[:4], amaxes[-4:]])  # extremes too
    bad = torch.zeros(1, dtype=torch.int32, device=device)
    block = 4096
    x_d, a_d = xs.to(device), amaxes.to(device)
    _mismatch_kernel[(triton.cdiv(xs.numel(), block), amaxes.numel())](x_d, a_d, bad, xs.numel(),
                                                                        QMAX=448.0, BLOCK=block)
    return int(bad.item()), amaxes.numel() * xs.numel()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_div_fast_every_pair_gpu(dtype):
    bad, pairs = _mismatches(dtype, "cuda")
    assert pairs > 2**29
    assert bad == 0, f"{bad} of {pairs} (x, amax) pairs differ from div.rn"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_div_fast_sampled_interpreter(dtype):
    if torch.cuda.is_available():
        pytest.skip("the GPU test covers every pair")
    bad, pairs = _mismatches(dtype, "cpu", amax_sample=24)
    assert bad == 0, f"{bad} of {pairs} (x, amax) pairs differ from div.rn"


@pytest.mark.parametrize("device", DEVICES)
def test_div_fast_random_fp32(device):
    """fp32 inputs: random amax (scale >= 2**-60 up to fp32's top binades) and x within
    31 binades below it, 2**26 pairs on the GPU (2**16 under the interpreter)."""
    n = 2**26 if device == "cuda" else 2**16
    g = torch.Generator(device=device).manual_seed(5)
    mant = torch.randint(0, 2**23, (2, n), generator=g, device=device, dtype=torch.int32)
    ea = torch.randint(76, 254, (n,), generator=g, device=device, dtype=torch.int32)
    ex = (ea - torch.randint(0, 32, (n,), generator=g, device=device, dtype=torch.int32)).clamp_min(1)
    sign = torch.randint(0, 2, (n,), generator=g, device=device, dtype=torch.int32) << 31
    amax = ((ea << 23) | mant[0]).view(torch.float32)
    x = ((ex << 23) | mant[1] | sign).view(torch.float32)
    x = torch.where(x.abs() > amax, amax.copysign(x), x)
    bad = torch.zeros(1, dtype=torch.int32, device=device)
    _pair_kernel[(triton.cdiv(n, 4096),)](x, amax, bad, n, QMAX=448.0, BLOCK=4096)
    assert int(bad.item()) == 0, f"{int(bad.item())} of {n} fp32 pairs differ from div.rn"


def _round_f32(v: Fraction) -> np.float32:
    """v rounded to nearest-even float32 (normal range), by exact comparison."""
    c = np.float32(float(v))
    cands = [np.nextafter(c, np.float32(-np.inf)), c, np.nextafter(c, np.float32(np.inf))]
    dist = [abs(Fraction(float(f)) - v) for f in cands]
    best = min(dist)
    ties = [f for f, d in zip(cands, dist) if d == best]
    return min(ties, key=lambda f: int(np.array(f).view(np.uint32)) & 1)


def test_interpreter_fma_rounds_once():
    if not triton_env.interpreting():
        pytest.skip("checks the interpreter's fma; compiled kernels use fma.rn.f32")
    rng = np.random.default_rng(3)
    x = rng.standard_normal(4000).astype(np.float32)
    y = rng.standard_normal(4000).astype(np.float32)
    # z cancels most of x*y, where two roundings differ from one most often
    z = (-(x.astype(np.float64) * y) * (1 + rng.integers(-4, 5, 4000) * 2.0**-24)).astype(np.float32)
    got = triton_env.fma_f32(x, y, z)
    want = np.array([_round_f32(Fraction(float(a)) * Fraction(float(b)) + Fraction(float(c)))
                     for a, b, c in zip(x, y, z)], dtype=np.float32)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    two_roundings = (x * y + z).astype(np.float32)
    assert not np.array_equal(two_roundings.view(np.uint32), want.view(np.uint32))  # the check can fail


@pytest.mark.parametrize("device", DEVICES)
def test_nan_and_inf_in_one_tile(device):
    """A tile with +-Inf takes the dividing path; NaN is 0x7F whatever its sign; scales from the finite amax."""
    from rtp_fp8.quant import reference as R

    g = torch.Generator().manual_seed(11)
    x = torch.randn(6, 512, generator=g)
    x[1, 3], x[2, 200], x[4, 7], x[4, 9] = float("inf"), -float("inf"), float("nan"), -float("nan")
    x = x.to(torch.bfloat16).to(device)
    q, s = T.per_token_group_quant(x, 128, backend="triton")
    qr, sr = R.per_token_group_quant_ref(x.cpu(), 128, torch.float8_e4m3fn)
    assert torch.equal(q.cpu().view(torch.uint8), qr.view(torch.uint8))
    assert torch.equal(s.cpu(), sr)
    assert q.cpu().view(torch.uint8)[4, 9] == 0x7F and q.cpu().view(torch.uint8)[2, 200] == 0xFE
