"""UE8M0 rounding, packing and layouts: exact, against byte-level oracles."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import DEVICES, assert_bits_equal
from rtp_fp8.quant import layout as L
from rtp_fp8.quant import reference as R
from rtp_fp8.quant import ue8m0


def _pow2(shape, seed, lo=-30, hi=30):
    g = torch.Generator().manual_seed(seed)
    return torch.exp2(torch.randint(lo, hi, shape, generator=g).float())


def test_ceil_pow2_matches_frexp_oracle():
    g = torch.Generator().manual_seed(1)
    x = torch.rand(100_000, generator=g) * torch.exp2(torch.randint(-100, 100, (100_000,), generator=g).float())
    x = torch.cat([x, torch.exp2(torch.arange(-126, 127).float()), torch.tensor([1.0000001, 0.9999999, 3.0])])
    x = x[x > 0]
    assert_bits_equal(ue8m0.ceil_pow2(x), R.pow2_ceil_ref(x))
    assert ue8m0.ceil_pow2(torch.tensor([1.0 + 2**-23])).item() == 2.0  # log2 would say 1.0


def test_ceil_pow2_rejects_bad_values():
    for bad in ([float("nan")], [float("inf")], [-1.0], [0.0], [-0.0]):
        with pytest.raises(ValueError, match="finite and positive"):
            ue8m0.ceil_pow2(torch.tensor(bad))
    with pytest.raises(TypeError, match="x must be float32"):
        ue8m0.ceil_pow2(torch.tensor([1.0], dtype=torch.float64))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mn,g", [(1, 1), (3, 4), (5, 7), (128, 56), (130, 9)])
def test_pack_matches_byte_oracle(device, mn, g):
    s = _pow2((mn, g), seed=mn * 100 + g).to(device)
    p = ue8m0.pack(s)
    want = R.pack_ue8m0_ref(s)
    m4 = -(-mn // 4) * 4
    assert p.shape == (mn, -(-g // 4)) and p.stride() == (1, m4) and p.dtype == torch.int32
    assert_bits_equal(p.cpu(), want)
    # the whole storage, padding rows and bytes included, equals the oracle's (zeros)
    whole = torch.as_strided(p, (m4 * p.shape[1],), (1,)).cpu()
    assert_bits_equal(whole, torch.as_strided(want, (m4 * p.shape[1],), (1,)))
    assert_bits_equal(ue8m0.unpack(p, g).cpu(), s.cpu())


def test_pack_3d_and_byte_order():
    s = torch.tensor([[[1.0, 2.0, 0.5, 4.0, 2.0**-10]]])  # [1, 1, 5]
    p = ue8m0.pack(s)
    assert p.shape == (1, 1, 2) and p.stride() == (8, 1, 4)
    w0 = int(p[0, 0, 0]) & 0xFFFFFFFF
    assert [(w0 >> (8 * i)) & 0xFF for i in range(4)] == [127, 128, 126, 129]
    assert int(p[0, 0, 1]) == 117
    s3 = _pow2((3, 6, 10), seed=3)
    assert_bits_equal(ue8m0.pack(s3), R.pack_ue8m0_ref(s3))
    assert ue8m0.pack(s3).stride() == R.pack_ue8m0_ref(s3).stride() == (24, 1, 8)


def test_pack_refuses_non_powers_of_two():
    with pytest.raises(ValueError, match="scales must be positive powers of two"):
        ue8m0.pack(torch.tensor([[1.5, 2.0]]))
    with pytest.raises(ValueError, match="at least 2-D"):
        ue8m0.pack(torch.tensor([1.0]))
    with pytest.raises(ValueError, match="last dim ceil"):
        ue8m0.unpack(torch.zeros(3, 2, dtype=torch.int32), 9)


@settings(max_examples=60, deadline=None)
@given(mn=st.integers(1, 40), g=st.integers(1, 20), batch=st.integers(0, 2), seed=st.integers(0, 2**16))
def test_pack_unpack_round_trip_property(mn, g, batch, seed):
    shape = ((batch,) if batch else ()) + (mn, g)
    s = _pow2(shape, seed, -126, 127)
    p = ue8m0.pack(s)
    assert_bits_equal(ue8m0.unpack(p, g), s)
    assert_bits_equal(p, R.pack_ue8m0_ref(s))


@settings(max_examples=60, deadline=None)
@given(mn=st.integers(1, 40), g=st.integers(1, 12), layout=st.sampled_from(["row", "col", "col_tma"]),
       seed=st.integers(0, 2**16))
def test_layout_round_trip_property(mn, g, layout, seed):
    s = torch.rand(mn, g, generator=torch.Generator().manual_seed(seed)) + 0.1
    t = L.to_layout(s, layout)
    L.check_scales(t, (), mn, g, layout)
    assert torch.equal(t, s)


def test_alloc_strides_are_exact():
    assert L.alloc_scales((), 5, 3, "row", "cpu").stride() == (3, 1)
    assert L.alloc_scales((), 5, 3, "col", "cpu").stride() == (1, 5)
    assert L.alloc_scales((), 5, 3, "col_tma", "cpu").stride() == (1, 8)
    u = L.alloc_scales((), 5, 9, "ue8m0", "cpu")
    assert u.shape == (5, 3) and u.stride() == (1, 8) and u.dtype == torch.int32
    assert L.alloc_scales((2, 3), 5, 3, "col_tma", "cpu").stride() == (72, 24, 1, 8)


def test_broadcast_block_scales_to_rows():
    s = torch.arange(1, 7, dtype=torch.float32).reshape(3, 2)
    rows = ue8m0.broadcast_block_to_rows(s, 300)
    assert rows.shape == (300, 2)
    assert rows[127].tolist() == [1, 2] and rows[128].tolist() == [3, 4] and rows[299].tolist() == [5, 6]
    with pytest.raises(ValueError, match="row blocks"):
        ue8m0.broadcast_block_to_rows(s, 500)
