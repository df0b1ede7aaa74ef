"""FP8 linear layer: weights quantized once at load, activations per call, backend by Arch.

    lin = FP8Linear(weight_bf16, bias=None, arch=None, backend=None)
    y = lin(x)                      # x [..., K] bf16/fp16/fp32 -> [..., N] bf16

Weights [N, K] are quantized for the Arch (FP32 128x128 block scales on SM90/CPU, packed
power-of-two per-row scales on SM100/SM120, rtp_fp8.quant.quantize_weight); each call
quantizes x per 1x128 token group in the layout the Arch's GEMMs read (the torch.library
op, CUDA extension or Triton) and runs the backend `rtp_fp8.gemm.backends.select` picked:
DeepGEMM where it serves the Arch and shape, else Triton. `backend=` or
RTP_FP8_GEMM_BACKEND overrides (deepgemm, triton, reference); a forced backend that
cannot run raises instead of silently falling back.
"""

from __future__ import annotations

import torch

from rtp_fp8 import arch as A
from rtp_fp8.gemm import backends as BK
from rtp_fp8.quant import activation_scale_layout, quantize_weight
from rtp_fp8.quant import token_group as T


class FP8Linear:
    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, arch: A.Arch | None = None,
                 backend: str | None = None, group: int = 128):
        if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
            raise ValueError(f"weight must be a 2-D [N, K] tensor, got {tuple(getattr(weight, 'shape', ()))}")
        if weight.dtype not in (torch.bfloat16, torch.float16, torch.float32):
            raise ValueError(f"weight must be bf16/fp16/fp32 (quantized here), got {weight.dtype}")
        n, k = weight.shape
        if k % group:
            raise ValueError(f"weight's K={k} must be a multiple of the activation group {group}")
        if bias is not None and (bias.shape != (n,) or bias.device != weight.device):
            raise ValueError(f"bias must be [{n}] on {weight.device}, got {tuple(bias.shape)} on {bias.device}")
        self.arch = A.resolve(arch, weight.device)
        self.n, self.k, self.group = n, k, group
        self.backend, self.reason = BK.select(self.arch, n, k, backend, device=weight.device)
        self._be = BK.get(self.backend, self.arch, weight.device)
        self.weight, self.weight_scales = quantize_weight(weight, self.arch)
        self.bias = None if bias is None else bias.to(torch.bfloat16)
        self.layout = activation_scale_layout(self.arch)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if not isinstance(x, torch.Tensor) or x.shape[-1] != self.k:
            raise ValueError(f"x must be [..., K={self.k}], got {tuple(getattr(x, 'shape', ()))}")
        if x.device != self.weight.device:
            raise ValueError(f"x is on {x.device}, the weight on {self.weight.device}")
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.k)
        a, sa = T.per_token_group_quant(x2, self.group, scale_layout=self.layout)
        y = self._be.gemm_nt(a, sa, self.weight, self.weight_scales)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*lead, self.n)
