"""Oracle for the FP8 GEMMs: dequantize both operands exactly, multiply in float64.

A [M, K] fp8 with 1x128 scales (FP32 [M, ceil(K/128)] or packed UE8M0), B [N, K] fp8 with
128x128 block scales (FP32 [ceil(N/128), ceil(K/128)]), per-row FP32 scales
[N, ceil(K/128)], or packed per-row UE8M0. D = A @ B^T.
"""

from __future__ import annotations

import torch

from rtp_fp8.quant import ue8m0
from rtp_fp8.quant.layout import cdiv


def dequant_a(a: torch.Tensor, sa: torch.Tensor, gran: int = 128) -> torch.Tensor:
    k = a.shape[-1]
    kg = cdiv(k, gran)
    s = ue8m0.unpack(sa.cpu(), kg) if sa.dtype == torch.int32 else sa.cpu().float()
    full = s.repeat_interleave(gran, -1)[..., :k]
    return a.cpu().double() * full.double()


def dequant_b(b: torch.Tensor, sb: torch.Tensor, gran: int = 128) -> torch.Tensor:
    n, k = b.shape[-2:]
    kg = cdiv(k, gran)
    if sb.dtype == torch.int32:
        s = ue8m0.unpack(sb.cpu(), kg)
    else:
        s = sb.cpu().float()
    if s.shape[-2] != n:  # block scales: broadcast 128 rows
        s = s.repeat_interleave(gran, -2)[..., :n, :]
    full = s.repeat_interleave(gran, -1)[..., :k]
    return b.cpu().double() * full.double()


def gemm_nt_ref(a, sa, b, sb) -> torch.Tensor:
    return dequant_a(a, sa) @ dequant_b(b, sb).transpose(-1, -2)


def grouped_contiguous_ref(a, sa, b, sb, m_indices) -> torch.Tensor:
    """Rows of expert e use b[e]; -1 (and out-of-range) rows are zero. bf16 [M, N]."""
    ids = m_indices.cpu().long()
    out = torch.zeros(a.shape[0], b.shape[1], dtype=torch.float64)
    for e in range(b.shape[0]):
        rows = (ids == e).nonzero().ravel()
        if rows.numel():
            out[rows] = gemm_nt_ref(a.cpu()[rows], sa.cpu()[rows], b[e], sb[e])
    return out.to(torch.bfloat16)


def grouped_masked_ref(a, sa, b, sb, masked_m) -> torch.Tensor:
    """[E, Mmax, N] bf16; rows past masked_m[e] are zero here (unspecified in the backends' contract)."""
    e_, mmax = a.shape[:2]
    out = torch.zeros(e_, mmax, b.shape[1], dtype=torch.float64)
    for e, mm in enumerate(masked_m.cpu().tolist()):
        if mm:
            out[e, :mm] = gemm_nt_ref(a[e, :mm], sa[e, :mm], b[e], sb[e])
    return out.to(torch.bfloat16)
