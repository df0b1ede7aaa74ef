"""Per-token-group quantization: the Triton kernel equals the oracle bit for bit.

Scales exact; values exact given the same scale (both divide in fp32 and round to
nearest even). Runs under the interpreter on CPU and compiled on a GPU.
"""

import pytest
import torch

from helpers import DEVICES, assert_bits_equal, poison_
from rtp_fp8.quant import layout as L
from rtp_fp8.quant import reference as R
from rtp_fp8.quant import token_group as T

IN = [torch.bfloat16, torch.float16, torch.float32]
LAYOUTS = ["row", "col", "col_tma", "ue8m0"]


def _rand(m, k, dtype, device, seed):
    g = torch.Generator().manual_seed(seed)
    # Per-row magnitudes over many octaves so scales and roundings vary.
    x = torch.randn(m, k, generator=g) * torch.exp2(torch.randint(-12, 12, (m, 1), generator=g).float())
    return x.to(dtype).to(device)


def _expected(x, group, out_dtype, layout, pow2=False):
    q, s = R.per_token_group_quant_ref(x.cpu(), group, out_dtype, pow2=pow2 or layout == "ue8m0")
    if layout == "ue8m0":
        return q, R.pack_ue8m0_ref(s)
    return q, s


def _run_poisoned(x, group, out_dtype, layout, pow2=False, guard=64):
    """Call the in-place API on poisoned outputs inside a poisoned guard buffer."""
    m, k = x.shape
    q = poison_(torch.empty(m, k, dtype=out_dtype, device=x.device))
    g = k // group
    ref = L.alloc_scales((), m, g, layout, x.device)
    base = torch.empty(ref.untyped_storage().nbytes() // 4 + guard, dtype=ref.dtype, device=x.device)
    poison_(base)
    s = torch.as_strided(base, ref.shape, ref.stride())
    T.per_token_group_quant_into(x, q, s, group, layout, pow2)
    return q, s, base, ref.untyped_storage().nbytes() // 4


SHAPES = [(1, 128), (3, 256), (5, 2304), (17, 1024), (130, 640)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("group", [64, 128, 256])
@pytest.mark.parametrize("dtype", IN)
def test_kernel_matches_oracle(device, layout, group, dtype):
    for m, k in SHAPES:
        if k % group:
            continue
        x = _rand(m, k, dtype, device, seed=hash((m, k, group, str(dtype), layout)) & 0xFFFF)
        q, s, base, used = _run_poisoned(x, group, torch.float8_e4m3fn, layout)
        qr, sr = _expected(x, group, torch.float8_e4m3fn, layout)
        assert_bits_equal(q, qr, f"values {m}x{k}")
        assert_bits_equal(s.cpu(), sr, f"scales {m}x{k}")
        m4 = -(-m // 4) * 4
        assert s.stride() == {"row": (k // group, 1), "col": (1, m), "col_tma": (1, m4), "ue8m0": (1, m4)}[layout]
        guard = base[used:].cpu()
        assert bool((guard != guard).all()) if guard.dtype.is_floating_point else bool((guard == 0x7B7B7B7B).all())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("group", [64, 128])
def test_int8_and_pow2_fp32(device, group):
    x = _rand(33, 512, torch.bfloat16, device, seed=7)
    for out, pow2 in [(torch.int8, False), (torch.int8, True), (torch.float8_e4m3fn, True)]:
        q, s = T.per_token_group_quant(x, group, out, "row", pow2=pow2)
        qr, sr = R.per_token_group_quant_ref(x.cpu(), group, out, pow2=pow2)
        assert_bits_equal(q.cpu(), qr, f"{out} pow2={pow2}")
        assert_bits_equal(s.cpu(), sr, f"{out} pow2={pow2} scales")


@pytest.mark.parametrize("device", DEVICES)
def test_large_shapes_and_3d_input(device):
    # M not a multiple of 4, K=7168 (not a multiple of 512 groups of 4? 56 groups), batch dims.
    x = _rand(4097 if device == "cuda" else 259, 7168, torch.bfloat16, device, seed=3)
    for layout in ("col_tma", "ue8m0"):
        q, s = T.per_token_group_quant(x, 128, scale_layout=layout)
        qr, sr = _expected(x, 128, torch.float8_e4m3fn, layout)
        assert_bits_equal(q.cpu(), qr, layout)
        assert_bits_equal(s.cpu(), sr, layout)
    x3 = _rand(6, 384, torch.float16, device, seed=4).reshape(2, 3, 384)
    q, s = T.per_token_group_quant(x3, 128, scale_layout="ue8m0")
    qr, sr = _expected(x3.reshape(6, 384), 128, torch.float8_e4m3fn, "ue8m0")
    assert q.shape == x3.shape and s.shape == (6, 1)
    assert_bits_equal(q.reshape(6, 384).cpu(), qr)
    assert_bits_equal(s.cpu(), sr)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_strided_rows_take_the_tiled_kernel(device, layout):
    # rows with stride > K (a slice of a wider buffer) and non-contiguous q
    big = _rand(37, 1024, torch.bfloat16, device, seed=21)
    x = big[:, 128:640]
    q = poison_(torch.empty(37, 1024, dtype=torch.float8_e4m3fn, device=device))[:, :512]
    s = L.alloc_scales((), 37, 4, layout, device)
    T.per_token_group_quant_into(x, q, s, 128, layout)
    qr, sr = _expected(x, 128, torch.float8_e4m3fn, layout)
    assert_bits_equal(q.cpu(), qr)
    assert_bits_equal(s.cpu(), sr)


@pytest.mark.parametrize("device", DEVICES)
def test_k_not_multiple_of_four_groups_pads_with_zero_bytes(device):
    x = _rand(6, 5 * 128, torch.bfloat16, device, seed=5)  # 5 groups -> 2 words, 3 pad bytes
    q, s = T.per_token_group_quant(x, 128, scale_layout="ue8m0")
    assert s.shape == (6, 2) and s.stride() == (1, 8)
    hi = (s[:, 1].cpu().to(torch.int64) & 0xFFFFFF00)
    assert bool((hi == 0).all())
    storage = torch.as_strided(s, (16,), (1,)).cpu()  # whole storage: 2 words x 8 rows
    assert storage[6:8].tolist() == [0, 0] and storage[14:16].tolist() == [0, 0]


@pytest.mark.parametrize("device", DEVICES)
def test_nan_inf_behaviour(device):
    x = _rand(4, 256, torch.float32, device, seed=9)
    x[0, 3] = float("nan")
    x[1, 130] = float("inf")
    x[2, 10] = float("-inf")
    x[3, :128] = 0.0
    q, s = T.per_token_group_quant(x, 128)
    qr, sr = R.per_token_group_quant_ref(x.cpu(), 128)
    assert_bits_equal(q.cpu(), qr)
    assert_bits_equal(s.cpu(), sr)
    qf = q.float().cpu()
    assert torch.isnan(qf[0, 3]) and qf[1, 130] == 448 and qf[2, 10] == -448
    finite = x[0, :128].cpu()
    finite = finite[torch.isfinite(finite)]
    assert s[0, 0].item() == pytest.approx(finite.abs().max().item() / 448, rel=1e-6)  # scale from finite amax
    assert s[3, 0].item() == pytest.approx(1e-10 / 448) and bool((qf[3, :128] == 0).all())


def test_bad_input_names_the_argument():
    x = torch.randn(4, 256, dtype=torch.bfloat16)
    cases = [
        (lambda: T.per_token_group_quant(x.to(torch.int32), 128), TypeError, "x must be one of"),
        (lambda: T.per_token_group_quant(x, 96), ValueError, "group_size must be a power of two"),
        (lambda: T.per_token_group_quant(x[:, :192], 128), ValueError, "not divisible by group_size"),
        (lambda: T.per_token_group_quant(torch.randn(256, 8).t(), 128), ValueError, "contiguous in its last dimension"),
        (lambda: T.per_token_group_quant(x, 128, out_dtype=torch.float16), TypeError, "out_dtype"),
        (lambda: T.per_token_group_quant(x, 128, scale_layout="blocked"), ValueError, "scale_layout must be"),
        (lambda: T.per_token_group_quant(x, 128, torch.int8, "ue8m0"), ValueError, "ue8m0"),
        (lambda: T.per_token_group_quant(x, 128, backend="fast"), ValueError, "backend must be"),
    ]
    q = torch.empty(4, 256, dtype=torch.float8_e4m3fn)
    cases += [
        (lambda: T.per_token_group_quant_into(x, q, torch.empty(4, 3), 128), ValueError, "scales must have shape"),
        (lambda: T.per_token_group_quant_into(x, q, torch.empty(2, 4).t(), 128), ValueError,
         "scales must have strides"),
        (lambda: T.per_token_group_quant_into(x, q, torch.empty(4, 2, dtype=torch.float16), 128), TypeError,
         "scales must be torch.float32"),
        (lambda: T.per_token_group_quant_into(x.repeat(1, 4), q.repeat(1, 4), torch.empty(4, 2, dtype=torch.int32),
                                              128, "ue8m0"), ValueError, "scales must have strides"),
        (lambda: T.per_token_group_quant_into(x, q[:2], torch.empty(4, 2), 128), ValueError, "q must be"),
    ]
    for fn, exc, msg in cases:
        with pytest.raises(exc, match=msg):
            fn()


@pytest.mark.gpu
def test_tensors_on_different_devices():
    x = torch.randn(4, 256, device="cuda", dtype=torch.bfloat16)
    q = torch.empty(4, 256, dtype=torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="q is on cpu"):
        T.per_token_group_quant_into(x, q, torch.empty(4, 2, device="cuda"), 128)
    with pytest.raises(ValueError, match="scales is on cpu"):
        T.per_token_group_quant_into(x, q.cuda(), torch.empty(4, 2), 128)


def test_empty_rows_is_a_no_op_that_returns_shapes():
    q, s = T.per_token_group_quant(torch.randn(0, 256), 128, scale_layout="col_tma")
    assert q.shape == (0, 256) and s.shape == (0, 2)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", IN)
def test_nan_of_either_sign_becomes_canonical_fp8_nan(device, dtype):
    x = _rand(2, 256, dtype, device, seed=11)
    x[0, 1] = float("nan")
    x[1, 200] = -float("nan")
    bits_nan = {torch.bfloat16: 0xFFFF, torch.float16: 0xFE00}
    if dtype in bits_nan:  # a NaN with the sign bit set, as torch's fp32 -> bf16 makes
        x.view(torch.int16)[1, 200] = bits_nan[dtype] - 0x10000
    q, _ = T.per_token_group_quant(x, 128)
    qb = q.view(torch.uint8).cpu()
    assert qb[0, 1].item() == 0x7F and qb[1, 200].item() == 0x7F
    qr, _ = R.per_token_group_quant_ref(x, 128)
    assert_bits_equal(q.cpu(), qr)


def _boundary_rows():
    """fp32 rows whose quotients x / scale sit on and next to fp8 rounding boundaries.

    Row 0: amax 448 makes the scale exactly 1, so the quotient is x: fp8 midpoints (normal
    and subnormal) and their fp32 neighbours +-1..3 ulps. Rows 1-2: scale amax / 448 with a
    non-trivial amax; x = RN(midpoint * scale) +-k ulps, so the quotient lands within a few
    ulps of a midpoint on either side."""
    fp8 = torch.arange(0, 0x7F, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    mids = ((fp8[1:] + fp8[:-1]) / 2)[::4]  # every 4th midpoint, subnormal to 432
    rows = []
    for amax in (448.0, 448.0 * 1.3, 448.0 * 0.0071):
        scale = torch.tensor(amax, dtype=torch.float32) / 448.0
        base = (mids * scale).float()
        vals = [torch.tensor([amax])]
        for k in (-3, -1, 0, 1, 2):
            bits = base.view(torch.int32) + k
            vals.append(bits.view(torch.float32))
        row = torch.cat(vals)
        row = torch.cat([row, -row])[:256]
        rows.append(torch.nn.functional.pad(row, (0, 256 - row.numel()), value=amax / 7))
    return torch.stack(rows)


@pytest.mark.parametrize("device", DEVICES)
def test_quotients_at_fp8_rounding_boundaries_are_exact(device):
    x = _boundary_rows().to(device)
    qr, sr = R.per_token_group_quant_ref(x.cpu(), 256)
    q, s = T.per_token_group_quant(x, 256, scale_layout="row", backend="triton")
    assert_bits_equal(q, qr, "triton values")
    assert_bits_equal(s, sr, "triton scales")
    q3, _ = T.per_token_group_quant(x[None].expand(2, -1, -1), 256, scale_layout="row", backend="triton")
    assert_bits_equal(q3[1], qr, "tiled kernel values")
    if device == "cuda" and T._cuda_ext_available():
        qc, sc = T.per_token_group_quant(x, 256, scale_layout="row", backend="cuda")
        assert_bits_equal(qc, qr, "cuda ext values")
        assert_bits_equal(sc, sr, "cuda ext scales")
