"""MoE expert-parallel scatter/gather kernels (Triton), graph-safe: no host sync, sizes
from shapes only.

    counts, starts, m_indices, counters = ep_layout(topk_ids, num_experts, capacity, alignment)
    output_index = ep_scatter(x, x_scales, topk_ids, starts, out, out_scales, counters)
    y = ep_gather(expert_out, topk_weights, output_index)

- counts: tokens per local expert; ids < 0 or >= E are ignored and counted
  (counters[0] += invalid ids).
- starts: each expert's first row in the contiguous layout, segments aligned to
  `alignment` (a power of two 1..256); m_indices[capacity] holds the expert id on real
  rows and -1 on padding and unused rows (phase 1, its own launches: no program reads
  another program's writes within a launch).
- scatter (phase 2): each valid (token, k) takes the next row of its expert's segment
  (atomic cursor: order within an expert is not deterministic), copies the token's row and
  its scales there and records output_index[token, k]; a row beyond `capacity` is not
  written, output_index = -1 and counters[1] += 1 (overflow). Nothing is written out of
  bounds.
- gather: y[t] = sum_k w[t, k] * expert_out[output_index[t, k]] in FP32 (rows with
  output_index -1 skipped), bf16 out.

Work in progress (issue #7): CPU-interpreter tested; not yet run on the GPU, no
deterministic mode, no executors.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from rtp_fp8 import triton_env  # noqa: F401  (interpreter cast fix)


@triton.jit
def _count_kernel(ids_ptr, counts_ptr, counters_ptr, n, E, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    ids = tl.load(ids_ptr + offs, mask=m, other=-1)
    valid = m & (ids >= 0) & (ids < E)
    tl.atomic_add(counts_ptr + tl.where(valid, ids, 0), tl.where(valid, 1, 0), mask=valid)
    tl.atomic_add(counters_ptr, tl.sum((m & ~valid).to(tl.int32), axis=0))


@triton.jit
def _starts_kernel(counts_ptr, starts_ptr, E, ALIGN: tl.constexpr, EB: tl.constexpr):
    e = tl.arange(0, EB)
    c = tl.load(counts_ptr + e, mask=e < E, other=0)
    aligned = (c + ALIGN - 1) // ALIGN * ALIGN
    incl = tl.cumsum(aligned, axis=0)
    tl.store(starts_ptr + e, incl - aligned, mask=e < E)


@triton.jit
def _m_indices_kernel(counts_ptr, starts_ptr, mi_ptr, cap, E, EB: tl.constexpr, BLOCK: tl.constexpr):
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    e = tl.arange(0, EB)
    emask = e < E
    starts = tl.load(starts_ptr + e, mask=emask, other=2147483647)
    counts = tl.load(counts_ptr + e, mask=emask, other=0)
    inside = (rows[:, None] >= starts[None, :]) & (rows[:, None] < starts[None, :] + counts[None, :])
    owner = tl.sum(tl.where(inside, e[None, :] + 1, 0), axis=1) - 1  # -1: padding or unused
    tl.store(mi_ptr + rows, owner, mask=rows < cap)


@triton.jit
def _scatter_kernel(x_ptr, xs_ptr, ids_ptr, starts_ptr, cursor_ptr, out_ptr, os_ptr, oidx_ptr, counters_ptr,
                    n_tokens, topk, E, cap, H, SK, stride_xm, stride_xsm, stride_xsk, stride_om, stride_osm,
                    stride_osk, BH: tl.constexpr, BS: tl.constexpr):
    pid = tl.program_id(0)  # one (token, k) pair per program
    t = pid // topk
    eid = tl.load(ids_ptr + pid)
    valid = (eid >= 0) & (eid < E)
    e = tl.where(valid, eid, 0)
    slot = tl.atomic_add(cursor_ptr + e, tl.where(valid, 1, 0))
    dest = tl.load(starts_ptr + e) + slot
    ok = valid & (dest < cap)
    tl.atomic_add(counters_ptr + 1, (valid & (dest >= cap)).to(tl.int32))
    tl.store(oidx_ptr + pid, tl.where(ok, dest, -1))
    dest = tl.where(ok, dest, 0)
    for h0 in range(0, H, BH):
        offs = h0 + tl.arange(0, BH)
        hm = (offs < H) & ok
        v = tl.load(x_ptr + t.to(tl.int64) * stride_xm + offs, mask=hm)
        tl.store(out_ptr + dest.to(tl.int64) * stride_om + offs, v, mask=hm)
    so = tl.arange(0, BS)
    sm = (so < SK) & ok
    s = tl.load(xs_ptr + t.to(tl.int64) * stride_xsm + so * stride_xsk, mask=sm)
    tl.store(os_ptr + dest.to(tl.int64) * stride_osm + so * stride_osk, s, mask=sm)


@triton.jit
def _gather_kernel(y_ptr, w_ptr, oidx_ptr, out_ptr, topk, H, stride_ym, stride_om, TOPK: tl.constexpr,
                   BH: tl.constexpr):
    t = tl.program_id(0)
    h0 = tl.program_id(1) * BH
    offs = h0 + tl.arange(0, BH)
    hm = offs < H
    acc = tl.zeros((BH,), dtype=tl.float32)
    for k in range(TOPK):
        idx = tl.load(oidx_ptr + t * topk + k)
        w = tl.load(w_ptr + t * topk + k).to(tl.float32)
        row = tl.load(y_ptr + tl.where(idx >= 0, idx, 0).to(tl.int64) * stride_ym + offs, mask=hm & (idx >= 0),
                      other=0.0)
        acc += tl.where(idx >= 0, w, 0.0) * row.to(tl.float32)
    tl.store(out_ptr + t.to(tl.int64) * stride_om + offs, acc.to(out_ptr.dtype.element_ty), mask=hm)


def workspace_rows(num_routed: int, num_experts: int, alignment: int) -> int:
    """Rows a contiguous layout can need, from shapes only (graph-safe sizing)."""
    return -(-(num_routed + min(num_routed, num_experts) * (alignment - 1)) // alignment) * alignment


def _check_ids(topk_ids):
    if not isinstance(topk_ids, torch.Tensor) or topk_ids.dtype not in (torch.int32, torch.int64):
        raise ValueError("topk_ids must be an int32 or int64 tensor")
    if topk_ids.dim() != 2:
        raise ValueError(f"topk_ids must be [tokens, topk], got shape {tuple(topk_ids.shape)}")


def ep_layout(topk_ids: torch.Tensor, num_experts: int, capacity: int, alignment: int = 128):
    """-> (counts [E], starts [E], m_indices [capacity], counters [2] int32: invalid ids, overflow)."""
    _check_ids(topk_ids)
    if not isinstance(alignment, int) or alignment < 1 or alignment > 256 or alignment & (alignment - 1):
        raise ValueError(f"alignment must be a power of two in [1, 256], got {alignment!r}")
    if num_experts < 1 or num_experts > 1024:
        raise ValueError(f"num_experts must be in [1, 1024], got {num_experts}")
    dev = topk_ids.device
    ids = topk_ids.to(torch.int32).contiguous().view(-1)
    counts = torch.zeros(num_experts, dtype=torch.int32, device=dev)
    starts = torch.empty(num_experts, dtype=torch.int32, device=dev)
    m_indices = torch.empty(capacity, dtype=torch.int32, device=dev)
    counters = torch.zeros(2, dtype=torch.int32, device=dev)
    n = ids.numel()
    if n:
        _count_kernel[(triton.cdiv(n, 1024),)](ids, counts, counters, n, num_experts, BLOCK=1024)
    eb = triton.next_power_of_2(num_experts)
    _starts_kernel[(1,)](counts, starts, num_experts, ALIGN=alignment, EB=eb)
    if capacity:
        _m_indices_kernel[(triton.cdiv(capacity, 128),)](counts, starts, m_indices, capacity, num_experts, EB=eb,
                                                         BLOCK=128)
    return counts, starts, m_indices, counters


def ep_scatter(x, x_scales, topk_ids, starts, out, out_scales, counters):
    """Copy routed rows (and their scales) into `out` / `out_scales`; -> output_index [T, topk]."""
    _check_ids(topk_ids)
    t, topk = topk_ids.shape
    if x.dim() != 2 or x.shape[0] != t:
        raise ValueError(f"x must be [tokens={t}, H], got shape {tuple(x.shape)}")
    if out.dim() != 2 or out.shape[1] != x.shape[1] or out.dtype != x.dtype:
        raise ValueError(f"out must be [capacity, {x.shape[1]}] of {x.dtype}")
    if x_scales.shape[0] != t or out_scales.shape[1:] != x_scales.shape[1:] or out_scales.shape[0] != out.shape[0]:
        raise ValueError("x_scales / out_scales must have one row per x / out row and the same scale columns")
    cursor = torch.zeros_like(starts)
    oidx = torch.empty(t, topk, dtype=torch.int32, device=x.device)
    ids = topk_ids.to(torch.int32).contiguous()
    h, sk = x.shape[1], x_scales.shape[1]
    if t * topk:
        _scatter_kernel[(t * topk,)](
            x, x_scales, ids, starts, cursor, out, out_scales, oidx, counters, t, topk, starts.numel(),
            out.shape[0], h, sk, x.stride(0), x_scales.stride(0), x_scales.stride(1), out.stride(0),
            out_scales.stride(0), out_scales.stride(1), BH=min(1024, triton.next_power_of_2(h)),
            BS=triton.next_power_of_2(max(sk, 1)),
        )
    return oidx


def ep_gather(expert_out, topk_weights, output_index, out=None):
    t, topk = output_index.shape
    h = expert_out.shape[1]
    if topk_weights.shape != (t, topk):
        raise ValueError(f"topk_weights must be [{t}, {topk}], got {tuple(topk_weights.shape)}")
    out = torch.empty(t, h, dtype=torch.bfloat16, device=expert_out.device) if out is None else out
    if t:
        bh = min(1024, triton.next_power_of_2(h))
        _gather_kernel[(t, triton.cdiv(h, bh))](expert_out, topk_weights.contiguous(), output_index.contiguous(),
                                                out, topk, h, expert_out.stride(0), out.stride(0), TOPK=topk, BH=bh)
    return out
