"""UE8M0 scales: powers of two stored as their 8-bit FP32 exponent field.

The byte is the biased FP32 exponent of a power-of-two scale (127 = 1.0). Packing puts
four consecutive K-group bytes into one int32 (low byte = lowest group) in DeepGEMM's
SM100 layout (see layout.py "ue8m0"). DeepGEMM truncates non-power-of-two FP32 scales
when it packs them itself; here packing refuses them, and `ceil_pow2` rounds up.
"""

from __future__ import annotations

import torch

from rtp_fp8.quant.layout import alloc_scales, cdiv

_MANT = 0x7FFFFF


def _bits(x: torch.Tensor, name: str) -> torch.Tensor:
    if x.dtype != torch.float32:
        raise TypeError(f"{name} must be float32, got {x.dtype}")
    return x.contiguous().view(torch.int32)


def ceil_pow2(x: torch.Tensor) -> torch.Tensor:
    """Round positive FP32 values up to a power of two (exact, by the exponent bits)."""
    bits = _bits(x, "x")
    if not bool(torch.isfinite(x).all()) or bool((x <= 0).any()):
        raise ValueError("x must be finite and positive to round up to a power of two (0 has none)")
    exp = (bits >> 23) & 0xFF
    exp = exp + ((bits & _MANT) != 0).to(torch.int32)
    if bool((exp > 254).any()):
        raise ValueError("x rounds up past the largest FP32 power of two")
    return (exp << 23).view(torch.float32).reshape(x.shape)


def is_pow2(x: torch.Tensor) -> torch.Tensor:
    bits = _bits(x, "x")
    exp = (bits >> 23) & 0xFF
    return ((bits & _MANT) == 0) & (exp > 0) & (exp < 255) & (bits >= 0)


def exponent_bytes(x: torch.Tensor, name: str = "scales") -> torch.Tensor:
    """The UE8M0 byte (int32 0..255) of each power-of-two scale; others are refused."""
    if not bool(is_pow2(x).all()):
        raise ValueError(f"{name} must be positive powers of two to be stored as UE8M0 (round with ceil_pow2)")
    return (_bits(x, "x") >> 23).reshape(x.shape) & 0xFF


def pack(scales: torch.Tensor, name: str = "scales") -> torch.Tensor:
    """FP32 power-of-two scales [*batch, MN, G] -> packed int32 [*batch, MN, ceil(G/4)]."""
    if scales.dim() < 2:
        raise ValueError(f"{name} must be at least 2-D [MN, G], got shape {tuple(scales.shape)}")
    *batch, mn, g = scales.shape
    e = exponent_bytes(scales, name).to(torch.int64)
    pad = cdiv(g, 4) * 4 - g
    if pad:
        e = torch.nn.functional.pad(e, (0, pad))
    e = e.reshape(*batch, mn, cdiv(g, 4), 4)
    word = e[..., 0] | (e[..., 1] << 8) | (e[..., 2] << 16) | (e[..., 3] << 24)
    word = torch.where(word >= 2**31, word - 2**32, word).to(torch.int32)
    out = alloc_scales(tuple(batch), mn, g, "ue8m0", scales.device, zero=True)
    out.copy_(word)
    return out


def unpack(packed: torch.Tensor, num_groups: int, name: str = "packed") -> torch.Tensor:
    """Packed int32 [*batch, MN, ceil(G/4)] -> FP32 scales [*batch, MN, G] (contiguous)."""
    if packed.dtype != torch.int32:
        raise TypeError(f"{name} must be int32, got {packed.dtype}")
    if packed.dim() < 2 or packed.shape[-1] != cdiv(num_groups, 4):
        raise ValueError(f"{name} must have last dim ceil({num_groups}/4), got shape {tuple(packed.shape)}")
    w = packed.to(torch.int64) & 0xFFFFFFFF
    b = torch.stack([(w >> s) & 0xFF for s in (0, 8, 16, 24)], dim=-1)
    b = b.reshape(*packed.shape[:-1], -1)[..., :num_groups].to(torch.int32)
    if bool((b == 0).any()) or bool((b == 255).any()):
        raise ValueError(f"{name} holds a zero or 0xFF exponent byte inside the {num_groups} groups")
    return (b << 23).view(torch.float32).contiguous()


def broadcast_block_to_rows(block_scales: torch.Tensor, rows: int, block: int = 128) -> torch.Tensor:
    """128x128 block scales [*batch, ceil(N/128), KB] -> per-row scales [*batch, N, KB].

    SM100 consumes per-row (1x128) weight scales; broadcast before packing, once at load.
    """
    nb = block_scales.shape[-2]
    if cdiv(rows, block) != nb:
        raise ValueError(f"block_scales has {nb} row blocks, but rows={rows} needs {cdiv(rows, block)}")
    idx = torch.arange(rows, device=block_scales.device) // block
    return block_scales.index_select(-2, idx)
