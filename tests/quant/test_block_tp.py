"""Weight block quantization, the two UE8M0 paths, and tensor-parallel splits."""

import logging

import pytest
import torch

from helpers import DEVICES, assert_bits_equal, rel_l2
from rtp_fp8.quant import block as B
from rtp_fp8.quant import reference as R
from rtp_fp8.quant import tp as TP
from rtp_fp8.quant import ue8m0

SHAPES = [(256, 512), (1152, 768), (130, 200), (3, 200, 300)]


def _w(shape, dtype=torch.bfloat16, device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(shape, generator=g) * torch.exp2(torch.randint(-8, 4, shape[:-1] + (1,), generator=g).float())
    return w.to(dtype).to(device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("pow2", [False, True])
def test_block_quant_matches_oracle(device, shape, dtype, pow2):
    w = _w(shape, dtype, device, seed=len(shape) + shape[-1])
    q, s = B.quantize_weight_blocks(w, pow2=pow2)
    qr, sr = R.block_quant_ref(w.cpu(), pow2=pow2)
    assert_bits_equal(q.cpu(), qr, "values")
    assert_bits_equal(s.cpu(), sr, "scales")


@pytest.mark.parametrize("device", DEVICES)
def test_values_clamped_before_cast(device):
    w = _w((128, 128), torch.float32, device)
    w[0, 0] = float("inf")
    q, s = B.quantize_weight_blocks(w)
    assert q.float()[0, 0].item() == 448.0 and torch.isfinite(s).all()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", [(1152, 768), (2, 1100, 256)])
def test_chunked_direct_equals_unchunked(device, shape):
    w = _w(shape, device=device, seed=11)
    q0, s0 = B.quantize_weight_blocks(w, pow2=True)
    for chunk in (128, 256, 1024):
        q1, s1 = B.quantize_weight_blocks(w, pow2=True, chunk_rows=chunk)
        assert_bits_equal(q1.cpu(), q0.cpu(), f"chunk {chunk}")
        assert_bits_equal(s1.cpu(), s0.cpu(), f"chunk {chunk}")
    with pytest.raises(ValueError, match="chunk_rows must be a positive multiple"):
        B.quantize_weight_blocks(w, chunk_rows=100)


@pytest.mark.parametrize("device", DEVICES)
def test_direct_and_legacy_ue8m0_agree(device):
    w = _w((768, 768), torch.float32, device, seed=5)
    qd, pd = B.quantize_weight_ue8m0_packed(w)
    q32, s32 = B.quantize_weight_blocks(w)
    ql, sl = B.requant_ue8m0(q32, s32)
    pl = B.pack_weight_scales_per_row(sl, 768)
    assert pd.shape == pl.shape == (768, 2) and pd.stride() == pl.stride() == (1, 768)
    wd = B.dequantize_weight_blocks(qd, ue8m0.unpack(pd, 6)[::128].contiguous())
    wl = B.dequantize_weight_blocks(ql, sl)
    ed, el = rel_l2(wd, w), rel_l2(wl, w)
    assert ed < 0.05 and el < 0.06, (ed, el)  # FP8 e4m3: ~2-3% relative L2
    assert ed <= el * 1.02  # one rounding beats two
    assert rel_l2(wd, wl) < 0.06


@pytest.mark.parametrize("dim", ["n", "k"])
@pytest.mark.parametrize("tp", [1, 2, 4])
@pytest.mark.parametrize("shape", [(512, 1024), (2, 1024, 512)])
def test_tp_split_reassembles_exactly(dim, tp, shape):
    w = _w(shape, seed=tp)
    q, s = B.quantize_weight_blocks(w, pow2=True)
    parts = [TP.split_weight(q, s, tp, r, dim) for r in range(tp)]
    axis = -2 if dim == "n" else -1
    assert_bits_equal(torch.cat([p[0] for p in parts], axis), q)
    assert_bits_equal(torch.cat([p[1] for p in parts], axis), s)
    for r, (qp, sp) in enumerate(parts):
        # each part's scales are exactly what quantizing that slice of w gives
        wr = w.narrow(axis, r * w.shape[axis] // tp, w.shape[axis] // tp)
        qr, sr = R.block_quant_ref(wr, pow2=True)
        assert_bits_equal(qp, qr)
        assert_bits_equal(sp, sr)
        # pack after split == pack of the split reference
        qpp, packed = TP.split_then_pack(q, s, tp, r, dim)
        assert_bits_equal(packed, R.pack_ue8m0_ref(ue8m0.broadcast_block_to_rows(sr, qr.shape[-2])))
        # already-packed scales: unpack -> split -> repack gives the same
        full_packed = B.pack_weight_scales_per_row(s, q.shape[-2])
        qps, pps = TP.split_packed(q, full_packed, tp, r, dim)
        assert_bits_equal(pps, packed)
        assert_bits_equal(qps, qpp)


def test_tp_split_rejects_misaligned_and_falls_back_on_request(caplog):
    w = _w((384, 256))
    q, s = B.quantize_weight_blocks(w)
    with pytest.raises(ValueError, match="not a multiple of the 128 scale block"):
        TP.split_weight(q, s, 2, 0, "n")  # 192-row parts
    with pytest.raises(ValueError, match="not divisible by tp=5"):
        TP.split_weight(q, s, 5, 0, "n")
    with pytest.raises(ValueError, match="rank must be in"):
        TP.split_weight(q, s, 2, 2, "k")
    with pytest.raises(TypeError, match="scales must be float32"):
        TP.split_weight(q, B.pack_weight_scales_per_row(ue8m0.ceil_pow2(s), 384), 2, 0, "k")
    with caplog.at_level(logging.WARNING):
        qp, sp = TP.split_weight(q, s, 2, 1, "n", allow_requant_fallback=True)
    assert "not 128-aligned" in caplog.text
    assert qp.shape == (192, 256) and sp.shape == (2, 2)
    ref = B.dequantize_weight_blocks(q, s)[192:]
    assert rel_l2(B.dequantize_weight_blocks(qp, sp), ref) < 0.05


def test_weight_bad_input():
    with pytest.raises(TypeError, match="w must be one of"):
        B.quantize_weight_blocks(torch.zeros(4, 4, dtype=torch.int8))
    with pytest.raises(ValueError, match=r"w must be \[\*batch, N, K\]"):
        B.quantize_weight_blocks(torch.randn(8))
