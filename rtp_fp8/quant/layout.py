"""Scale layouts and their validation.

An activation scale tensor has logical shape [*batch, MN, G] (G = K / group) and one of:

- "row":     row-major, strides (G, 1)
- "col":     MN-major, strides (1, MN)
- "col_tma": MN-major and TMA-aligned, strides (1, align(MN, 4)) (DeepGEMM SM90 A operand)
- "ue8m0":   int32 [*batch, MN, ceil(G/4)], four exponent bytes per word (low byte = lowest
             group), strides (1, align(MN, 4)), padding bytes zero (DeepGEMM SM100)

Batch dims are outermost; the batch stride is the size of one padded matrix.
"""

from __future__ import annotations

import math

import torch

LAYOUTS = ("row", "col", "col_tma", "ue8m0")
FP32_LAYOUTS = ("row", "col", "col_tma")


def align(x: int, a: int) -> int:
    return (x + a - 1) // a * a


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def check_layout_name(layout: str, name: str = "scale_layout") -> str:
    if layout not in LAYOUTS:
        raise ValueError(f"{name} must be one of {LAYOUTS}, got {layout!r}")
    return layout


def scale_cols(num_groups: int, layout: str) -> int:
    return cdiv(num_groups, 4) if layout == "ue8m0" else num_groups


def scale_strides(batch: tuple[int, ...], mn: int, num_groups: int, layout: str) -> tuple[int, ...]:
    cols = scale_cols(num_groups, layout)
    if layout == "row":
        inner = (cols, 1)
        mat = mn * cols
    else:
        lead = mn if layout == "col" else align(mn, 4)
        inner = (1, lead)
        mat = lead * cols
    strides = []
    acc = mat
    for b in reversed(batch):
        strides.append(acc)
        acc *= b
    return tuple(reversed(strides)) + inner


def alloc_scales(batch: tuple[int, ...], mn: int, num_groups: int, layout: str,
                 device: torch.device | str, zero: bool = False) -> torch.Tensor:
    """A scale tensor of `layout`; padding (TMA rows, UE8M0 bytes) is zero when `zero`."""
    check_layout_name(layout)
    cols = scale_cols(num_groups, layout)
    dtype = torch.int32 if layout == "ue8m0" else torch.float32
    strides = scale_strides(batch, mn, num_groups, layout)
    size = (math.prod(batch) if batch else 1) * (strides[-2] * mn if layout == "row" else strides[-1] * cols)
    storage = (torch.zeros if zero or layout == "ue8m0" else torch.empty)(max(size, 1), dtype=dtype, device=device)
    return torch.as_strided(storage, (*batch, mn, cols), strides)


def zero_row_padding(scales: torch.Tensor, mn: int) -> None:
    """Zero the padding words of a 2-D 'ue8m0' tensor [MN, C] (rows MN..align(MN, 4) of each column):
    layout.py promises them zero, and a caller's reused buffer may hold anything. Graph-safe."""
    pad = align(mn, 4) - mn
    if pad and scales.shape[-1]:
        torch.as_strided(scales, (pad, scales.shape[-1]), (1, scales.stride(-1)),
                         scales.storage_offset() + mn).zero_()


def check_eps(eps, name: str = "eps") -> float:
    """A finite positive float (the smallest amax a scale is computed from), else ValueError."""
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not math.isfinite(eps) or eps <= 0:
        raise ValueError(f"{name} must be a finite positive number, got {eps!r}")
    return float(eps)


def check_scales(scales: torch.Tensor, batch: tuple[int, ...], mn: int, num_groups: int, layout: str,
                 name: str = "scales", device: torch.device | None = None) -> None:
    """ValueError/TypeError naming `name` unless `scales` is exactly `layout` for this shape."""
    if not isinstance(scales, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(scales).__name__}")
    want_dtype = torch.int32 if layout == "ue8m0" else torch.float32
    if scales.dtype != want_dtype:
        raise TypeError(f"{name} must be {want_dtype} for scale layout {layout!r}, got {scales.dtype}")
    shape = (*batch, mn, scale_cols(num_groups, layout))
    if tuple(scales.shape) != shape:
        raise ValueError(f"{name} must have shape {shape} for scale layout {layout!r}, got {tuple(scales.shape)}")
    want = scale_strides(batch, mn, num_groups, layout)
    got = scales.stride()
    # Strides of size-1 dims carry no meaning.
    if any(s != w and d > 1 for s, w, d in zip(got, want, shape)):
        raise ValueError(f"{name} must have strides {want} for scale layout {layout!r}, got {got}")
    if device is not None and scales.device != device:
        raise ValueError(f"{name} is on {scales.device}, expected {device} (same device as the input)")


def to_layout(scales: torch.Tensor, layout: str) -> torch.Tensor:
    """Copy FP32 scales [*batch, MN, G] (any strides) into `layout` (ue8m0: packed)."""
    from rtp_fp8.quant import ue8m0

    check_layout_name(layout, "layout")
    if scales.dtype != torch.float32:
        raise TypeError(f"scales must be float32 to convert layouts, got {scales.dtype}")
    if layout == "ue8m0":
        return ue8m0.pack(scales)
    *batch, mn, g = scales.shape
    out = alloc_scales(tuple(batch), mn, g, layout, scales.device)
    out.copy_(scales)
    return out
