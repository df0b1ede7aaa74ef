"""torch.library registrations of the public kernels (namespace `rtp_fp8`).

Each op has a fake (meta) implementation with the real output strides, so the ops work
under torch.compile and CUDA graph capture:

    torch.ops.rtp_fp8.per_token_group_quant(x, group_size, out_dtype, scale_layout, pow2, eps)
        -> (q, scales)
    torch.ops.rtp_fp8.per_token_group_quant_into(x, q, scales, group_size, scale_layout, pow2, eps)
        (writes q and scales in place; the CUDA extension registers the same schema)
"""

from __future__ import annotations

import torch

from rtp_fp8.quant import layout as L
from rtp_fp8.quant import token_group as T


@torch.library.custom_op("rtp_fp8::per_token_group_quant", mutates_args=())
def per_token_group_quant(x: torch.Tensor, group_size: int, out_dtype: torch.dtype, scale_layout: str,
                          pow2: bool, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    return T.per_token_group_quant(x, group_size, out_dtype, scale_layout, pow2, eps)


@per_token_group_quant.register_fake
def _(x, group_size, out_dtype, scale_layout, pow2, eps):
    T._validate(x, group_size, out_dtype, scale_layout)
    rows = x.numel() // x.shape[-1]
    g = x.shape[-1] // group_size
    q = torch.empty(x.shape, dtype=out_dtype, device=x.device)
    shape = (rows, L.scale_cols(g, scale_layout))
    dtype = torch.int32 if scale_layout == "ue8m0" else torch.float32
    s = torch.empty_strided(shape, L.scale_strides((), rows, g, scale_layout), dtype=dtype, device=x.device)
    return q, s


@torch.library.custom_op("rtp_fp8::per_token_group_quant_into", mutates_args=("q", "scales"))
def per_token_group_quant_into(x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor, group_size: int,
                               scale_layout: str, pow2: bool, eps: float) -> None:
    T.per_token_group_quant_into(x, q, scales, group_size, scale_layout, pow2, eps)


@per_token_group_quant_into.register_fake
def _(x, q, scales, group_size, scale_layout, pow2, eps):
    return None
