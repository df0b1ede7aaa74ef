"""Plain-torch oracles for the quantizers, written independently of the fast paths.

They are slow and simple on purpose: per-block loops, frexp for powers of two, bytes
assembled with numpy for packing. Tests compare every kernel against them.
"""

from __future__ import annotations

import numpy as np
import torch

FP8_MAX = {torch.float8_e4m3fn: 448.0, torch.int8: 127.0}


def pow2_ceil_ref(x: torch.Tensor) -> torch.Tensor:
    m, e = torch.frexp(x.double())  # x = m * 2**e, m in [0.5, 1)
    e = torch.where(m == 0.5, e - 1, e)
    return torch.ldexp(torch.ones_like(x, dtype=torch.float64), e).float()


def _finite_amax(x: torch.Tensor, dims) -> torch.Tensor:
    ax = x.abs()
    return torch.where(torch.isfinite(ax), ax, torch.zeros_like(ax)).amax(dim=dims)


def quantize_with_scale_ref(x: torch.Tensor, scale: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """x / scale correctly rounded to fp32, clamp to the format max, cast (RNE; NaN: fp8 NaN, int8 0).

    Computed on the CPU in float64 (an fp32 quotient rounded from the float64 one is the
    correctly rounded fp32 quotient), so the oracle does not depend on a device's division.
    """
    qmax = FP8_MAX[out_dtype]
    y = (x.cpu().double() / scale.cpu().double()).float().clamp(-qmax, qmax)
    if out_dtype == torch.int8:
        return torch.nan_to_num(torch.round(y), nan=0.0).to(torch.int8)
    # canonical positive NaN (fp8 0x7F): a GPU's cast drops the sign of NaN
    return torch.where(torch.isnan(y), torch.full_like(y, float("nan")), y).to(out_dtype)


def per_token_group_quant_ref(x: torch.Tensor, group_size: int, out_dtype=torch.float8_e4m3fn,
                              pow2: bool = False, eps: float = 1e-10):
    """-> (q [..., K], scales fp32 [..., K/group]) row-major."""
    *lead, k = x.shape
    xf = x.cpu().float().reshape(*lead, k // group_size, group_size)
    amax = _finite_amax(xf, -1)
    scale = (amax.clamp(min=eps).double() / FP8_MAX[out_dtype]).float()
    if pow2:
        scale = pow2_ceil_ref(scale)
    q = quantize_with_scale_ref(xf, scale[..., None], out_dtype).reshape(*lead, k)
    return q, scale


def block_quant_ref(w: torch.Tensor, block: int = 128, pow2: bool = False, eps: float = 1e-10):
    """Weights [*batch, N, K] -> (fp8 [*batch, N, K], fp32 scales [*batch, ceil(N/b), ceil(K/b)]), block by block."""
    *batch, n, k = w.shape
    nb, kb = -(-n // block), -(-k // block)
    flat = w.cpu().reshape(-1, n, k)
    q = torch.empty(flat.shape, dtype=torch.float8_e4m3fn)
    s = torch.empty(flat.shape[0], nb, kb, dtype=torch.float32)
    for b in range(flat.shape[0]):
        for i in range(nb):
            for j in range(kb):
                blk = flat[b, i * block:(i + 1) * block, j * block:(j + 1) * block].float()
                sc = (_finite_amax(blk, (0, 1)).clamp(min=eps).double() / 448.0).float()
                if pow2:
                    sc = pow2_ceil_ref(sc)
                s[b, i, j] = sc
                q[b, i * block:(i + 1) * block, j * block:(j + 1) * block] = quantize_with_scale_ref(
                    blk, sc, torch.float8_e4m3fn)
    return q.reshape(w.shape), s.reshape(*batch, nb, kb)


def block_dequant_ref(q: torch.Tensor, s: torch.Tensor, block: int = 128) -> torch.Tensor:
    n, k = q.shape[-2:]
    full = s.repeat_interleave(block, -2).repeat_interleave(block, -1)[..., :n, :k]
    return q.float() * full


def group_dequant_ref(q: torch.Tensor, s: torch.Tensor, group_size: int) -> torch.Tensor:
    return q.float() * s.repeat_interleave(group_size, -1)


def pack_ue8m0_ref(scales: torch.Tensor) -> torch.Tensor:
    """Byte-level oracle of DeepGEMM's packed layout (independent of ue8m0.pack)."""
    *batch, mn, g = scales.shape
    s = scales.reshape(-1, mn, g).cpu().numpy().astype(np.float32)
    nbat = s.shape[0]
    words = -(-g // 4)
    mn_al = -(-mn // 4) * 4
    raw = np.zeros((nbat, words, mn_al, 4), dtype=np.uint8)  # storage order: [batch, word, row, byte]
    for b in range(nbat):
        for r in range(mn):
            for gi in range(g):
                m, e = np.frexp(s[b, r, gi])
                assert m == 0.5, "oracle needs powers of two"
                raw[b, gi // 4, r, gi % 4] = (int(e) - 1) + 127
    flat = torch.from_numpy(raw.reshape(-1).view("<i4").copy())
    strides, acc = [], words * mn_al
    for d in reversed(batch):
        strides.insert(0, acc)
        acc *= d
    return torch.as_strided(flat, (*batch, mn, words), (*strides, 1, mn_al))
