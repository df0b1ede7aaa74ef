"""MoE executors (work in progress, issue #7).

ContiguousExecutor: quantize activations per token group -> EP scatter into the
contiguous (m-grouped) layout -> grouped FP8 GEMM gate_up -> SiLU(gate) * up, requantized
per token group -> grouped FP8 GEMM down -> weighted top-k gather. Every buffer is sized
from shapes only (workspace rows = routed + min(routed, E) * (A - 1), aligned up to A, A
the mk-alignment), so the forward has no host sync and no data-dependent shape.
Capacity and layout come from the same GPU counts (ep_layout). Scale formats follow the
Arch: FP32 (SM90) or packed UE8M0 (SM100/SM120).

Not yet: the masked executor, the strategy (executor/backend choice and rollback
switch), CUDA-graph capture tests on the GPU.
"""

from __future__ import annotations

import torch

from rtp_fp8 import arch as A
from rtp_fp8.gemm.triton import block_scaled as G
from rtp_fp8.moe import ep_kernels as K
from rtp_fp8.quant import activation_scale_layout, quantize_weight
from rtp_fp8.quant import layout as L
from rtp_fp8.quant import token_group as T


class ContiguousExecutor:
    def __init__(self, w_gate: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor, max_tokens: int, topk: int,
                 arch: A.Arch | None = None, alignment: int = 128, group: int = 128):
        """w_gate/w_up [E, I, H], w_down [E, H, I] (BF16), quantized once here for `arch`."""
        if w_gate.shape != w_up.shape or w_gate.dim() != 3:
            raise ValueError(f"w_gate and w_up must be [E, I, H] of one shape, got {tuple(w_gate.shape)}, "
                             f"{tuple(w_up.shape)}")
        e, i, h = w_gate.shape
        if tuple(w_down.shape) != (e, h, i):
            raise ValueError(f"w_down must be [E={e}, H={h}, I={i}], got {tuple(w_down.shape)}")
        if h % group or i % group:
            raise ValueError(f"hidden size {h} and intermediate size {i} must be multiples of the quant group {group}")
        self.arch = A.resolve(arch, w_gate.device)
        self.e, self.i, self.h, self.topk, self.group, self.alignment = e, i, h, topk, group, alignment
        self.w13 = quantize_weight(torch.cat([w_gate, w_up], dim=1), self.arch)
        self.w2 = quantize_weight(w_down, self.arch)
        self.layout = activation_scale_layout(self.arch)
        dev = w_gate.device
        self.cap = K.workspace_rows(max_tokens * topk, e, alignment)
        self.max_tokens = max_tokens
        self.a = torch.empty(self.cap, h, dtype=torch.float8_e4m3fn, device=dev)
        # zeroed once: padding rows never get scales, and garbage ones overflow in the GEMM
        self.a_scales = L.alloc_scales((), self.cap, h // group, self.layout, dev, zero=True)
        self.act_q = torch.empty(self.cap, i, dtype=torch.float8_e4m3fn, device=dev)
        self.act_s = L.alloc_scales((), self.cap, i // group, self.layout, dev, zero=True)
        self.counters = torch.zeros(2, dtype=torch.int32, device=dev)  # invalid ids, overflow (accumulated)

    def forward(self, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> torch.Tensor:
        t = x.shape[0]
        if t > self.max_tokens:
            raise ValueError(f"x has {t} tokens, more than max_tokens={self.max_tokens} the workspace was sized for")
        if tuple(topk_ids.shape) != (t, self.topk):
            raise ValueError(f"topk_ids must be [{t}, {self.topk}], got {tuple(topk_ids.shape)}")
        q, s = T.per_token_group_quant(x, self.group, scale_layout=self.layout)
        _, starts, m_indices, counters = K.ep_layout(topk_ids, self.e, self.cap, self.alignment)
        oidx = K.ep_scatter(q, s, topk_ids, starts, self.a, self.a_scales, counters)
        gate_up = G.m_grouped_fp8_gemm_nt_contiguous(self.a, self.a_scales, self.w13[0], self.w13[1], m_indices,
                                                     alignment=self.alignment)
        act = (torch.nn.functional.silu(gate_up[:, :self.i].float()) * gate_up[:, self.i:].float()).to(torch.bfloat16)
        T.per_token_group_quant_into(act, self.act_q, self.act_s, self.group, self.layout)
        down = G.m_grouped_fp8_gemm_nt_contiguous(self.act_q, self.act_s, self.w2[0], self.w2[1], m_indices,
                                                  alignment=self.alignment)
        self.counters += counters  # device-side accumulation: no host sync
        return K.ep_gather(down, topk_weights, oidx)

    __call__ = forward


def moe_reference(x, topk_ids, topk_weights, w_gate, w_up, w_down) -> torch.Tensor:
    """BF16 MoE oracle: float32 math on BF16 weights, invalid ids skipped."""
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    for e in range(w_gate.shape[0]):
        rows, slot = (topk_ids == e).nonzero(as_tuple=True)
        if rows.numel() == 0:
            continue
        xe = x[rows].float()
        act = torch.nn.functional.silu(xe @ w_gate[e].float().t()) * (xe @ w_up[e].float().t())
        y = act @ w_down[e].float().t()
        out.index_add_(0, rows, y * topk_weights[rows, slot, None].float())
    return out.to(torch.bfloat16)
