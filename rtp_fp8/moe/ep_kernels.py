"""MoE expert-parallel scatter/gather kernels (Triton), graph-safe: no host sync, sizes
from shapes only.

    counts, starts, m_indices, counters = ep_layout(topk_ids, E, capacity, alignment)      # contiguous
    counts, starts, masked_m, counters = ep_masked_layout(topk_ids, E, max_m)             # masked
    output_index = ep_scatter(x, x_scales, topk_ids, starts, out, out_scales, counters)
    layout, output_index = ep_dispatch(x, x_scales, topk_ids, E, out, out_scales, alignment)  # both, fused
    y = ep_gather(expert_out, topk_weights, output_index)

Expert ids are global; this rank owns experts [expert_offset, expert_offset + E). An id of
another rank (inside [0, num_global_experts)) is skipped silently: it is routed elsewhere.
An id < 0 or >= num_global_experts is skipped and counted (counters[0] += 1).
- counts: tokens per local expert. starts: each expert's first row; contiguous segments are
  aligned to `alignment` (a power of two 1..256) and m_indices[capacity] holds the expert
  id on real rows and -1 on padding and unused rows. Masked: expert e owns rows
  [e * max_m, (e + 1) * max_m) and masked_m = min(counts, max_m). Each phase is its own
  launch: no program reads another program's writes within one launch. ep_dispatch (the
  contiguous executor's call) derives the plan inside the scatter and scale launches instead
  of a launch of its own where the scales take the row-map path.
- scatter: each local (token, k) takes the next row of its expert's segment, copies the
  token's row and its scale row there (any scale layout: FP32 row- or column-major, or
  packed UE8M0 int32, addressed by strides) and records output_index[token, k]. A row past
  the segment's end (masked: max_m) or past `out`'s capacity is not written: output_index
  = -1 and counters[1] += 1 (overflow). Nothing is written out of bounds. Order within an
  expert follows atomics by default; `deterministic=True` keeps token order (a per-block
  histogram, its exclusive prefix over blocks, and in-block ranks: no atomics decide rows).
- gather: y[t] = sum_k w[t, k] * expert_out[output_index[t, k]] in FP32 (rows with
  output_index -1 skipped), bf16 out.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from rtp_fp8 import triton_env  # noqa: F401  (interpreter cast fix)


@triton.jit
def _local(ids, E_OFF, E, NG):
    """-> (local expert id or 0 (int32), is local, is invalid) for global ids, int32 or int64 (compared
    at their own width: an int64 id past int32 is never wrapped onto a valid one)."""
    loc = ids - E_OFF
    is_local = (loc >= 0) & (loc < E)
    invalid = (ids < 0) | (ids >= NG)
    return tl.where(is_local, loc, 0).to(tl.int32), is_local, invalid


@triton.jit
def _block_counts(loc, ok, e):
    """[EB] ids per local expert e among this block's ids (loc where ok), summed in registers."""
    return tl.sum(((loc[:, None] == e[None, :]) & ok[:, None]).to(tl.int32), axis=0)


@triton.jit
def _count_kernel(ids_ptr, counts_ptr, counters_ptr, n, E, E_OFF, NG, BLOCK: tl.constexpr, EB: tl.constexpr,
                  HIST: tl.constexpr):
    """counts[e] += local ids == e. HIST: the block's counts are summed in registers first
    (one atomic per expert per program instead of one per id: with few experts, thousands of
    same-address atomics serialize)."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    ids = tl.load(ids_ptr + offs, mask=m, other=0)
    loc, is_local, invalid = _local(ids, E_OFF, E, NG)
    if HIST:
        e = tl.arange(0, EB)
        tl.atomic_add(counts_ptr + e, _block_counts(loc, is_local & m, e), mask=e < E, sem="relaxed")
    else:
        tl.atomic_add(counts_ptr + loc, tl.where(is_local & m, 1, 0), mask=is_local & m, sem="relaxed")
    tl.atomic_add(counters_ptr, tl.sum((m & invalid).to(tl.int32), axis=0), sem="relaxed")


@triton.jit
def _aligned_starts(counts_ptr, E, ALIGN: tl.constexpr, EB: tl.constexpr):
    """-> (e [EB], e < E, counts, starts): each expert's segment start, segments aligned to ALIGN,
    from the counts a previous launch wrote."""
    e = tl.arange(0, EB)
    emask = e < E
    counts = tl.load(counts_ptr + e, mask=emask, other=0)
    aligned = (counts + ALIGN - 1) // ALIGN * ALIGN
    return e, emask, counts, tl.cumsum(aligned, axis=0) - aligned


@triton.jit
def _row_owner(rows, e, emask, counts, starts):
    """m_indices of rows: the expert whose segment's real rows hold it, else -1."""
    st = tl.where(emask, starts, 2147483647)
    inside = (rows[:, None] >= st[None, :]) & (rows[:, None] < st[None, :] + counts[None, :])
    return tl.sum(tl.where(inside, e[None, :] + 1, 0), axis=1) - 1


@triton.jit
def _plan_kernel(counts_ptr, starts_ptr, ends_ptr, cursor_ptr, mi_ptr, cap, E, ALIGN: tl.constexpr,
                 EB: tl.constexpr, BLOCK: tl.constexpr):
    """Contiguous plan: every program derives the aligned starts from the counts (written by the
    previous launch) itself; program 0 stores starts, ends (start + count: the segment's real
    rows, so a scatter that reuses a spent cursor overflows, counted, instead of filling padding
    rows) and zeroes the scatter cursor; each program writes its block of m_indices (expert id
    on real rows, -1 on padding and unused rows)."""
    pid = tl.program_id(0)
    e, emask, counts, starts = _aligned_starts(counts_ptr, E, ALIGN, EB)
    if pid == 0:
        tl.store(starts_ptr + e, starts, mask=emask)
        tl.store(ends_ptr + e, starts + counts, mask=emask)
        tl.store(cursor_ptr + e, tl.zeros((EB,), dtype=tl.int32), mask=emask)
    rows = pid * BLOCK + tl.arange(0, BLOCK)
    tl.store(mi_ptr + rows, _row_owner(rows, e, emask, counts, starts), mask=rows < cap)


@triton.jit
def _store_masked_plan(counts, e, emask, starts_ptr, ends_ptr, masked_ptr, cursor_ptr, MAX_M):
    """Masked layout: expert e owns rows [e * MAX_M, (e + 1) * MAX_M); masked_m = min(count, MAX_M)."""
    tl.store(starts_ptr + e, e * MAX_M, mask=emask)
    tl.store(ends_ptr + e, e * MAX_M + MAX_M, mask=emask)
    tl.store(masked_ptr + e, tl.minimum(counts, MAX_M), mask=emask)
    tl.store(cursor_ptr + e, tl.zeros_like(counts), mask=emask)


@triton.jit
def _small_masked_layout_kernel(ids_ptr, counts_ptr, starts_ptr, cursor_ptr, ends_ptr, masked_ptr, counters_ptr, n,
                                E, E_OFF, NG, MAX_M, EB: tl.constexpr, BLOCK: tl.constexpr):
    """Small batches, one program: count by compare-and-sum (no atomics, nothing to zero
    first), then the whole masked plan."""
    e = tl.arange(0, EB)
    emask = e < E
    counts = tl.zeros((EB,), dtype=tl.int32)
    invalid = tl.zeros((BLOCK,), dtype=tl.int32)
    for i0 in range(0, n, BLOCK):
        offs = i0 + tl.arange(0, BLOCK)
        m = offs < n
        loc, is_local, bad = _local(tl.load(ids_ptr + offs, mask=m, other=0), E_OFF, E, NG)
        counts += _block_counts(loc, is_local & m, e)
        invalid += (bad & m).to(tl.int32)
    tl.atomic_add(counters_ptr, tl.sum(invalid, axis=0))
    tl.store(counts_ptr + e, counts, mask=emask)
    _store_masked_plan(counts, e, emask, starts_ptr, ends_ptr, masked_ptr, cursor_ptr, MAX_M)


@triton.jit
def _masked_plan_kernel(counts_ptr, starts_ptr, ends_ptr, masked_ptr, cursor_ptr, E, MAX_M, EB: tl.constexpr):
    e = tl.arange(0, EB)
    emask = e < E
    counts = tl.load(counts_ptr + e, mask=emask, other=0)
    _store_masked_plan(counts, e, emask, starts_ptr, ends_ptr, masked_ptr, cursor_ptr, MAX_M)


@triton.jit
def _block_hist_kernel(ids_ptr, hist_ptr, n, E, E_OFF, BLOCK: tl.constexpr):
    """hist[b, e] = local ids == e in block b (atomics into this program's own row only)."""
    b = tl.program_id(0)
    offs = b * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    loc, is_local, _ = _local(tl.load(ids_ptr + offs, mask=m, other=-1), E_OFF, E, 2147483647)
    tl.atomic_add(hist_ptr + b * E + loc, tl.where(is_local & m, 1, 0), mask=is_local & m, sem="relaxed")


@triton.jit
def _det_rank_kernel(ids_ptr, base_ptr, rank_ptr, n, E, E_OFF, BLOCK: tl.constexpr):
    """rank[i] = pairs before i with the same local expert: base[b, e] (earlier blocks) + in-block rank."""
    b = tl.program_id(0)
    i = tl.arange(0, BLOCK)
    offs = b * BLOCK + i
    m = offs < n
    loc, is_local, _ = _local(tl.load(ids_ptr + offs, mask=m, other=-1), E_OFF, E, 2147483647)
    key = tl.where(is_local & m, loc, -1)
    before = (key[:, None] == key[None, :]) & (i[None, :] < i[:, None])
    rank = tl.sum(before.to(tl.int32), axis=1) + tl.load(base_ptr + b * E + loc, mask=is_local & m, other=0)
    tl.store(rank_ptr + offs, rank, mask=m)


@triton.jit
def _scatter_kernel(x_ptr, xs_ptr, ids_ptr, rank_ptr, starts_ptr, ends_ptr, cursor_ptr, out_ptr, os_ptr, ts_ptr,
                    oidx_ptr, counters_ptr, E, E_OFF, cap, H, SK, stride_xm, stride_xsm, stride_xsk, stride_om,
                    stride_osm, stride_osk, TOPK: tl.constexpr, KB: tl.constexpr, DET: tl.constexpr,
                    HAS_ENDS: tl.constexpr, BH: tl.constexpr, BS: tl.constexpr, ROW_MAP: tl.constexpr,
                    STORE_CM: tl.constexpr = "", PLAN_ALIGN: tl.constexpr = 0, EB: tl.constexpr = 1):
    """ROW_MAP: os_ptr is an int32 row map [cap]: each written row gets its token's index, and
    the token's scale row goes once into ts_ptr [T, BS] (row-major, BS-aligned rows); the scales
    follow in _scales_by_row_kernel. Otherwise each written row gets its scale row.
    PLAN_ALIGN > 0 (ep_dispatch): starts_ptr holds the counts; each program derives the
    segment starts from them (aligned to PLAN_ALIGN) instead of reading a plan launch's."""
    t = tl.program_id(0)  # one token per program: its row is read once, written to each of its experts
    k = tl.arange(0, KB)
    km = k < TOPK
    loc, is_local, _ = _local(tl.load(ids_ptr + t * TOPK + k, mask=km, other=-1), E_OFF, E, 2147483647)
    is_local = is_local & km
    if tl.sum(is_local.to(tl.int32), axis=0) == 0:
        tl.store(oidx_ptr + t * TOPK + k, tl.full((KB,), -1, tl.int32), mask=km)
    else:
        # The row (its first BH bytes: all of it when H <= BH) and its scales are loaded before
        # the slot atomics, whose latency they overlap (relaxed atomics do not order them).
        src = x_ptr + t.to(tl.int64) * stride_xm
        offs = tl.arange(0, BH)
        v = tl.load(src + offs, mask=offs < H, eviction_policy="evict_first")
        so = tl.arange(0, BS)
        sm = so < SK
        sv = tl.load(xs_ptr + t.to(tl.int64) * stride_xsm + so * stride_xsk, mask=sm)
        if ROW_MAP:
            tl.store(ts_ptr + t.to(tl.int64) * BS + so, sv, mask=sm)
        if DET:
            slot = tl.load(rank_ptr + t * TOPK + k, mask=is_local, other=0)
        else:
            slot = tl.atomic_add(cursor_ptr + loc, tl.where(is_local, 1, 0), mask=is_local, sem="relaxed")
        if PLAN_ALIGN > 0:
            ev, emask, counts, starts = _aligned_starts(starts_ptr, E, PLAN_ALIGN, EB)
            dest = tl.sum(tl.where(loc[:, None] == ev[None, :], starts[None, :], 0), axis=1) + slot
        else:
            dest = tl.load(starts_ptr + loc, mask=is_local, other=0) + slot
        if HAS_ENDS:
            end = tl.minimum(tl.load(ends_ptr + loc, mask=is_local, other=0), cap)
        else:
            end = cap
        ok = is_local & (dest < end)
        over = tl.sum((is_local & (dest >= end)).to(tl.int32), axis=0)
        if over > 0:
            tl.atomic_add(counters_ptr + 1, over, sem="relaxed")
        dest = tl.where(ok, dest, -1)
        tl.store(oidx_ptr + t * TOPK + k, dest, mask=km)
        for kk in tl.static_range(TOPK):
            d = tl.sum(tl.where(k == kk, dest, 0), axis=0)
            if d >= 0:
                tl.store(out_ptr + d.to(tl.int64) * stride_om + offs, v, mask=offs < H, cache_modifier=STORE_CM)
                if ROW_MAP:
                    tl.store(os_ptr + d, t)
                else:
                    tl.store(os_ptr + d.to(tl.int64) * stride_osm + so * stride_osk, sv, mask=sm)
        for h0 in range(BH, H, BH):  # rows longer than BH
            offs2 = h0 + tl.arange(0, BH)
            v2 = tl.load(src + offs2, mask=offs2 < H, eviction_policy="evict_first")
            for kk in tl.static_range(TOPK):
                d = tl.sum(tl.where(k == kk, dest, 0), axis=0)
                if d >= 0:
                    tl.store(out_ptr + d.to(tl.int64) * stride_om + offs2, v2, mask=offs2 < H, cache_modifier=STORE_CM)


@triton.jit
def _scales_by_row_kernel(map_ptr, xs_ptr, os_ptr, rows_n, T, SK, stride_xsm, stride_xsk, stride_osm, stride_osk,
                          counts_ptr, starts_ptr, mi_ptr, E, BR: tl.constexpr, BS: tl.constexpr,
                          PLAN_ALIGN: tl.constexpr = 0, EB: tl.constexpr = 1):
    """out_scales[r] = src[map[r]] for BR consecutive rows per program: each scale column's BR
    values leave in one coalesced store (a column-major layout); the source rows (T of them,
    small: L2-resident) are gathered. A map entry outside [0, T) (a row the scatter did not
    write this time) gives a zero row; a stale in-range entry a copied one: padding rows are
    unspecified either way, as their data rows are.
    PLAN_ALIGN > 0 (ep_dispatch): also the plan, derived from the counts: m_indices of these
    rows, and (program 0) the starts."""
    rows = tl.program_id(0) * BR + tl.arange(0, BR)
    rm = rows < rows_n
    # Every load before the first store (a store may alias them as far as the compiler knows,
    # so it would not hoist a load above one): the map, the gathered scale rows and the counts
    # are in flight together.
    src = tl.load(map_ptr + rows, mask=rm, other=-1)
    ok = (src >= 0) & (src < T)
    so = tl.arange(0, BS)
    m = rm[:, None] & (so[None, :] < SK)
    v = tl.load(xs_ptr + tl.where(ok, src, 0)[:, None].to(tl.int64) * stride_xsm + so[None, :] * stride_xsk,
                mask=m & ok[:, None], other=0)
    if PLAN_ALIGN > 0:
        e, emask, counts, starts = _aligned_starts(counts_ptr, E, PLAN_ALIGN, EB)
        if tl.program_id(0) == 0:
            tl.store(starts_ptr + e, starts, mask=emask)
        tl.store(mi_ptr + rows, _row_owner(rows, e, emask, counts, starts), mask=rm)
    tl.store(os_ptr + rows[:, None].to(tl.int64) * stride_osm + so[None, :] * stride_osk, v, mask=m)


@triton.jit
def _gather_kernel(y_ptr, w_ptr, oidx_ptr, out_ptr, counters_ptr, count, M, H, stride_ym, stride_om,
                   TOPK: tl.constexpr, BH: tl.constexpr):
    """An index outside [-1, M) (not one ep_scatter wrote) reads nothing: it is skipped like -1 and,
    when count != 0, counted once per (token, k) in counters[0] (by the column-block-0 program).
    `count` is a run-time flag, not a constexpr: on the H200 the variant compiled without the
    count took 306 us at T=16384 where this one takes 282 (the original, unbounded kernel 278)."""
    t = tl.program_id(0)
    h0 = tl.program_id(1) * BH
    offs = h0 + tl.arange(0, BH)
    hm = offs < H
    acc = tl.zeros((BH,), dtype=tl.float32)
    bad = 0
    for k in tl.static_range(TOPK):
        idx = tl.load(oidx_ptr + t * TOPK + k)
        ok = (idx >= 0) & (idx < M)
        bad += ((idx < -1) | (idx >= M)).to(tl.int32)
        w = tl.load(w_ptr + t * TOPK + k).to(tl.float32)
        row = tl.load(y_ptr + tl.where(ok, idx, 0).to(tl.int64) * stride_ym + offs, mask=hm & ok, other=0.0)
        acc += tl.where(ok, w, 0.0) * row.to(tl.float32)
    if (bad > 0) & (tl.program_id(1) == 0) & (count != 0):
        tl.atomic_add(counters_ptr, bad, sem="relaxed")
    tl.store(out_ptr + t.to(tl.int64) * stride_om + offs, acc.to(out_ptr.dtype.element_ty), mask=hm)


def workspace_rows(num_routed: int, num_experts: int, alignment: int) -> int:
    """Rows a contiguous layout can need, from shapes only (graph-safe sizing)."""
    return -(-(num_routed + min(num_routed, num_experts) * (alignment - 1)) // alignment) * alignment


def _check_ids(topk_ids):
    if not isinstance(topk_ids, torch.Tensor) or topk_ids.dtype not in (torch.int32, torch.int64):
        raise ValueError("topk_ids must be an int32 or int64 tensor")
    if topk_ids.dim() != 2:
        raise ValueError(f"topk_ids must be [tokens, topk], got shape {tuple(topk_ids.shape)}")
    if topk_ids.device.type == "meta":
        raise ValueError("topk_ids is a meta tensor (no data); the kernels need real ids")


def _ids(topk_ids) -> torch.Tensor:
    """Contiguous ids in their own dtype: the kernels read int32 or int64 ids and compare them at
    that width (_local), so an int64 id past int32 is invalid and counted, never wrapped onto a
    small valid id, and no conversion launch runs (a torch.topk result is int64)."""
    return topk_ids.contiguous()


def _check_experts(num_experts, expert_offset, num_global_experts):
    for name, v in (("num_experts", num_experts), ("expert_offset", expert_offset)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise ValueError(f"{name} must be an int, got {v!r}")
    if num_global_experts is not None and (isinstance(num_global_experts, bool) or not isinstance(num_global_experts,
                                                                                                 int)):
        raise ValueError(f"num_global_experts must be an int or None, got {num_global_experts!r}")
    if not 1 <= num_experts <= 1024:
        raise ValueError(f"num_experts must be in [1, 1024], got {num_experts}")
    ng = expert_offset + num_experts if num_global_experts is None else num_global_experts
    if expert_offset < 0 or expert_offset + num_experts > ng:
        raise ValueError(f"expert_offset={expert_offset} + num_experts={num_experts} must lie within "
                         f"num_global_experts={ng}")
    return ng


SMALL_ROUTES = 8192  # up to this many (token, k) pairs, the masked layout is one launch


def _counters(counters, device, required=False):
    """The [2] int32 counters (invalid ids, overflow) the kernels add to; a new zeroed pair when
    None and not required (ep_scatter requires the layout's: its overflow count must reach the caller)."""
    if counters is None and not required:
        return torch.zeros(2, dtype=torch.int32, device=device)
    if (not isinstance(counters, torch.Tensor) or counters.dtype != torch.int32 or counters.numel() != 2
            or not counters.is_contiguous() or counters.device != torch.device(device)):
        got = (counters.dtype, tuple(counters.shape), counters.stride(), str(counters.device)) if isinstance(
            counters, torch.Tensor) else counters
        raise ValueError(f"counters must be a contiguous int32 tensor of 2 elements (invalid ids, overflow) on "
                         f"{device}, got {got}")
    return counters


def _small_masked_layout(topk_ids, num_experts, expert_offset, ng, counters, max_m):
    """Small batches (decode): the whole masked layout in one launch; None when not small.
    (The contiguous layout keeps memset + atomic count + parallel plan: a one-program count
    measured no faster there on the H200, 14.3 vs 13.1 us for layout + scatter at T=256.)"""
    if topk_ids.numel() > SMALL_ROUTES or num_experts > 256:
        return None
    ids = _ids(topk_ids).view(-1)
    plan = torch.empty(5, num_experts, dtype=torch.int32, device=topk_ids.device)
    counts, starts, cursor, ends, masked_m = plan.unbind(0)
    eb = triton.next_power_of_2(num_experts)
    _small_masked_layout_kernel[(1,)](ids, counts, starts, cursor, ends, masked_m, counters, ids.numel(),
                                      num_experts, expert_offset, ng, max_m, EB=eb, BLOCK=_hist_block(eb))
    return EpLayout(counts, starts, masked_m, counters, cursor, ends)


HIST_EXPERTS = 64  # up to this many local experts the count kernel sums each block in registers


def _hist_block(eb: int) -> int:
    """Ids per block summed in registers by _block_counts: its [BLOCK, eb] compare stays <= 8192."""
    return max(16, min(1024, 8192 // eb))


def _counts(topk_ids, num_experts, expert_offset, ng, counters, counts=None):
    """counts [E] (zeroed here unless given zeroed) += local ids per expert; counters[0] += invalid ids."""
    dev = topk_ids.device
    ids = _ids(topk_ids).view(-1)
    if counts is None:
        counts = torch.zeros(num_experts, dtype=torch.int32, device=dev)
    if ids.numel():
        eb = triton.next_power_of_2(num_experts)
        hist = eb <= HIST_EXPERTS
        blk = _hist_block(eb) if hist else 1024
        _count_kernel[(triton.cdiv(ids.numel(), blk),)](ids, counts, counters, ids.numel(), num_experts,
                                                        expert_offset, ng, BLOCK=blk, EB=eb, HIST=hist)
    return counts, counters


class EpLayout(tuple):
    """(counts, starts, m_indices | masked_m, counters); `.cursor` (zeroed by the plan launch)
    and `.ends` (each expert's row limit: contiguous start + count, masked start + max_m) go to
    ep_scatter."""

    def __new__(cls, counts, starts, rows, counters, cursor, ends=None):
        self = super().__new__(cls, (counts, starts, rows, counters))
        self.cursor, self.ends = cursor, ends
        return self


def _check_alignment(alignment):
    if isinstance(alignment, bool) or not isinstance(alignment, int) or alignment < 1 or alignment > 256 \
            or alignment & (alignment - 1):
        raise ValueError(f"alignment must be a power of two in [1, 256], got {alignment!r}")


def _m_indices(m_indices, capacity, device):
    """The caller's m_indices checked, or a new [capacity] int32 tensor when None."""
    if m_indices is None:
        return torch.empty(capacity, dtype=torch.int32, device=device)
    if (not isinstance(m_indices, torch.Tensor) or m_indices.dtype != torch.int32
            or tuple(m_indices.shape) != (capacity, ) or not m_indices.is_contiguous() or m_indices.device != device):
        got = (m_indices.dtype, tuple(m_indices.shape), str(m_indices.device)) if isinstance(
            m_indices, torch.Tensor) else m_indices
        raise ValueError(f"m_indices must be a contiguous int32 tensor of the capacity's {capacity} rows on "
                         f"{device}, got {got}")
    return m_indices


def ep_layout(topk_ids: torch.Tensor, num_experts: int, capacity: int, alignment: int = 128, *,
              expert_offset: int = 0, num_global_experts: int | None = None,
              counters: torch.Tensor | None = None, m_indices: torch.Tensor | None = None) -> EpLayout:
    """Contiguous layout -> (counts [E], starts [E], m_indices [capacity], counters [2] int32);
    m_indices: where they go (default: a new tensor)."""
    _check_ids(topk_ids)
    _check_alignment(alignment)
    if isinstance(capacity, bool) or not isinstance(capacity, int) or not 0 <= capacity < 2**31:
        raise ValueError(f"capacity must be an int in [0, 2^31), got {capacity!r}")
    ng = _check_experts(num_experts, expert_offset, num_global_experts)
    counters = _counters(counters, topk_ids.device)
    m_indices = _m_indices(m_indices, capacity, topk_ids.device)  # checked before the count launch
    counts, counters = _counts(topk_ids, num_experts, expert_offset, ng, counters)
    plan = torch.empty(3, num_experts, dtype=torch.int32, device=topk_ids.device)
    starts, ends, cursor = plan.unbind(0)
    blk = 128
    _plan_kernel[(max(1, triton.cdiv(capacity, blk)),)](counts, starts, ends, cursor, m_indices, capacity,
                                                        num_experts, ALIGN=alignment,
                                                        EB=triton.next_power_of_2(num_experts), BLOCK=blk)
    return EpLayout(counts, starts, m_indices, counters, cursor, ends)


def ep_masked_layout(topk_ids: torch.Tensor, num_experts: int, max_m: int, *, expert_offset: int = 0,
                     num_global_experts: int | None = None, counters: torch.Tensor | None = None) -> EpLayout:
    """Masked layout [E, max_m] -> (counts [E], starts [E] = e * max_m, masked_m [E], counters [2]); .ends."""
    _check_ids(topk_ids)
    if isinstance(max_m, bool) or not isinstance(max_m, int) or max_m < 1:
        raise ValueError(f"max_m must be an int >= 1, got {max_m!r}")
    ng = _check_experts(num_experts, expert_offset, num_global_experts)
    if num_experts * max_m >= 2**31:  # row indices e * max_m are int32 on the device
        raise ValueError(f"num_experts * max_m = {num_experts * max_m} rows must stay below 2^31 (int32 row "
                         f"indices), got num_experts={num_experts}, max_m={max_m}")
    counters = _counters(counters, topk_ids.device)
    small = _small_masked_layout(topk_ids, num_experts, expert_offset, ng, counters, max_m)
    if small is not None:
        return small
    counts, counters = _counts(topk_ids, num_experts, expert_offset, ng, counters)
    plan = torch.empty(4, num_experts, dtype=torch.int32, device=topk_ids.device)
    starts, ends, masked_m, cursor = plan.unbind(0)
    _masked_plan_kernel[(1,)](counts, starts, ends, masked_m, cursor, num_experts, max_m,
                              EB=triton.next_power_of_2(num_experts))
    return EpLayout(counts, starts, masked_m, counters, cursor, ends)


ROW_MAP_ROUTES = 8192  # above this many (token, k) pairs, column-major out_scales are written by a second launch
SCATTER_STORE = ""  # cache modifier of the row stores ("" = default write-back)
SCATTER_WARPS = 8  # bench/moe_sweep.py on the H200: 8 warps beat 4 and 16 at T = 256, 4096 and 16384
SCALE_ROWS, SCALE_WARPS = 32, 4  # bench/moe_sweep.py on the H200: 32-64 rows 10.0-10.4 us at T = 16384, 128 rows 11.5


def _scales_by_row(row_map, src, out_scales, br=None, warps=None, plan=None):
    """plan (ep_dispatch): (counts, starts, m_indices, alignment), the layout written by this launch too."""
    rows_n, sk = out_scales.shape
    br, warps = br or SCALE_ROWS, warps or SCALE_WARPS
    counts, starts, mi, align = plan if plan is not None else (row_map, row_map, row_map, 0)
    e = counts.numel() if plan is not None else 1
    _scales_by_row_kernel[(triton.cdiv(rows_n, br),)](row_map, src, out_scales, rows_n, src.shape[0], sk,
                                                      src.stride(0), src.stride(1), out_scales.stride(0),
                                                      out_scales.stride(1), counts, starts, mi, e, BR=br,
                                                      BS=triton.next_power_of_2(max(sk, 1)), PLAN_ALIGN=align,
                                                      EB=triton.next_power_of_2(e), num_warps=warps)


def _row_map_buffers(x_scales, out_scales):
    """(row_map [capacity] int32, token_scales [T, BS]) for the row-map path; BS, the scale
    columns rounded up to a power of two, is the row stride the scatter kernel writes with."""
    row_map = torch.empty(out_scales.shape[0], dtype=torch.int32, device=out_scales.device)
    token_scales = torch.empty(x_scales.shape[0], triton.next_power_of_2(max(x_scales.shape[1], 1)),
                               dtype=x_scales.dtype, device=out_scales.device)
    return row_map, token_scales


def _scatter_launch(x, x_scales, ids, rank, starts, ends, cursor, out, out_scales, oidx, counters, e, expert_offset,
                    deterministic, *, row_map=None, token_scales=None, num_warps=SCATTER_WARPS,
                    store_cm=SCATTER_STORE, plan_align=0):
    """Token per program: slot atomics, then the row and its scales to each destination.

    row_map, token_scales (from _row_map_buffers): the scatter writes each destination row's
    token index into row_map and each routed token's scale row once into token_scales, not
    out_scales; the caller's _scales_by_row(row_map, token_scales, out_scales) then writes
    out_scales by destination row (each scale column's rows in one coalesced store; the
    aligned token rows load as vectors, where a column-major x_scales would be a gather of
    4-byte words: 23 vs 11 us at T = 16384 on the H200). A scale row written straight into a
    column-major layout is SK separate 4-byte writes (56 at H = 7168): on the H200 that took
    the scatter from 187 to 227 us at T = 16384 (bench/moe_sweep.py). Every row of out_scales
    is then rewritten: padding rows get unspecified values, as their data rows hold (nothing
    reads them: their m_indices are -1)."""
    t, topk = ids.shape
    h, sk = x.shape[1], x_scales.shape[1]
    has_ends = ends is not None
    ends = ends if has_ends else starts
    dst, dst_m, dst_k = out_scales, out_scales.stride(0), out_scales.stride(1)
    if row_map is not None:
        dst, dst_m, dst_k = row_map, 1, 1
    _scatter_kernel[(t,)](
        x, x_scales, ids, rank, starts, ends, cursor, out, dst, token_scales if row_map is not None else dst, oidx,
        counters,
        e, expert_offset, out.shape[0], h, sk, x.stride(0), x_scales.stride(0), x_scales.stride(1), out.stride(0),
        dst_m, dst_k, TOPK=topk, KB=triton.next_power_of_2(topk), DET=deterministic,
        HAS_ENDS=has_ends, BH=min(8192, triton.next_power_of_2(h)), BS=triton.next_power_of_2(max(sk, 1)),
        ROW_MAP=row_map is not None, STORE_CM=store_cm, PLAN_ALIGN=plan_align,
        EB=triton.next_power_of_2(e) if plan_align else 1, num_warps=num_warps,
    )


def _check_scatter(x, x_scales, topk_ids, out, out_scales):
    _check_ids(topk_ids)
    for name, v in (("x", x), ("x_scales", x_scales), ("out", out), ("out_scales", out_scales)):
        if not isinstance(v, torch.Tensor) or v.device != topk_ids.device:
            got = v.device if isinstance(v, torch.Tensor) else type(v).__name__
            raise ValueError(f"{name} must be a tensor on topk_ids' device {topk_ids.device}, got {got}")
    t = topk_ids.shape[0]
    if x.dim() != 2 or x.shape[0] != t:
        raise ValueError(f"x must be [tokens={t}, H], got shape {tuple(x.shape)}")
    if x.stride(-1) != 1 or out.dim() != 2 or out.stride(-1) != 1:
        raise ValueError("x and out must be 2-D with a contiguous last dimension")
    if out.shape[1] != x.shape[1] or out.dtype != x.dtype:
        raise ValueError(f"out must be [capacity, {x.shape[1]}] of {x.dtype}, got {tuple(out.shape)} {out.dtype}")
    if x_scales.dim() != 2 or x_scales.shape[0] != t:
        raise ValueError(f"x_scales must be [tokens={t}, scale columns], got {tuple(x_scales.shape)}")
    if out_scales.dtype != x_scales.dtype or tuple(out_scales.shape) != (out.shape[0], x_scales.shape[1]):
        raise ValueError(f"out_scales must be [{out.shape[0]}, {x_scales.shape[1]}] of {x_scales.dtype} (the "
                         f"format of x_scales), got {tuple(out_scales.shape)} {out_scales.dtype}")


def _uses_row_map(out_scales, routes):
    """Column-major out_scales above ROW_MAP_ROUTES routes are written by a second launch (_scatter_launch)."""
    col_major = out_scales.shape[0] > 1 and out_scales.shape[1] > 1 and out_scales.stride(0) == 1
    return col_major and routes > ROW_MAP_ROUTES


def ep_scatter(x, x_scales, topk_ids, starts, out, out_scales, counters, *, ends=None, cursor=None,
               expert_offset: int = 0, deterministic: bool = False, num_experts: int | None = None):
    """Copy routed rows (and their scales) into `out` / `out_scales`; -> output_index [T, topk].

    ends [E]: each expert's segment end: the layout's `.ends` (contiguous: start + count, masked:
    start + max_m); default: `out`'s capacity. A row at or past its end is not written and is
    counted as overflow (so a spent cursor reused by a second scatter cannot fill padding rows).
    cursor [E] int32, zero: the layout's `.cursor` (saves a launch); default: a new one.
    num_experts: the layout's expert count; starts (and ends, cursor) must have that many entries
    (default: starts' length; the executors pass it, so a shortened starts cannot drop routes).
    """
    _check_scatter(x, x_scales, topk_ids, out, out_scales)
    t, topk = topk_ids.shape
    counters = _counters(counters, x.device, required=True)
    if not isinstance(starts, torch.Tensor) or starts.dtype != torch.int32 or starts.dim() != 1 \
            or starts.device != x.device:
        got = (starts.dtype, tuple(starts.shape), str(starts.device)) if isinstance(starts, torch.Tensor) else starts
        raise ValueError(f"starts must be a 1-D int32 tensor on {x.device} (the layout's), got {got}")
    e = starts.numel()
    if num_experts is not None and e != num_experts:
        raise ValueError(f"starts must have one entry per expert (num_experts={num_experts}), got {e}")
    for name, v in (("ends", ends), ("cursor", cursor)):
        if v is not None and (not isinstance(v, torch.Tensor) or v.shape != starts.shape or v.dtype != torch.int32
                              or v.device != x.device or not v.is_contiguous()):
            got = (v.dtype, tuple(v.shape)) if isinstance(v, torch.Tensor) else v
            raise ValueError(f"{name} must be contiguous int32 with one entry per expert ({e}) on {x.device}, "
                             f"got {got}")
    oidx = torch.empty(t, topk, dtype=torch.int32, device=x.device)
    ids = _ids(topk_ids)
    n = t * topk
    if not n:
        return oidx
    rank = oidx  # placeholder the atomic mode never reads
    if deterministic:
        blk = 128
        nb = triton.cdiv(n, blk)
        hist = torch.zeros(nb, e, dtype=torch.int32, device=x.device)
        _block_hist_kernel[(nb,)](ids, hist, n, e, expert_offset, BLOCK=blk)
        base = (torch.cumsum(hist, 0, dtype=torch.int32) - hist).contiguous()
        rank = torch.empty(n, dtype=torch.int32, device=x.device)
        _det_rank_kernel[(nb,)](ids, base, rank, n, e, expert_offset, BLOCK=blk)
        cursor = starts  # placeholder: not read
    elif cursor is None:
        cursor = torch.zeros_like(starts)
    row_map = token_scales = None
    if _uses_row_map(out_scales, n):
        row_map, token_scales = _row_map_buffers(x_scales, out_scales)
    _scatter_launch(x, x_scales, ids, rank, starts, ends, cursor, out, out_scales, oidx, counters, e, expert_offset,
                    deterministic, row_map=row_map, token_scales=token_scales)
    if row_map is not None:
        _scales_by_row(row_map, token_scales, out_scales)
    return oidx


def ep_dispatch(x, x_scales, topk_ids, num_experts: int, out, out_scales, alignment: int = 128, *,
                expert_offset: int = 0, num_global_experts: int | None = None, counters=None,
                m_indices=None, deterministic: bool = False):
    """ep_layout (capacity = out's rows) then ep_scatter, in fewer launches where it can:
    -> (EpLayout, output_index [T, topk]), each equal to what the two calls give.

    m_indices [capacity] int32: where the layout's m_indices go (default: a new tensor).
    On the row-map path (column-major out_scales above ROW_MAP_ROUTES routes, atomic order) the
    plan is not a launch of its own: the scatter derives each expert's start from the counts,
    and the launch that writes out_scales by destination row writes m_indices and the starts
    too (memset, count, scatter, scales: four launches instead of five; no program reads
    another program's writes within a launch). Elsewhere it is ep_layout + ep_scatter."""
    _check_scatter(x, x_scales, topk_ids, out, out_scales)
    cap = out.shape[0]
    n = topk_ids.numel()
    if deterministic or not _uses_row_map(out_scales, n):
        lay = ep_layout(topk_ids, num_experts, cap, alignment, expert_offset=expert_offset,
                        num_global_experts=num_global_experts, counters=counters, m_indices=m_indices)
        return lay, ep_scatter(x, x_scales, topk_ids, lay[1], out, out_scales, lay[3], ends=lay.ends,
                               cursor=lay.cursor, expert_offset=expert_offset, deterministic=deterministic,
                               num_experts=num_experts)
    _check_alignment(alignment)
    m_indices = _m_indices(m_indices, cap, x.device)
    ng = _check_experts(num_experts, expert_offset, num_global_experts)
    dev = x.device
    counters = _counters(counters, dev)
    ids = _ids(topk_ids)  # once, for the count and the scatter launches
    plan = torch.zeros(2, num_experts, dtype=torch.int32, device=dev)  # counts, cursor: one memset
    counts, cursor = plan.unbind(0)
    counts, counters = _counts(ids, num_experts, expert_offset, ng, counters, counts=counts)
    starts = torch.empty(num_experts, dtype=torch.int32, device=dev)
    t, topk = topk_ids.shape
    oidx = torch.empty(t, topk, dtype=torch.int32, device=dev)
    row_map, token_scales = _row_map_buffers(x_scales, out_scales)
    _scatter_launch(x, x_scales, ids, oidx, counts, None, cursor, out, out_scales, oidx, counters, num_experts,
                    expert_offset, False, row_map=row_map, token_scales=token_scales, plan_align=alignment)
    _scales_by_row(row_map, token_scales, out_scales, plan=(counts, starts, m_indices, alignment))
    return EpLayout(counts, starts, m_indices, counters, cursor), oidx


def ep_gather(expert_out, topk_weights, output_index, out=None, counters=None):
    """Weighted top-k sum (FP32 accumulation) of the expert rows; -> bf16 [T, H] (into `out` if given).

    An output_index entry outside [-1, rows of expert_out) is never read (the host cannot see it
    without a sync): it is skipped like -1 and, when `counters` (int32 [2]) is given, counted in
    counters[0] (the executors pass theirs)."""
    for name, v in (("expert_out", expert_out), ("topk_weights", topk_weights), ("output_index", output_index)):
        if not isinstance(v, torch.Tensor):
            raise ValueError(f"{name} must be a tensor, got {type(v).__name__}")
        if v.device.type == "meta":
            raise ValueError(f"{name} is a meta tensor (no data)")
    if output_index.dim() != 2 or output_index.dtype != torch.int32:
        raise ValueError("output_index must be an int32 [tokens, topk] tensor (ep_scatter's result)")
    t, topk = output_index.shape
    if expert_out.dim() != 2 or expert_out.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise ValueError(f"expert_out must be a 2-D bf16/fp16/fp32 tensor [rows, H], got {expert_out.dtype} "
                         f"{tuple(expert_out.shape)}")
    h = expert_out.shape[1]
    if tuple(topk_weights.shape) != (t, topk) or not topk_weights.dtype.is_floating_point:
        raise ValueError(f"topk_weights must be a float tensor [{t}, {topk}], got {topk_weights.dtype} "
                         f"{tuple(topk_weights.shape)}")
    if expert_out.stride(-1) != 1:
        raise ValueError("expert_out must have a contiguous last dimension")
    dev = expert_out.device
    for name, v in (("topk_weights", topk_weights), ("output_index", output_index)):
        if v.device != dev:
            raise ValueError(f"{name} is on {v.device}, expert_out on {dev}")
    if out is None:
        out = torch.empty(t, h, dtype=torch.bfloat16, device=dev)
    elif (not isinstance(out, torch.Tensor) or out.dtype != torch.bfloat16 or tuple(out.shape) != (t, h)
          or out.device != dev or out.stride(-1) != 1):
        got = (out.dtype, tuple(out.shape), str(out.device), out.stride()) if isinstance(out, torch.Tensor) else out
        raise ValueError(f"out must be a bfloat16 tensor of shape [{t}, {h}] on {dev} with a contiguous last "
                         f"dimension, got {got}")
    count = counters is not None
    if count:
        _counters(counters, dev)
    if t:
        bh = min(1024, triton.next_power_of_2(h))
        _gather_kernel[(t, triton.cdiv(h, bh))](expert_out, topk_weights.contiguous(), output_index.contiguous(),
                                                out, counters if count else output_index, int(count),
                                                expert_out.shape[0], h, expert_out.stride(0), out.stride(0), TOPK=topk,
                                                BH=bh)
    return out
