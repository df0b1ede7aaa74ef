"""FP8 quantization: block weights, per-token-group activations, UE8M0 scales, layouts.

The arch-dependent entry points pick the scale format DeepGEMM expects on that arch:
SM90 -> FP32 scales (activations MN-major TMA-aligned, weights 128x128 blocks);
SM100/SM120 -> packed UE8M0 (activations and per-row weight scales).
"""

from __future__ import annotations

import torch

from rtp_fp8 import arch as A


def activation_scale_layout(arch: A.Arch | None = None) -> str:
    arch = A.resolve(arch)
    return "ue8m0" if arch.scale_format == "ue8m0" else "col_tma"


def quantize_activation(x: torch.Tensor, group_size: int = 128, arch: A.Arch | None = None,
                        backend: str | None = None):
    """x [..., K] -> (fp8, scales in the layout `arch`'s GEMM consumes)."""
    from rtp_fp8.quant.token_group import per_token_group_quant

    arch = A.resolve(arch, x.device if isinstance(x, torch.Tensor) else None)
    return per_token_group_quant(x, group_size, scale_layout=activation_scale_layout(arch), backend=backend)


def quantize_weight(w: torch.Tensor, arch: A.Arch | None = None, block: int = 128, chunk_rows: int = 1024):
    """Weights [*batch, N, K] -> (fp8, scales) for `arch`.

    SM90/CPU: FP32 block scales [*batch, ceil(N/128), ceil(K/128)].
    SM100/SM120: power-of-two scales straight from the weights (direct path), broadcast
    to rows and packed: int32 [*batch, N, ceil(ceil(K/128)/4)].
    """
    from rtp_fp8.quant import block as B

    arch = A.resolve(arch, w.device if isinstance(w, torch.Tensor) else None)
    if arch.direct_ue8m0_weights:
        return B.quantize_weight_ue8m0_packed(w, block, chunk_rows)
    return B.quantize_weight_blocks(w, block, chunk_rows=chunk_rows)
