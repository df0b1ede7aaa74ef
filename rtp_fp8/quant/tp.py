"""Tensor-parallel split of FP8 block-quantized weights with their scales.

Weights are [*batch, N, K] with block scales [*batch, ceil(N/128), ceil(K/128)]. Rank r
of tp takes rows (dim="n", column-parallel) or columns (dim="k", row-parallel)
[r*size/tp, (r+1)*size/tp) and exactly the scale blocks covering them. A part size that
is not a multiple of the block would cut through a scale block: that raises, unless
`allow_requant_fallback=True`, which dequantizes, splits and requantizes the part (lossy;
warned). Packed UE8M0 scales are never split as words (a rank boundary can fall inside
an int32): split the FP32 scales, then pack (`split_then_pack`), or unpack first
(`split_packed`).
"""

from __future__ import annotations

import logging

import torch

from rtp_fp8.quant import block as B
from rtp_fp8.quant import ue8m0
from rtp_fp8.quant.layout import cdiv

log = logging.getLogger(__name__)


def _check(tp, rank, dim, size_n, size_k):
    if dim not in ("n", "k"):
        raise ValueError(f"dim must be 'n' or 'k', got {dim!r}")
    if not isinstance(tp, int) or tp < 1:
        raise ValueError(f"tp must be a positive int, got {tp!r}")
    if not isinstance(rank, int) or not 0 <= rank < tp:
        raise ValueError(f"rank must be in [0, {tp}), got {rank!r}")
    size = size_n if dim == "n" else size_k
    if size % tp:
        raise ValueError(f"{dim.upper()}={size} is not divisible by tp={tp}")
    return size // tp


def split_weight(q: torch.Tensor, scales: torch.Tensor, tp: int, rank: int, dim: str = "n", block: int = 128,
                 allow_requant_fallback: bool = False):
    """-> (q part, FP32 block scales part), contiguous."""
    if q.dtype != torch.float8_e4m3fn:
        raise TypeError(f"q must be torch.float8_e4m3fn, got {q.dtype}")
    if scales.dtype != torch.float32:
        raise TypeError(f"scales must be float32 block scales (unpack UE8M0 first), got {scales.dtype}")
    n, k = q.shape[-2:]
    if tuple(scales.shape) != (*q.shape[:-2], cdiv(n, block), cdiv(k, block)):
        raise ValueError(f"scales shape {tuple(scales.shape)} does not match q {tuple(q.shape)} with block {block}")
    part = _check(tp, rank, dim, n, k)
    axis = -2 if dim == "n" else -1
    lo = rank * part
    if part % block:
        if not allow_requant_fallback:
            raise ValueError(
                f"tp={tp} splits {dim.upper()}={n if dim == 'n' else k} into parts of {part}, not a multiple of the "
                f"{block} scale block: rank boundaries would cut scale blocks. Pad the weight, choose another tp, or "
                "pass allow_requant_fallback=True (dequantize, split, requantize; lossy)"
            )
        log.warning("tp split of %s=%d by %d is not %d-aligned: requantizing rank %d's part",
                    dim.upper(), n if dim == "n" else k, tp, block, rank)
        pow2 = bool(ue8m0.is_pow2(scales).all())
        w = B.dequantize_weight_blocks(q, scales, block).narrow(axis, lo, part)
        return B.quantize_weight_blocks(w, block, pow2=pow2)
    qp = q.narrow(axis, lo, part).contiguous()
    sp = scales.narrow(axis, lo // block, part // block).contiguous()
    return qp, sp


def split_then_pack(q, scales, tp, rank, dim="n", block=128):
    """Split with FP32 power-of-two block scales, then pack per-row UE8M0 for the part."""
    qp, sp = split_weight(q, scales, tp, rank, dim, block)
    return qp, B.pack_weight_scales_per_row(sp, qp.shape[-2], block)


def split_packed(q, packed, tp, rank, dim="n", block=128):
    """Split a weight whose per-row scales are already packed: unpack -> split -> repack."""
    n, k = q.shape[-2:]
    kb = cdiv(k, block)
    rows = ue8m0.unpack(packed, kb, "packed")  # [*batch, N, KB]
    if rows.shape[-2] != n:
        raise ValueError(f"packed has {rows.shape[-2]} rows, q has N={n}")
    part = _check(tp, rank, dim, n, k)
    if part % block:
        raise ValueError(f"tp={tp} part {part} of {dim.upper()} is not a multiple of the {block} block")
    lo = rank * part
    if dim == "n":
        qp = q.narrow(-2, lo, part).contiguous()
        rp = rows.narrow(-2, lo, part)
    else:
        qp = q.narrow(-1, lo, part).contiguous()
        rp = rows.narrow(-1, lo // block, part // block)
    return qp, ue8m0.pack(rp.contiguous(), "packed")
