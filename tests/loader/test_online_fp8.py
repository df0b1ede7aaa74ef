"""Online FP8 loading: TP splits reassemble exactly, UE8M0 is packed after the split,
non-square weights, the 3-D legacy fallback, and clear errors."""

import logging

import pytest
import torch

from helpers import assert_bits_equal
from rtp_fp8 import arch as A
from rtp_fp8.loader import online_fp8 as LD
from rtp_fp8.quant import block as B
from rtp_fp8.quant import reference as R
from rtp_fp8.quant import ue8m0

ARCHS = [A.Arch(9, 0), A.Arch(10, 0), A.Arch(12, 0)]


def _w(shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * 0.05).to(torch.bfloat16)


def _rows_scales(fw, k):
    """Per-row FP32 scales of a loaded weight, whatever its format."""
    kb = -(-k // 128)
    if fw.scale_format == "ue8m0":
        return ue8m0.unpack(fw.scales, kb)
    return ue8m0.broadcast_block_to_rows(fw.scales, fw.q.shape[-2])


@pytest.mark.parametrize("arch", ARCHS, ids=str)
@pytest.mark.parametrize("shape", [(256, 512), (1152, 768), (512, 256)])
@pytest.mark.parametrize("split", ["column", "row"])
def test_tp_parts_reassemble_to_unsplit(arch, shape, split):
    w = _w(shape, seed=shape[0])
    full = LD.quantize_weight("w", w, arch)
    axis = -2 if split == "column" else -1
    for tp in (1, 2, 4):
        if shape[axis] // tp % 128:
            with pytest.raises(ValueError, match="w: tp="):
                LD.quantize_weight("w", w, arch, split, tp, 0)
            continue
        parts = [LD.quantize_weight("w", w, arch, split, tp, r) for r in range(tp)]
        assert_bits_equal(torch.cat([p.q for p in parts], axis), full.q, f"tp={tp} values")
        rows = torch.cat([_rows_scales(p, p.q.shape[-1]) for p in parts], axis)
        assert_bits_equal(rows, _rows_scales(full, shape[1]), f"tp={tp} scales")
        if arch.scale_format == "ue8m0":
            for r, p in enumerate(parts):  # packed after the split == pack of the split reference
                wr = w.narrow(axis, r * shape[axis] // tp, shape[axis] // tp)
                qr, sr = R.block_quant_ref(wr, pow2=True)
                assert p.path == "direct_ue8m0"
                assert_bits_equal(p.q, qr)
                assert_bits_equal(p.scales, R.pack_ue8m0_ref(ue8m0.broadcast_block_to_rows(sr, qr.shape[-2])))


def test_format_per_arch():
    w = _w((256, 384))
    assert LD.quantize_weight("w", w, A.Arch(9, 0)).scales.dtype == torch.float32
    for arch in (A.Arch(10, 0), A.Arch(12, 0)):
        fw = LD.quantize_weight("w", w, arch)
        assert fw.scales.dtype == torch.int32 and fw.scales.shape == (256, 1) and fw.path == "direct_ue8m0"


def test_3d_experts_take_the_logged_legacy_path(caplog):
    w = _w((4, 256, 384))
    LD._logged.clear()
    with caplog.at_level(logging.INFO, logger="rtp_fp8.loader.online_fp8"):
        fw = LD.quantize_weight("experts.w_up", w, A.Arch(10, 0), "column", 2, 1)
    assert "legacy UE8M0 path" in caplog.text and "3-D expert weights" in caplog.text
    assert fw.path == "legacy_ue8m0" and fw.q.shape == (4, 128, 384) and fw.scales.shape == (4, 128, 1)
    q32, s32 = B.quantize_weight_blocks(w)
    ql, sl = B.requant_ue8m0(q32, s32)
    assert_bits_equal(fw.q, ql[:, 128:])
    assert_bits_equal(fw.scales, B.pack_weight_scales_per_row(sl[:, 1:2], 128))


def test_checkpoint_round_trip_and_errors(tmp_path):
    from safetensors.torch import save_file

    tensors = {"a.w": _w((256, 256)), "norm": torch.ones(256, dtype=torch.bfloat16)}
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(FileNotFoundError, match="config.json not found"):
        LD.load_safetensors(tmp_path)
    (tmp_path / "config.json").write_text('{"architecture": "x"}')
    cfg, loaded = LD.load_safetensors(tmp_path)
    out = LD.quantize_checkpoint(loaded, {"a.w": "column"}, A.Arch(9, 0), tp=2, rank=1)
    assert isinstance(out["a.w"], LD.Fp8Weight) and out["a.w"].q.shape == (128, 256)
    assert torch.equal(out["norm"], tensors["norm"])
    with pytest.raises(KeyError, match="missing from the checkpoint"):
        LD.quantize_checkpoint(loaded, {"b.w": "row"}, A.Arch(9, 0))
    with pytest.raises(ValueError, match="split must be"):
        LD.quantize_weight("a.w", tensors["a.w"], A.Arch(9, 0), "diagonal")
