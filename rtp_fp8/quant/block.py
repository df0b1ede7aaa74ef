"""128x128 block quantization of weights, and the two ways to get UE8M0 weights.

- `quantize_weight_blocks(w)`: [*batch, N, K] fp16/bf16/fp32 -> fp8 + FP32 (or power-of-
  two) scales [*batch, ceil(N/128), ceil(K/128)]; any shape (padded internally, outputs
  cropped), values clamped to +-448 before the cast.
- Legacy UE8M0: FP32 block quant, dequantize, requantize with power-of-two scales
  (`requant_ue8m0`), then pack per row.
- Direct UE8M0: quantize once with power-of-two scales, in 1024-row chunks (blocks never
  straddle a chunk, so chunked == unchunked bit for bit; extra memory is one chunk's
  temporaries), then pack per row (`quantize_weight_ue8m0_packed`).

Runs once at load time (plain torch ops, any device); the GEMM consumes the result.
"""

from __future__ import annotations

import torch

from rtp_fp8.quant import ue8m0
from rtp_fp8.quant.layout import cdiv, check_eps

FP8_MAX = 448.0
WEIGHT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _check_weight(w: torch.Tensor, name: str = "w") -> None:
    if not isinstance(w, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(w).__name__}")
    if w.device.type == "meta":
        raise ValueError(f"{name} is a meta tensor (no data): quantization needs a CPU or CUDA tensor")
    if w.dtype not in WEIGHT_DTYPES:
        raise TypeError(f"{name} must be one of {WEIGHT_DTYPES}, got {w.dtype}")
    if w.dim() < 2 or w.shape[-1] == 0 or w.shape[-2] == 0:
        raise ValueError(f"{name} must be [*batch, N, K] with N, K > 0, got shape {tuple(w.shape)}")


def _quant_rows(w: torch.Tensor, block: int, pow2: bool, eps: float):
    """[B, n, K] (n a multiple of block, or the last chunk) -> (fp8 [B, n, K], scales [B, ceil(n/b), ceil(K/b)])."""
    b, n, k = w.shape
    nb, kb = cdiv(n, block), cdiv(k, block)
    wp = torch.nn.functional.pad(w.float(), (0, kb * block - k, 0, nb * block - n))
    blocks = wp.view(b, nb, block, kb, block)
    ax = blocks.abs()
    amax = torch.where(torch.isfinite(ax), ax, torch.zeros_like(ax)).amax(dim=(2, 4))
    del ax
    # Divide in float64 and round once: torch divides a CUDA tensor by a Python scalar
    # through its (inexact) reciprocal, which would make GPU scales differ from CPU ones.
    scale = (amax.clamp(min=eps).double() / FP8_MAX).float()
    if pow2:
        scale = ue8m0.ceil_pow2(scale)
    # float64 division rounded once to fp32 = the correctly rounded fp32 quotient on any
    # device (a GPU's fp32 tensor division need not be), so CPU and GPU give equal bytes.
    y = (blocks.double() / scale[:, :, None, :, None].double()).float()
    q = y.clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    q = q.view(b, nb * block, kb * block)[:, :n, :k]
    return q, scale


def quantize_weight_blocks(w: torch.Tensor, block: int = 128, pow2: bool = False, eps: float = 1e-10,
                           chunk_rows: int | None = None):
    """-> (fp8 [*batch, N, K], fp32 scales [*batch, ceil(N/block), ceil(K/block)])."""
    _check_weight(w)
    if isinstance(block, bool) or not isinstance(block, int) or block <= 0 or block & (block - 1):
        raise ValueError(f"block must be a positive power of two, got {block!r}")
    check_eps(eps)
    if chunk_rows is not None and (isinstance(chunk_rows, bool) or not isinstance(chunk_rows, int) or chunk_rows <= 0
                                   or chunk_rows % block):
        raise ValueError(f"chunk_rows must be a positive multiple of block={block}, got {chunk_rows}")
    *batch, n, k = w.shape
    flat = w.reshape(-1, n, k)
    if chunk_rows is None or chunk_rows >= n:
        q, s = _quant_rows(flat, block, pow2, eps)
        return q.contiguous().reshape(w.shape), s.reshape(*batch, cdiv(n, block), cdiv(k, block))
    q = torch.empty(flat.shape, dtype=torch.float8_e4m3fn, device=w.device)
    s = torch.empty(flat.shape[0], cdiv(n, block), cdiv(k, block), dtype=torch.float32, device=w.device)
    for r0 in range(0, n, chunk_rows):
        qc, sc = _quant_rows(flat[:, r0:r0 + chunk_rows], block, pow2, eps)
        q[:, r0:r0 + chunk_rows] = qc
        s[:, r0 // block:r0 // block + sc.shape[1]] = sc
        del qc, sc
    return q.reshape(w.shape), s.reshape(*batch, cdiv(n, block), cdiv(k, block))


def dequantize_weight_blocks(q: torch.Tensor, scales: torch.Tensor, block: int = 128,
                             dtype: torch.dtype = torch.float32) -> torch.Tensor:
    n, k = q.shape[-2:]
    if scales.shape[-2:] != (cdiv(n, block), cdiv(k, block)) or scales.shape[:-2] != q.shape[:-2]:
        raise ValueError(f"scales shape {tuple(scales.shape)} does not match q {tuple(q.shape)} with block {block}")
    full = scales.repeat_interleave(block, -2).repeat_interleave(block, -1)[..., :n, :k]
    return (q.float() * full).to(dtype)


def pack_weight_scales_per_row(scales: torch.Tensor, n: int, block: int = 128) -> torch.Tensor:
    """Power-of-two block scales [*batch, ceil(N/128), KB] -> packed per-row int32 [*batch, N, ceil(KB/4)]."""
    return ue8m0.pack(ue8m0.broadcast_block_to_rows(scales, n, block), "scales")


def requant_ue8m0(q: torch.Tensor, scales: torch.Tensor, block: int = 128, chunk_rows: int = 1024):
    """Legacy path: FP8 + FP32 block scales -> FP8 + power-of-two block scales (lossy)."""
    w = dequantize_weight_blocks(q, scales, block)
    return quantize_weight_blocks(w, block, pow2=True, chunk_rows=chunk_rows)


def quantize_weight_ue8m0_packed(w: torch.Tensor, block: int = 128, chunk_rows: int = 1024):
    """Direct path: [*batch, N, K] -> (fp8, packed per-row UE8M0 scales [*batch, N, ceil(ceil(K/128)/4)])."""
    q, s = quantize_weight_blocks(w, block, pow2=True, chunk_rows=chunk_rows)
    return q, pack_weight_scales_per_row(s, w.shape[-2], block)
