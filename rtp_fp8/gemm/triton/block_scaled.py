"""Triton block-scaled FP8 GEMMs: D = A @ B^T in bf16 (dense, m-grouped contiguous, masked).

A float8_e4m3fn [M, K] with 1x128 scales; B float8_e4m3fn [N, K] with 128x128 block
scales or per-row (1x128) scales. Scales are FP32 or packed UE8M0 (the SM100/SM120
format), so every scale format runs on any GPU and under the CPU interpreter. Each 128-K
step's partial product is promoted in FP32 with scale_a x scale_b (the DeepGEMM 1D2D
recipe).

Grouped contiguous: rows carry an int32 expert id (m_indices); a BLOCK_M tile's expert is
its first row's; a tile whose first id is -1 or out of range writes zeros and does no MMA
work; rows whose id differs from the tile's (padding -1, a misaligned segment or an
out-of-range id) are written as zeros; counters[0] += padding rows, counters[1] += rows
with an invalid id or in the wrong tile (accumulated on the device, no host sync).
Masked: A [E, Mmax, K]; only rows < masked_m[e] are computed and written (others are
left as they were: undefined, as in DeepGEMM).

On an SM90 GPU, dense and contiguous calls that sm90_ws.plan() accepts (FP32 scales, A's
column-major TMA-aligned, B's per 128x128 block, enough 128x128 tiles to fill the GPU) run the
warp-specialized Gluon kernel in sm90_ws.py, bit-identical to the Triton kernel here
(docs/perf.md has both); everything else runs the Triton kernels below.
"""

from __future__ import annotations

import contextlib
import functools
import json
import pathlib

import torch
import triton
import triton.language as tl

from rtp_fp8 import _ext, triton_env
from rtp_fp8 import arch as A
from rtp_fp8.quant.layout import cdiv

try:  # Gluon (triton.experimental.gluon) ships with Triton >= 3.5; without it every call takes the Triton path
    from rtp_fp8.gemm.triton import sm90_ws
except ImportError:  # pragma: no cover - the pinned Triton versions have Gluon
    sm90_ws = None

try:  # grid dependency control (programmatic dependent launch, SM90+): Triton >= 3.5
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

    HAS_GDC = True
except ImportError:  # pragma: no cover - the pinned Triton versions have it
    HAS_GDC = False

    @triton.jit
    def gdc_wait():
        pass

    @triton.jit
    def gdc_launch_dependents():
        pass

GRAN = 128
DENSE, CONTIGUOUS, MASKED = 0, 1, 2


@triton.jit
def _load_scale(ptr, idx, kb, stride_i, stride_k, mask, PACKED: tl.constexpr):
    if PACKED:
        word = tl.load(ptr + idx * stride_i + (kb // 4) * stride_k, mask=mask, other=0)
        byte = (word >> ((kb % 4) * 8)) & 0xFF
        return (byte << 23).to(tl.float32, bitcast=True)
    else:
        return tl.load(ptr + idx * stride_i + kb * stride_k, mask=mask, other=0.0)


@triton.jit
def _swizzled_tile(t, TILES_M, tiles_n, GROUP_M: tl.constexpr):
    """(pid_m, pid_n) of linear tile t: GROUP_M row tiles are walked together (B reuse in L2)."""
    width = GROUP_M * tiles_n
    first_m = (t // width) * GROUP_M
    size_m = tl.minimum(TILES_M - first_m, GROUP_M)
    return first_m + (t % width) % size_m, (t % width) // size_m


@triton.jit
def _promote_part(acc, part, sa, sb_base, pid_n, cols, cmask, kb, stride_sbn, stride_sbk,
                  SB_ROW_DIV: tl.constexpr, PACKED_B: tl.constexpr, BLOCK_N: tl.constexpr, A_AXIS: tl.constexpr):
    """acc + part * scale_a * scale_b for one 128-K step's FP32 MMA result `part`, whose axis A_AXIS
    runs along A's rows (0: [rows, cols]; 1: the swapped kernel's [cols, rows]). With 128x128 B
    blocks and BLOCK_N <= 128 the step has one B scale, folded into A's per-row scales, so the
    promotion is one FMA per accumulator element."""
    if (SB_ROW_DIV == 128) and (BLOCK_N <= 128) and (not PACKED_B):
        sab = sa * tl.load(sb_base + (pid_n * BLOCK_N // 128) * stride_sbn + kb * stride_sbk)
        if A_AXIS == 0:
            acc += part * sab[:, None]
        else:
            acc += part * sab[None, :]
    else:
        sb = _load_scale(sb_base, cols // SB_ROW_DIV, kb, stride_sbn, stride_sbk, cmask, PACKED_B)
        if A_AXIS == 0:
            acc += part * sa[:, None] * sb[None, :]
        else:
            acc += part * sa[None, :] * sb[:, None]
    return acc


@triton.jit
def _promote(acc, a, b, sa, sb_base, pid_n, cols, cmask, kb, stride_sbn, stride_sbk,
             SB_ROW_DIV: tl.constexpr, PACKED_B: tl.constexpr, BLOCK_N: tl.constexpr):
    """acc + (a @ b^T) * scale_a * scale_b for one 128-K step."""
    return _promote_part(acc, tl.dot(a, tl.trans(b), out_dtype=tl.float32), sa, sb_base, pid_n, cols, cmask, kb,
                         stride_sbn, stride_sbk, SB_ROW_DIV, PACKED_B, BLOCK_N, 0)


@triton.jit
def _tile_expert(grp_ptr, cnt_ptr, rows, rmask, first_row, pid_n, E):
    """Contiguous layout: (expert of the tile = its first row's id, or 0; rows computed; tile
    valid). Column tile 0 counts padding rows (-1) and rows with another or invalid id."""
    expert = tl.load(grp_ptr + first_row)
    ids = tl.load(grp_ptr + rows, mask=rmask, other=-1)
    tile_valid = (expert >= 0) & (expert < E)
    row_ok = rmask & (ids == expert) & tile_valid
    if pid_n == 0:
        tl.atomic_add(cnt_ptr, tl.sum((rmask & (ids == -1)).to(tl.int32), axis=0), sem="relaxed")
        tl.atomic_add(cnt_ptr + 1, tl.sum((rmask & (ids != -1) & ~row_ok).to(tl.int32), axis=0), sem="relaxed")
    return tl.where(tile_valid, expert, 0), row_ok, tile_valid


@triton.jit
def _fp8_gemm_kernel(
    a_ptr, b_ptr, d_ptr, sa_ptr, sb_ptr, grp_ptr, cnt_ptr,
    M, N, K, E, TILES_M,
    stride_ae, stride_am, stride_ak,
    stride_be, stride_bn, stride_bk,
    stride_de, stride_dm, stride_dn,
    stride_sae, stride_sam, stride_sak,
    stride_sbe, stride_sbn, stride_sbk,
    SB_ROW_DIV: tl.constexpr, PACKED_A: tl.constexpr, PACKED_B: tl.constexpr, MODE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    EVEN_K: tl.constexpr, COUNT_MASKED: tl.constexpr = False,
):
    pid = tl.program_id(0)
    tiles_n = tl.cdiv(N, BLOCK_N)
    if MODE == 2:  # masked: axis 1 walks experts
        e = tl.program_id(1)
        pid_m = pid // tiles_n
        pid_n = pid % tiles_n
        mm = tl.load(grp_ptr + e)
        if COUNT_MASKED:  # masked_m outside [0, M]: clamped, and counted (cnt_ptr: [negative, above M])
            if (pid == 0) & ((mm < 0) | (mm > M)):
                tl.atomic_add(cnt_ptr + (mm > M).to(tl.int32), 1, sem="relaxed")
        m_limit = tl.minimum(mm, M)
    else:
        e = 0
        pid_m, pid_n = _swizzled_tile(pid, TILES_M, tiles_n, GROUP_M)
        m_limit = M
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rmask = rows < m_limit
    cmask = cols < N
    d_ptrs = d_ptr + e * stride_de + rows[:, None] * stride_dm + cols[None, :] * stride_dn
    if MODE == 2:
        if pid_m * BLOCK_M >= m_limit:
            return
    row_ok = rmask
    if MODE == 1:
        e, row_ok, tile_valid = _tile_expert(grp_ptr, cnt_ptr, rows, rmask, pid_m * BLOCK_M, pid_n, E)
        if not tile_valid:
            zero = tl.zeros((BLOCK_M, BLOCK_N), dtype=d_ptr.dtype.element_ty)
            tl.store(d_ptrs, zero, mask=rmask[:, None] & cmask[None, :])
            return

    a_base = a_ptr + (e * stride_ae if MODE == 2 else 0)
    b_base = b_ptr + e * stride_be
    sa_base = sa_ptr + (e * stride_sae if MODE == 2 else 0)
    sb_base = sb_ptr + e * stride_sbe
    offs_k = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        if EVEN_K:
            a = tl.load(a_base + rows[:, None] * stride_am + (k0 + offs_k)[None, :] * stride_ak,
                        mask=rmask[:, None], other=0.0)
            b = tl.load(b_base + cols[:, None] * stride_bn + (k0 + offs_k)[None, :] * stride_bk,
                        mask=cmask[:, None], other=0.0)
        else:
            kmask = (k0 + offs_k) < K
            a = tl.load(a_base + rows[:, None] * stride_am + (k0 + offs_k)[None, :] * stride_ak,
                        mask=rmask[:, None] & kmask[None, :], other=0.0)
            b = tl.load(b_base + cols[:, None] * stride_bn + (k0 + offs_k)[None, :] * stride_bk,
                        mask=cmask[:, None] & kmask[None, :], other=0.0)
        kb = k0 // 128
        sa = _load_scale(sa_base, rows, kb, stride_sam, stride_sak, rmask, PACKED_A)
        acc = _promote(acc, a, b, sa, sb_base, pid_n, cols, cmask, kb, stride_sbn, stride_sbk, SB_ROW_DIV, PACKED_B,
                       BLOCK_N)
    if MODE == 1:
        acc = tl.where(row_ok[:, None], acc, 0.0)
    tl.store(d_ptrs, acc.to(d_ptr.dtype.element_ty), mask=rmask[:, None] & cmask[None, :])


@triton.jit
def _fp8_gemm_tma_kernel(
    a_desc, b_desc, d_ptr, sa_ptr, sb_ptr, grp_ptr, cnt_ptr,
    M, N, K, E, TILES_M, NUM_PROGS,
    stride_dm, stride_dn, stride_sam, stride_sak, stride_sbe, stride_sbn, stride_sbk,
    SB_ROW_DIV: tl.constexpr, PACKED_A: tl.constexpr, PACKED_B: tl.constexpr, MODE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    STAGES: tl.constexpr, SPLIT_K: tl.constexpr = 1, stride_ws=0, stride_de=0, stride_sae=0,
):
    """Dense, m-grouped contiguous and m-grouped masked, persistent (NUM_PROGS programs walk the
    tiles) with TMA loads (out-of-range rows and K are zero-filled by the copy engine). B is
    viewed as [E * N, K]: a tile's rows past N belong to the next expert and only feed columns
    that are never stored. Same numerics, counters and zero tiles as _fp8_gemm_kernel.

    Masked (MODE 2): A is viewed as [E * M, K] (M: Mmax), out and A's scales are [E, M, ...]
    (stride_de, stride_sae). Each expert owns TILES_M x tiles_n work items; the first
    cdiv(masked_m[e], BLOCK_M) x tiles_n of them are its tiles, walked in grouped-M order, the
    rest run no K step and store nothing. A tile's rows past masked_m read the next expert's
    rows (or TMA's zero fill) and are not stored: rows past masked_m keep what they held.

    SPLIT_K > 1 (dense only): work item (tile, s) sums the s-th of SPLIT_K equal runs of K
    blocks and stores its FP32 partial at d_ptr + s * stride_ws; the caller adds the partials
    in a fixed order."""
    tiles_n = tl.cdiv(N, BLOCK_N)
    num_tiles = TILES_M * tiles_n * (E if MODE == 2 else 1)
    nk = tl.cdiv(K, BLOCK_K)
    per_split = tl.cdiv(nk, SPLIT_K)
    for item in tl.range(tl.program_id(0), num_tiles * SPLIT_K, NUM_PROGS, flatten=True):
        tile = item // SPLIT_K
        split = item % SPLIT_K
        k_lo = split * per_split
        k_hi = tl.minimum(nk, k_lo + per_split)
        e = 0
        m_end = M
        a_row0 = 0
        tile_valid = True
        d_base = d_ptr + split * stride_ws
        sa_base = sa_ptr
        if MODE == 2:  # expert e's work items: its row tiles first, then the ones past masked_m
            e = tile // (TILES_M * tiles_n)
            tile = tile % (TILES_M * tiles_n)
            m_end = tl.minimum(tl.maximum(tl.load(grp_ptr + e), 0), M)
            tiles_m = tl.cdiv(m_end, BLOCK_M)
            tile_valid = tile < tiles_m * tiles_n
            m_end = tl.where(tile_valid, m_end, 0)  # an item past the expert's tiles stores no row
            pid_m, pid_n = _swizzled_tile(tl.where(tile_valid, tile, 0), tl.maximum(tiles_m, 1), tiles_n, GROUP_M)
            a_row0 = e * M
            d_base = d_ptr + e.to(tl.int64) * stride_de  # E x Mmax x N may pass 2^31 elements
            sa_base = sa_ptr + e.to(tl.int64) * stride_sae
        else:
            pid_m, pid_n = _swizzled_tile(tile, TILES_M, tiles_n, GROUP_M)
        rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        rmask = rows < m_end
        cmask = cols < N
        row_ok = rmask
        if MODE == 1:
            e, row_ok, tile_valid = _tile_expert(grp_ptr, cnt_ptr, rows, rmask, pid_m * BLOCK_M, pid_n, E)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        sb_base = sb_ptr + e * stride_sbe
        for kb in tl.range(k_lo, tl.where(tile_valid, k_hi, k_lo), num_stages=STAGES):  # invalid tiles: no K steps
            a = a_desc.load([a_row0 + pid_m * BLOCK_M, kb * BLOCK_K])
            b = b_desc.load([e * N + pid_n * BLOCK_N, kb * BLOCK_K])
            sa = _load_scale(sa_base, rows, kb, stride_sam, stride_sak, rmask, PACKED_A)
            acc = _promote(acc, a, b, sa, sb_base, pid_n, cols, cmask, kb, stride_sbn, stride_sbk, SB_ROW_DIV,
                           PACKED_B, BLOCK_N)
        if MODE == 1:
            acc = tl.where(row_ok[:, None], acc, 0.0)
        d_ptrs = d_base + rows[:, None] * stride_dm + cols[None, :] * stride_dn
        tl.store(d_ptrs, acc.to(d_ptr.dtype.element_ty), mask=rmask[:, None] & cmask[None, :])


@triton.jit
def _fp8_gemm_swap_kernel(
    a_desc, b_desc, d_ptr, sa_ptr, sb_ptr, grp_ptr,
    M, N, K, stride_dm, stride_dn, stride_de, stride_sae, stride_sam, stride_sak, stride_sbe, stride_sbn, stride_sbk,
    SB_ROW_DIV: tl.constexpr, PACKED_A: tl.constexpr, PACKED_B: tl.constexpr, MODE: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_T: tl.constexpr, STAGES: tl.constexpr, SPLIT_K: tl.constexpr, stride_ws,
    PDL: tl.constexpr = False,
):
    """Few rows (decode): D^T = B @ A^T, weight rows on the MMA's M side (BLOCK_N of them) and the
    token rows on its N side (BLOCK_T, down to 16), so that a handful of tokens does not pad a
    64-row MMA. Dense: program (column tile x K split, token tile); SPLIT_K > 1 stores FP32
    partials at d_ptr + split * stride_ws (the caller adds them in a fixed order). Masked: axis 2
    is the expert, which walks its masked_m rows in BLOCK_T steps (A viewed as [E * M, K]: a step's
    rows past masked_m read the next expert's rows and are not stored). Each 128-K step promotes
    with scale_a x scale_b as the other kernels do. PDL (dense splits, one wave of programs): the
    split reduction, launched dependent on this kernel, may start launching at once; it waits for
    this grid to finish before it reads a partial. Launched so, this kernel is itself a programmatic
    dependent of the stream's previous kernel and may start before that one completes: it waits for
    it (griddepcontrol.wait) before it reads A, a scale or masked_m, or writes d."""
    if PDL:
        gdc_launch_dependents()
        gdc_wait()
    pid = tl.program_id(0)
    tiles_n = tl.cdiv(N, BLOCK_N)
    pid_n = pid % tiles_n
    split = pid // tiles_n
    nk = tl.cdiv(K, 128)
    per_split = tl.cdiv(nk, SPLIT_K)
    k_lo = split * per_split
    k_hi = tl.minimum(nk, k_lo + per_split)
    if MODE == 2:
        e = tl.program_id(2)
        m_end = tl.minimum(tl.maximum(tl.load(grp_ptr + e), 0), M)
        t_lo = 0
        t_hi = m_end
    else:
        e = 0
        m_end = M
        t_lo = tl.program_id(1) * BLOCK_T
        t_hi = t_lo + 1
    ns = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = ns < N
    sb_base = sb_ptr + e * stride_sbe
    sa_base = sa_ptr + e * stride_sae
    for t0 in range(t_lo, t_hi, BLOCK_T):
        toks = t0 + tl.arange(0, BLOCK_T)
        tmask = toks < m_end
        acc = tl.zeros((BLOCK_N, BLOCK_T), dtype=tl.float32)
        for kb in tl.range(k_lo, k_hi, num_stages=STAGES):
            b = b_desc.load([e * N + pid_n * BLOCK_N, kb * 128])
            a = a_desc.load([e * M + t0, kb * 128])
            sa = _load_scale(sa_base, toks, kb, stride_sam, stride_sak, tmask, PACKED_A)
            acc = _promote_part(acc, tl.dot(b, tl.trans(a), out_dtype=tl.float32), sa, sb_base, pid_n, ns, nmask, kb,
                                stride_sbn, stride_sbk, SB_ROW_DIV, PACKED_B, BLOCK_N, 1)
        d_ptrs = (d_ptr + split * stride_ws + e * stride_de + toks[None, :] * stride_dm + ns[:, None] * stride_dn)
        tl.store(d_ptrs, acc.to(d_ptr.dtype.element_ty), mask=nmask[:, None] & tmask[None, :])


@triton.jit
def _split_reduce_kernel(ws_ptr, d_ptr, MN, N, stride_dm, SPLITS: tl.constexpr, BLOCK: tl.constexpr,
                         PDL: tl.constexpr = False):
    """d = bf16(ws[0] + ws[1] + ...): FP32 split-K partials [SPLITS, M, N] added in split order.
    PDL: launched dependent on the GEMM that wrote ws, it waits for that grid to complete (and its
    stores to be visible) before the first load; its launch overlaps the GEMM's tail."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < MN
    if PDL:
        gdc_wait()
    acc = tl.load(ws_ptr + offs, mask=mask, other=0.0)
    for s in tl.static_range(1, SPLITS):
        acc += tl.load(ws_ptr + s * MN + offs, mask=mask, other=0.0)
    tl.store(d_ptr + (offs // N) * stride_dm + offs % N, acc.to(d_ptr.dtype.element_ty), mask=mask)


# ----------------------------------------------------------------------------- validation


def _check_fp8(t, name, dims):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.device.type == "meta":
        raise ValueError(f"{name} is a meta tensor (no data): the GEMMs need CPU or CUDA tensors")
    if t.dtype != torch.float8_e4m3fn:
        raise ValueError(f"{name} must be torch.float8_e4m3fn, got {t.dtype}")
    if t.dim() != dims:
        raise ValueError(f"{name} must be {dims}-D, got shape {tuple(t.shape)}")
    if t.stride(-1) != 1:
        raise ValueError(f"{name} must be K-major (stride 1 in its last dim), got strides {t.stride()}")


def _check_scale(s, name, lead, rows, k, packed_ok=True):
    """Scales for `rows` rows of K: FP32 [.., rows, ceil(K/128)] or UE8M0 int32 [.., rows, ceil(K/512)]."""
    kg = cdiv(k, GRAN)
    if not isinstance(s, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(s).__name__}")
    if s.dtype == torch.float32:
        want = (*lead, rows, kg)
    elif s.dtype == torch.int32 and packed_ok:
        want = (*lead, rows, cdiv(kg, 4))
    else:
        raise ValueError(f"{name} must be float32 (FP32 scales) or int32 (packed UE8M0), got {s.dtype}")
    if tuple(s.shape) != want:
        raise ValueError(f"{name} must have shape {want} for K={k} and {s.dtype}, got {tuple(s.shape)}")
    return s.dtype == torch.int32


def check_b_scales(sb, lead, n, k, name="sb"):
    """B scales for [.., N, K] weights: FP32 per block [.., ceil(N/128), KG] or per row [.., N, KG],
    or packed UE8M0 per row [.., N, ceil(KG/4)] -> (packed, rows per scale row); else ValueError
    naming `name` (the GEMMs' sb, the MoE experts' weight scales)."""
    if not isinstance(sb, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(sb).__name__}")
    kg = cdiv(k, GRAN)
    block, row, packed = (*lead, cdiv(n, GRAN), kg), (*lead, n, kg), (*lead, n, cdiv(kg, 4))
    shape = tuple(sb.shape)
    if sb.dtype == torch.float32:
        if shape == block and n != cdiv(n, GRAN):
            return False, GRAN
        if shape == row:
            return False, 1
        want = f"{block} (128x128 blocks) or {row} (per row)"
    elif sb.dtype == torch.int32:
        if shape == packed:
            return True, 1
        want = f"{packed} (packed UE8M0 per row)"
    else:
        raise ValueError(f"{name} must be float32 (FP32 scales) or int32 (packed UE8M0), got {sb.dtype}")
    raise ValueError(f"{name} must have shape {want} for N={n}, K={k} and {sb.dtype}, got {shape}")


def _check_out(out, shape, device):
    if out is None:
        return torch.empty(shape, dtype=torch.bfloat16, device=device)
    if not isinstance(out, torch.Tensor) or out.dtype != torch.bfloat16 or tuple(out.shape) != tuple(shape):
        got = (tuple(out.shape), out.dtype) if isinstance(out, torch.Tensor) else type(out).__name__
        raise ValueError(f"out must be bfloat16 of shape {tuple(shape)}, got {got}")
    if out.device != device:
        raise ValueError(f"out is on {out.device}, expected {device}")
    return out


def _same_device(device, **tensors):
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a tensor, got {type(t).__name__}")
        if t.device != device:
            raise ValueError(f"{name} is on {t.device}, expected {device} (a's device)")


CONFIG_KEYS = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "num_warps", "num_stages", "GROUP_M")
CONFIG_TABLE = pathlib.Path(__file__).with_name("configs.json")
_override: dict | None = None  # bench/autotune_gemm.py times candidates through config_override


@functools.lru_cache(maxsize=1)
def config_table() -> list[tuple[int | None, tuple[int, ...]]]:
    """(max_m, config) buckets from configs.json (regenerated by bench/autotune_gemm.py)."""
    data = json.loads(CONFIG_TABLE.read_text())
    out = []
    for b in data["buckets"]:
        cfg = tuple(int(b["config"][key]) for key in CONFIG_KEYS)
        if cfg[2] != GRAN:
            raise ValueError(f"{CONFIG_TABLE}: BLOCK_K must be {GRAN} (the scale granularity), got {cfg[2]}")
        out.append((b["max_m"], cfg))
    if out[-1][0] is not None:
        raise ValueError(f"{CONFIG_TABLE}: the last bucket must have max_m null (any M)")
    return out


@contextlib.contextmanager
def config_override(config: dict):
    """Force one launch config (autotuning only; not thread-safe)."""
    global _override
    _override, old = dict(config), _override
    try:
        yield
    finally:
        _override = old


def _config(m, n, k):
    if _override is not None:
        return tuple(int(_override[key]) for key in CONFIG_KEYS)
    if triton_env.interpreting():  # few, large programs: the interpreter's cost is per program
        return min(64, max(16, triton.next_power_of_2(m))), min(256, max(16, triton.next_power_of_2(n))), 128, 1, 1, 1
    for max_m, cfg in config_table():
        if max_m is None or m <= max_m:
            return cfg
    raise AssertionError("unreachable: the last bucket takes any M")


def _strides3(t: torch.Tensor) -> tuple[int, int, int]:
    """(expert, row, column) strides; expert stride 0 for a 2-D tensor."""
    return (t.stride(0), t.stride(1), t.stride(2)) if t.dim() == 3 else (0, t.stride(0), t.stride(1))


def _launch(grid, mode, a, b, d, sa, sb, grp, cnt, m, n, k, e, tiles_m, sb_div, packed_a, packed_b, bm, bn, bk,
            warps, stages, group_m, count_masked=False):
    (a_e, a_m, a_k), (b_e, b_n, b_k), (d_e, d_m, d_n) = _strides3(a), _strides3(b), _strides3(d)
    (sa_e, sa_m, sa_k), (sb_e, sb_n, sb_k) = _strides3(sa), _strides3(sb)
    _fp8_gemm_kernel[grid](
        a, b, d, sa, sb, grp, cnt, m, n, k, e, tiles_m,
        a_e, a_m, a_k, b_e, b_n, b_k, d_e, d_m, d_n, sa_e, sa_m, sa_k, sb_e, sb_n, sb_k,
        SB_ROW_DIV=sb_div, PACKED_A=packed_a, PACKED_B=packed_b, MODE=mode,
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=group_m, EVEN_K=k % bk == 0, COUNT_MASKED=count_masked,
        num_warps=warps, num_stages=stages,
    )


USE_TMA = True  # tests patch it to False to compare both paths; the launcher also checks _tma_rows
USE_WS = True  # likewise for the SM90 warp-specialized kernel (sm90_ws.plan decides where it applies)


def ws_refusal(mode, a, sa, b, sb, out, packed_a=False, sb_div=GRAN, alignment=128, expected_m=None) -> str | None:
    """None when a dense / contiguous / masked call with these operands runs sm90_ws, else why it
    does not (bench/gemm.py labels its rows with it). Masked calls need expected_m above
    SWAP_MAX_ROWS (fewer rows take the swapped kernel)."""
    if not USE_WS:
        return "USE_WS is off"
    if sm90_ws is None:
        return "this Triton has no Gluon"
    if triton_env.interpreting():
        return "the Triton interpreter runs the Triton kernels"
    if mode == MASKED and USE_SWAP and expected_m <= SWAP_MAX_ROWS:
        return f"expected_m {expected_m} <= {SWAP_MAX_ROWS} rows: the swapped kernel"
    return sm90_ws.plan(a, sa, b, sb, out, packed_a=packed_a, sb_div=sb_div, grouped=mode == CONTIGUOUS,
                        alignment=alignment, masked_rows=expected_m if mode == MASKED else None)


# Dense and contiguous calls whose sm90_ws tile is 128x256 run the CUDA kernel with 2-CTA clusters
# multicasting B (csrc/fp8_gemm_sm90.cu) when the extension is built: the same products and promotion,
# bit-identical, a third less L2-to-SM traffic per FLOP. At the M=4096 shapes it runs at 0.97-0.98 of
# DeepGEMM's speed on the H200 and 0.95-1.00 on the H100, where sm90_ws ran at 0.85-0.97
# (bench/gemm.py, bench/sm90_cluster.py, docs/perf.md, seventeenth #28 session).
USE_CLUSTER = True
CLUSTER_GROUP_M = 8  # pairs of 128-row tiles per group of the clusters' tile walk
CLUSTER_MAX_K = 128 * 1024  # K blocks' B-scale rows share the kernel's shared memory with its ring


def cluster_refusal(a, out) -> str | None:
    """None when a dense or contiguous call that sm90_ws would run in 128x256 tiles runs the cluster
    kernel instead, else why not."""
    if not USE_CLUSTER:
        return "USE_CLUSTER is off"
    if not _ext.available():
        return f"the CUDA extension is absent: {_ext.unavailable_reason()}"
    if not _ext.has("fp8_gemm_sm90"):
        return "the CUDA extension predates the cluster kernel (rebuild it: python3 tools/build_ext.py)"
    if a.shape[1] > CLUSTER_MAX_K:
        return f"K={a.shape[1]} > {CLUSTER_MAX_K}"
    if not _tma_ok(out):
        return "out is not TMA-aligned"
    return None


def wide_tiles(mode, m, n, splits, sms) -> bool:
    """Whether sm90_ws runs a dense or contiguous call of M rows (all experts') and N columns, in
    `splits` K splits on `sms` SMs, in unsplit 128x256 tiles: the calls the cluster kernel can take."""
    return splits == 1 and mode != MASKED and sm90_ws.tile_shape(m, n, sms, mode == DENSE) == (
        sm90_ws.BM, sm90_ws.WIDE_BN)


def _launch_wide(mode, a, sa, b, sb, grp, cnt, e, out):
    """A dense or contiguous call in 128x256 tiles: the cluster kernel, else sm90_ws."""
    if cluster_refusal(a, out) is not None:
        sm90_ws.launch(mode, a, sa, b, sb, grp, cnt, e, out, pdl=ws_pdl())
    elif mode == DENSE:
        _ext.fp8_gemm_sm90(a, sa, b, sb, out, CLUSTER_GROUP_M)
    else:
        _ext.fp8_gemm_sm90_contiguous(a, sa, b, sb, grp, out, cnt, CLUSTER_GROUP_M)


def _launch_ws(mode, a, sa, b, sb, grp, cnt, e, out, packed_a, sb_div, alignment=128, expected_m=None) -> bool:
    """Dense / contiguous / masked through sm90_ws on SM90; False when it does not apply. A dense
    grid with fewer tiles than SMs splits K there (sm90_ws.split_k): FP32 partials, added in split
    order into out by the same reduction as the Triton kernel's split."""
    if ws_refusal(mode, a, sa, b, sb, out, packed_a, sb_div, alignment, expected_m) is not None:
        return False
    n0 = sm90_ws.column_split(a.shape[0], b.shape[0], A.num_sms(a.device.index or 0)) if mode == DENSE else 0
    if n0:  # N's whole 128x256 tiles on their own, then the other columns through the dispatch
        _launch_wide(DENSE, a, sa, b[:n0], sb[:n0 // GRAN], grp, cnt, e, out[:, :n0])
        fp8_gemm_nt(a, sa, b[n0:], sb[n0 // GRAN:], out=out[:, n0:])
        return True
    splits = ws_splits(mode, a, b)
    if wide_tiles(mode, a.shape[0], b.shape[-2], splits, A.num_sms(a.device.index or 0)):
        _launch_wide(mode, a, sa, b, sb, grp, cnt, e, out)
        return True
    if splits == 1:
        sm90_ws.launch(mode, a, sa, b, sb, grp, cnt, e, out, masked_rows=expected_m, pdl=ws_pdl())
        return True
    parts = torch.empty(splits, *out.shape, dtype=torch.float32, device=out.device)
    sm90_ws.launch(mode, a, sa, b, sb, grp, cnt, e, parts, splits=splits, pdl=ws_pdl())
    _reduce_splits(parts, out)
    return True


# Dense calls of NARROW_MIN_ROWS..NARROW_MAX_ROWS rows on SM90 run the CUDA narrow kernel when the extension is built
# (csrc/fp8_gemm_sm90.cu: 64 x narrow_block_n tiles, one consumer warpgroup, a deep ring; the same products and
# promotion as the Triton kernel, bit-identical, unsplit): up to SWAP_MAX_ROWS rows in 64x32 tiles where the swapped
# kernel would not split K, or where it would and those tiles fill at least NARROW_SPLIT_FILL of the SMs (giving way to
# 64x56 where NARROW_WAVE_BLOCK_N says); above in 64x64 tiles that fill at most one wave, else, up to
# NARROW_WIDE_MAX_ROWS rows, in 64x112 tiles (NARROW_WIDE_BLOCK_N) that do; and only where sm90_ws would not split K.
# 64x112 is what DeepGEMM's SM90 cost model picks at (128, 7168, 2048): 128 tiles in one wave, where 64x64 makes 224
# and sm90_ws's 128x64 112.
# On the H100 (bench/sm90_narrow.py, twenty-fourth session) they beat sm90_ws's 128x64 at 80-112 rows: (80, 7168,
# 2048) 9.7 against 10.5 us, (96, ...) 9.8 against 10.1, (80, 7168, 16384) 48.8 against 56.0, (96, ...) 45.4
# against 53.5, (112, ...) 45.1 against 46.3; at 128 rows they do not ((128, 7168, 2048) 10.3 against 9.8).
# (64, 7168, 2048): 7.6 us on the H200 (bench/gemm.py, DeepGEMM / it 0.91) where sm90_ws 64x64 took 7.8 (0.90),
# 8.7 against 9.1 on the H100 (bench/sm90_narrow.py). (64, 4096, 7168), which the swapped kernel splits 4 ways:
# 14.1 against 16.1-16.5 us on the H100, 13.6 against 13.1 on the H200 before the twentieth session's two chains
# in flight (which took 5-23 % off multi-tile 64x32 grids). The H100 of the twenty-third session
# (bench/sm90_narrow.py, the ring depths below): 64x32 at (16, 4096, 7168) and (32, 4096, 7168), split 4 ways in
# the swapped kernel, 13.4 and 13.6 against 14.2 and 14.9 us; at (16, 7168, 2048) and (32, 7168, 2048) 8.1 and
# 8.2 against 8.4 and 8.6. (1-7 rows: below.) (128, 4096, 7168)'s 128 tiles: 15.0 us against
# sm90_ws 64x64's 15.3 on the H200, 14.7 against 15.9 on the H100 (twentieth session, with two chains in
# flight); (128, 7168, 2048)'s 224 lost (10.8-11.8 against 8.6-10.0). 2-CTA clusters sharing A were slower
# everywhere (docs/perf.md, eighteenth to twenty-third #28 sessions).
# 1-7 rows follow the same rules since the kernel's A box holds M rows (forty-second session): with a 16-row box
# TMA filled the rows past M, which cost 0.8-2.9 us in 64x32 tiles, so until then those rows took 64x64 tiles or the
# swapped kernel. On the H100 (bench/sm90_narrow.py --pdl 2, 2 reps, us, the 16-row box then the M-row box):
# (1, 4096, 7168) 64x32 s12 13.97 -> 11.85, where the split swapped kernel takes 13.27 and 64x64 s8 took 12.64;
# (4, 4096, 7168) 14.15 -> 11.93 (swapped 13.46); (1, 7168, 2048) 64x32 s8 8.45 -> 6.94, 64x56 s8 6.88 -> 6.82.
USE_NARROW = True
NARROW_MIN_ROWS = 1
NARROW_MAX_ROWS = 128
NARROW_BLOCK_N = 32  # up to SWAP_MAX_ROWS rows; 64 above, or NARROW_WAVE_/WIDE_BLOCK_N (there)
NARROW_WIDE_BLOCK_N = 112
# 64x56 tiles (NARROW_WAVE_BLOCK_N) replace the default width at up to SWAP_MAX_ROWS rows where they make one wave
# and the default's tiles do not (N=7168 on 132 SMs: 128 tiles of 64x56 against 224 of 64x32), outside
# NARROW_WAVE_SKIP_ROWS. On the H100 (bench/sm90_narrow.py --block-n 32 56 64 --pdl 2,
# 3 reps, twenty-ninth session; us, the dispatch then against 64x56 s8): (1, 7168, 2048) 7.15 -> 6.96 (64x64),
# (8, ...) 7.32 -> 7.07, (64, ...) 7.86 -> 7.76 (s12 7.71); at 16 and 32 rows (A boxes of 16 and 32 rows, 64x32
# tiles two to an SM) 7.32 against 7.31 and 7.31 against 7.39, so those keep 64x32.
NARROW_WAVE_BLOCK_N = 56
NARROW_WAVE_SKIP_ROWS = range(16, 49)
NARROW_WIDE_MAX_ROWS = 112
NARROW_WIDE_STAGES = 9  # the most 64x112 ring slots (fp8_gemm_sm90_narrow_stages(112): 22.8 KB each)
NARROW_MAX_K = 128 * 1024  # the tile's B-scale row (one float per K block) fills a 4 KB shared buffer
NARROW_SPLIT_FILL = 0.875  # where the swapped kernel would split K: the share of SMs 64x32 tiles must fill
# The narrow kernel's launch where USE_PDL: csrc's pdl 2, a programmatic dependent that lets the next one launch
# once its last load is issued (the next grid's set-up then overlaps this one's tail, on SMs it leaves free
# or beside its CTAs where two fit). On the H100 (bench/sm90_narrow.py --pdl 0 1 2, twenty-seventh session)
# at the dispatch's tiles: (16, 7168, 2048) 8.26 us plain, 8.10 with pdl 1 (a dependent that lets the next
# launch only as it exits, as DeepGEMM's set_pdl does), 7.31 with pdl 2; (64, 4096, 7168) 13.71, 13.54, 12.76.
NARROW_PDL = 2


def narrow_pdl() -> int:
    """The narrow kernel's pdl argument: NARROW_PDL where USE_PDL, else 0 (a plain launch). It waits for
    the kernel before (griddepcontrol.wait) before it touches global memory (tests/gemm/test_pdl.py)."""
    return NARROW_PDL if USE_PDL else 0


# sm90_ws's launch where USE_PDL: its pdl 2 (a programmatic dependent whose partitions wait before they touch
# global memory, and whose producer lets the next dependent launch once it issued its last load). On the H100
# (bench/sm90_narrow.py, 5 reps, twenty-eighth session; us plain / pdl 1 / pdl 2, DeepGEMM's PDL launch beside):
# (128, 7168, 2048) in 128x64 tiles 10.0 / 9.8 / 8.9 (9.1); (256, 7168, 2048) in 128x128 11.7 / 11.6 / 10.9
# (10.9); (256, 4096, 7168) in 128x64 19.9 / 18.9 / 18.7 (18.6; that tile's times spread over 18.3-21.3 in
# every mode, DeepGEMM's over 18.5-18.7).
WS_PDL = 2


def ws_pdl() -> int:
    """sm90_ws.launch's pdl argument: WS_PDL where USE_PDL, else 0 (a plain launch)."""
    return WS_PDL if USE_PDL else 0


def narrow_block_n(m: int, n: int, sms: int) -> int:
    """The narrow kernel's tile width for M rows and N columns on `sms` SMs: NARROW_BLOCK_N up to
    SWAP_MAX_ROWS, replaced by NARROW_WAVE_BLOCK_N where its tiles make one wave and the default's do not
    (outside NARROW_WAVE_SKIP_ROWS); above 64x112 where more than `sms` tiles of 64x64 would make a second
    wave and M is at most NARROW_WIDE_MAX_ROWS, else 64."""
    if m <= SWAP_MAX_ROWS:
        if m not in NARROW_WAVE_SKIP_ROWS and cdiv(n, NARROW_BLOCK_N) > sms >= cdiv(n, NARROW_WAVE_BLOCK_N):
            return NARROW_WAVE_BLOCK_N
        return NARROW_BLOCK_N
    if m > NARROW_WIDE_MAX_ROWS or cdiv(m, 64) * cdiv(n, 64) <= sms:
        return 64
    return NARROW_WIDE_BLOCK_N


def narrow_stages(k: int, block_n: int = NARROW_BLOCK_N) -> int:
    """The narrow kernel's ring slots for K: a quarter of its K blocks, 6 to 12 (bench/sm90_narrow.py:
    K=7168's 56 blocks ran fastest with 12, K=2048's 16 with 6 in 64x32 tiles; a deep ring over few blocks
    front-loads its loads), at least 8 for 64x64 and 64x56 tiles (at K=2048 8 beat 6 on the H100 and the H200,
    1-64 rows, twenty-sixth, twenty-seventh and twenty-ninth sessions), at most NARROW_WIDE_STAGES for 64x112
    tiles."""
    stages = min(12, max(8 if block_n in (64, NARROW_WAVE_BLOCK_N) else 6, cdiv(k, GRAN) // 4))
    return min(stages, NARROW_WIDE_STAGES) if block_n == NARROW_WIDE_BLOCK_N else stages


def narrow_refusal(a, sa, b, sb, out, packed_a=False, sb_div=GRAN) -> str | None:
    """None when a dense call runs the CUDA narrow kernel, else why not (the swapped kernel, sm90_ws or
    the Triton kernels take it then)."""
    if not USE_NARROW:
        return "USE_NARROW is off"
    if not (NARROW_MIN_ROWS <= a.shape[0] <= NARROW_MAX_ROWS):
        return f"M={a.shape[0]} outside {NARROW_MIN_ROWS}..{NARROW_MAX_ROWS}"
    if a.shape[1] > NARROW_MAX_K:
        return f"K={a.shape[1]} > {NARROW_MAX_K}"
    if not _ext.available():
        return f"the CUDA extension is absent: {_ext.unavailable_reason()}"
    if not _ext.has("fp8_gemm_sm90_narrow"):
        return "the CUDA extension predates the narrow kernel (rebuild it: python3 tools/build_ext.py)"
    if sm90_ws is None:
        return "this Triton has no Gluon (sm90_ws's operand rules)"
    arch = A.detect(a.device)
    if (arch.major, arch.minor) != (9, 0):
        return f"needs SM90, got {arch.name}"
    if out.data_ptr() % 16 or (out.stride(0) * out.element_size()) % 16:
        return "needs out's start and row stride 16-byte aligned"
    m, k = a.shape
    n, sms = b.shape[0], A.num_sms(a.device.index or 0)
    bn = narrow_block_n(m, n, sms)
    if m <= SWAP_MAX_ROWS:  # the swapped kernel's rows: its K splits decide
        splits, tiles = swap_config(m, n, k, m, sms)[3], cdiv(n, bn)
        # a split grid spreads the weight's reads over more SMs; the narrow tiles must fill nearly as many
        if splits > 1 and tiles < NARROW_SPLIT_FILL * sms:
            return (f"the swapped kernel splits K {splits} ways and {tiles} tiles of 64x{bn} "
                    f"fill fewer than {NARROW_SPLIT_FILL} of {sms} SMs")
    elif (tiles := cdiv(m, 64) * cdiv(n, bn)) > sms:
        return f"{tiles} tiles of 64x{bn} over {sms} SMs"
    elif (ws := sm90_ws.grid(m, n, k, sms)[3]) > 1:  # too few tiles: sm90_ws's K splits fill the GPU
        return f"sm90_ws splits K {ws} ways"
    return sm90_ws.operand_refusal(a, sa, b, sb, out, packed_a=packed_a, sb_div=sb_div)


SWAP_WS_MIN_ROWS = 33  # dense M from which sm90_ws's 64-row tiles replace the swapped kernel (see ws_before_swap)
# Whether 64-row sm90_ws grids that split K replace the swapped kernel too ((64, 4096, 7168): 64 tiles of
# 64x64 in 2 K splits); bench/sb_prefetch.py --ws-split times it (docs/perf.md, twelfth #28 session).
WS_SPLIT_BEFORE_SWAP = False


def ws_before_swap(m: int, n: int, k: int, device: torch.device) -> bool:
    """Dense calls of SWAP_WS_MIN_ROWS..SWAP_MAX_ROWS rows whose sm90_ws grid is 64-row tiles filling
    the GPU without K splits take sm90_ws first (if its plan accepts them): at (64, 7168, 2048) its
    112 64x64 tiles took 6.6 us against the swapped kernel's 7.45 (bench/decode_sweep.py --only
    half, H200). Fewer rows keep the swapped kernel (16-token MMAs), as do grids that would split unless
    WS_SPLIT_BEFORE_SWAP."""
    if not (SWAP_WS_MIN_ROWS <= m <= SWAP_MAX_ROWS and USE_WS and sm90_ws is not None and device.type == "cuda"
            and not triton_env.interpreting()):
        return False
    sms = A.num_sms(device.index or 0)
    bm, _, tiles, splits = sm90_ws.grid(m, n, k, sms)
    if bm != sm90_ws.HALF_BM:
        return False
    return WS_SPLIT_BEFORE_SWAP if splits > 1 else tiles >= sm90_ws.MIN_FILL * sms


def ws_splits(mode, a, b) -> int:
    """K splits sm90_ws takes for this call (dense grids smaller than the GPU; 1 otherwise)."""
    if mode != DENSE:
        return 1
    m, k = a.shape
    return sm90_ws.grid(m, b.shape[0], k, A.num_sms(a.device.index or 0))[3]


def _tma_ok(*tensors) -> bool:
    """TMA copies need 16-byte aligned bases and row strides, and a contiguous last dim."""
    return all(t.stride(-1) == 1 and t.data_ptr() % 16 == 0 and all(st % 16 == 0 for st in t.stride()[:-1])
               for t in tensors)


def _tma_rows(a, b):
    """A as the [rows, K] view its TMA descriptor reads (masked [E, M, K]: [E * M, K], which needs
    its experts M rows apart), or None where TMA cannot read it or the weights b (contiguous)."""
    if not b.is_contiguous() or (a.dim() == 3 and a.stride(0) != a.shape[1] * a.stride(1)):
        return None
    a2 = a.reshape(-1, a.shape[-1])
    return a2 if _tma_ok(a2, b) else None


SPLIT_K_MIN_BLOCKS = 16  # K blocks each split keeps at least (the pipeline's depth needs a run)
SPLIT_K_MAX = 4


def split_k(mode, tiles: int, nk: int, sms: int | None) -> int:
    """Splits of K for a dense grid too small for the GPU (sms None: no GPU, the interpreter): as
    many as fill the SMs (at most SPLIT_K_MAX) while each split keeps SPLIT_K_MIN_BLOCKS K blocks;
    1 otherwise. FORCE_SPLIT_K overrides (dense only)."""
    if mode != DENSE:
        return 1
    if FORCE_SPLIT_K is not None:
        return FORCE_SPLIT_K
    if sms is None or 2 * tiles > sms:
        return 1
    return max(1, min(SPLIT_K_MAX, sms // tiles, nk // SPLIT_K_MIN_BLOCKS))


FORCE_SPLIT_K = None  # tests set it to run the split path on any shape (and under the interpreter)


RING_RESERVE = 4096  # bytes of a block's shared memory kept beside a software-pipelined ring (barriers, scratch)


def _gpu_limits(device: torch.device) -> tuple[int | None, int | None]:
    """(SMs, a block's shared memory in bytes) of device, what launch shapes are sized from; (None,
    None) under the interpreter (no GPU: no limits)."""
    if triton_env.interpreting():
        return None, None
    return A.num_sms(device.index or 0), A.detect(device).smem_per_block


def ring_stages(stages: int, slot_bytes: int, smem: int | None) -> int:
    """A Triton kernel's pipeline depth: `stages`, or fewer (at least 2) where a block's shared
    memory (smem bytes, Arch.smem_per_block; None: no limit, the interpreter) cannot hold that many
    slot_bytes slots beside RING_RESERVE. configs.json's depths were tuned on the H200 (227 KiB);
    SM120 blocks get 99 KiB, where they would not launch (tests/gemm/test_shared_memory_fit.py
    compiles both kernels for sm_90, sm_100 and sm_120)."""
    return stages if smem is None else max(2, min(stages, (smem - RING_RESERVE) // slot_bytes))


def _launch_tma(mode, a, b, d, sa, sb, grp, cnt, m, n, k, e, tiles_m, sb_div, packed_a, packed_b, bm, bn, bk, warps,
                stages, group_m) -> bool:
    """Dense / contiguous / masked through the persistent TMA kernel; False when it does not apply
    (USE_TMA off, operands TMA cannot read: _tma_rows).

    A dense grid with fewer than half as many tiles as SMs splits K (split_k): the partials go
    to an FP32 workspace [S, M, N] and are added in split order, then rounded to BF16 once. The
    summation order differs from the unsplit kernel by that one regrouping (FP32 partials of
    consecutive K-block runs), so the BF16 result can differ from it in the last bit."""
    a2 = _tma_rows(a, b) if USE_TMA else None
    if a2 is None:
        return False
    from triton.tools.tensor_descriptor import TensorDescriptor

    b2 = b.reshape(-1, k)  # [E * N, K]
    a_desc = TensorDescriptor.from_tensor(a2, [bm, bk])
    b_desc = TensorDescriptor.from_tensor(b2, [bn, bk])
    tiles = tiles_m * cdiv(n, bn) * (e if mode == MASKED else 1)
    sms, smem = _gpu_limits(a.device)
    splits = split_k(mode, tiles, cdiv(k, bk), sms)
    stages = ring_stages(stages, (bm + bn) * bk, smem)
    target = d if splits == 1 else torch.empty(splits, m, n, dtype=torch.float32, device=d.device)
    progs = tiles * splits if sms is None else min(tiles * splits, sms)
    sb_e, sb_n, sb_k = _strides3(sb)
    _fp8_gemm_tma_kernel[(progs,)](
        a_desc, b_desc, target, sa, sb, grp, cnt, m, n, k, e, tiles_m, progs,
        target.stride(-2), target.stride(-1), sa.stride(-2), sa.stride(-1), sb_e, sb_n, sb_k,
        SB_ROW_DIV=sb_div, PACKED_A=packed_a, PACKED_B=packed_b, MODE=mode,
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=group_m, STAGES=stages, num_warps=warps,
        SPLIT_K=splits, stride_ws=target.stride(0) if splits > 1 else 0,
        stride_de=d.stride(0) if mode == MASKED else 0, stride_sae=sa.stride(0) if mode == MASKED else 0,
    )
    if splits > 1:
        _reduce_splits(target, d)  # a fixed-order reduction over the splits, one rounding to BF16
    return True


USE_SWAP = True  # tests patch it to False to compare with the TMA / pointer kernels
SWAP_MAX_ROWS = 64  # dense M, or masked expected_m, up to which the swapped (decode) kernel runs
SWAP_BLOCK_N = 128  # weight rows per program (the MMA's M side)
# Ring slots (bench/decode_sweep.py on the H200, weights in device memory: operand sets rotated past the
# L2, docs/perf.md): a grid of at most one program per SM takes SWAP_STAGES (--only ring: 6 beat 3, 4
# and 8 on every dense decode shape but one); larger grids, masked ones included, SWAP_STAGES_WAVES
# (--only masked: at expected_m 64, 4 slots beat 6 by 10-20 %: two programs fit an SM). Fewer where a
# block's shared memory cannot hold them (swap_config: SM120's 99 KiB).
SWAP_STAGES, SWAP_STAGES_WAVES = 6, 4
SWAP_MIN_BLOCKS = 8  # K blocks each split keeps at least (swapped kernel)
SWAP_SPLIT_MAX = 8


def swap_config(rows: int, n: int, k: int, m: int | None, sms: int | None,
                smem: int | None = None) -> tuple[int, int, int, int]:
    """(BLOCK_N, BLOCK_T, STAGES, SPLIT_K) of the swapped kernel for `rows` rows (dense M or masked
    expected_m): BLOCK_T the power of two >= rows (16 to 64). A dense call (m its M; None: masked)
    whose grid of SWAP_BLOCK_N-row tiles leaves SMs idle first halves BLOCK_N (when that fills
    half the SMs), else splits K, each split keeping SWAP_MIN_BLOCKS K blocks (sms None: no GPU,
    neither unless forced). bench/decode_sweep.py on the H200: N=7168 K=2048 is fastest in 64-row
    tiles unsplit, N=4096 K=7168 in 128-row tiles split 4. STAGES: SWAP_STAGES for a dense grid of
    at most one program per SM (or no GPU), else SWAP_STAGES_WAVES; ring_stages takes fewer where smem
    (the block's shared memory in bytes; None: no limit) cannot hold that many (BLOCK_N + BLOCK_T) x
    128-byte slots."""
    bt = min(64, max(16, triton.next_power_of_2(max(rows, 1))))
    bn, splits = SWAP_BLOCK_N, 1
    if m is not None and FORCE_SPLIT_K is not None:
        splits = FORCE_SPLIT_K
    elif m is not None and sms is not None:
        progs = cdiv(n, bn) * cdiv(m, bt)
        if progs >= sms:
            pass
        elif 4 * progs >= sms and bn > 64:
            bn = 64
        else:
            splits = max(1, min(SWAP_SPLIT_MAX, sms // progs, cdiv(k, GRAN) // SWAP_MIN_BLOCKS))
    one_wave = m is not None and (sms is None or cdiv(n, bn) * cdiv(m, bt) * splits <= sms)
    stages = SWAP_STAGES if one_wave else SWAP_STAGES_WAVES
    return bn, bt, ring_stages(stages, (bn + bt) * GRAN, smem), splits


def _launch_swap(mode, a, sa, b, sb, grp, out, rows, packed_a, packed_b, sb_div) -> bool:
    """Dense (a [M, K]) or masked (a [E, M, K]) through _fp8_gemm_swap_kernel; False when it does
    not apply (USE_SWAP off, more than SWAP_MAX_ROWS rows, operands TMA cannot read)."""
    a2 = _tma_rows(a, b) if USE_SWAP and rows <= SWAP_MAX_ROWS else None  # masked: [E * M, K]
    if a2 is None:
        return False
    k = a.shape[-1]
    m, n = a.shape[-2], b.shape[-2]
    from triton.tools.tensor_descriptor import TensorDescriptor

    sms, smem = _gpu_limits(a.device)
    bn, bt, stages, splits = swap_config(rows, n, k, None if mode == MASKED else m, sms, smem)
    grid = (cdiv(n, bn) * splits, 1, a.shape[0]) if mode == MASKED else (cdiv(n, bn) * splits, cdiv(m, bt), 1)
    target = out if splits == 1 else torch.empty(splits, m, n, dtype=torch.float32, device=out.device)
    (sa_e, sa_m, sa_k), (sb_e, sb_n, sb_k), (d_e, d_m, d_n) = _strides3(sa), _strides3(sb), _strides3(out)
    if splits > 1:
        d_e, d_m, d_n = 0, target.stride(1), target.stride(2)
    _fp8_gemm_swap_kernel[grid](
        TensorDescriptor.from_tensor(a2, [bt, GRAN]), TensorDescriptor.from_tensor(b.reshape(-1, k), [bn, GRAN]),
        target, sa, sb, grp, m, n, k, d_m, d_n, d_e, sa_e, sa_m, sa_k, sb_e, sb_n, sb_k,
        SB_ROW_DIV=sb_div, PACKED_A=packed_a, PACKED_B=packed_b, MODE=mode, BLOCK_N=bn, BLOCK_T=bt, STAGES=stages,
        SPLIT_K=splits, stride_ws=target.stride(0) if splits > 1 else 0, num_warps=4,
        **_pdl_args(out.device, splits > 1),
    )
    if splits > 1:
        _reduce_splits(target, out)
    return True


USE_PDL = True  # tests patch it to False to compare with plain launches


def _pdl_args(device: torch.device, on: bool = True) -> dict:
    """Launch arguments of a kernel taking a PDL constexpr: programmatic dependent launch where `on`
    and USE_PDL, on an SM90+ GPU with a Triton that has grid dependency control; else none."""
    if not (on and USE_PDL and HAS_GDC) or triton_env.interpreting() or A.detect(device).major < 9:
        return {}
    return {"PDL": True, "launch_pdl": True}


def _reduce_splits(ws, out):
    """out = bf16(sum of the FP32 partials ws [S, M, N] in split order): one launch, dependent on
    the GEMM's (programmatic dependent launch: it starts launching during the GEMM's tail)."""
    s, m, n = ws.shape
    block = 1024 if not triton_env.interpreting() else max(16, min(4096, triton.next_power_of_2(m * n)))
    _split_reduce_kernel[(cdiv(m * n, block),)](ws, out, m * n, n, out.stride(0), SPLITS=s, BLOCK=block,
                                                num_warps=4, **_pdl_args(out.device))


def check_dense(a, sa, b, sb, out=None):
    """Validate a dense call (every backend runs this first): (out, packed_a, packed_b, sb_div)."""
    _check_fp8(a, "a", 2)
    _check_fp8(b, "b", 2)
    m, k = a.shape
    n = b.shape[0]
    if b.shape[1] != k:
        raise ValueError(f"b has K={b.shape[1]}, a has K={k}")
    packed_a = _check_scale(sa, "sa", (), m, k)
    packed_b, sb_div = check_b_scales(sb, (), n, k)
    _same_device(a.device, b=b, sa=sa, sb=sb)
    return _check_out(out, (m, n), a.device), packed_a, packed_b, sb_div


def fp8_gemm_nt(a, sa, b, sb, out=None):
    """Dense: a [M, K], b [N, K] -> out [M, N] bf16."""
    out, packed_a, packed_b, sb_div = check_dense(a, sa, b, sb, out)
    m, k = a.shape
    n = b.shape[0]
    if m == 0 or n == 0:
        return out
    if narrow_refusal(a, sa, b, sb, out, packed_a, sb_div) is None:
        bn = narrow_block_n(m, n, A.num_sms(a.device.index or 0))
        _ext.fp8_gemm_sm90_narrow(a, sa, b, sb, out, bn, narrow_stages(k, bn), pdl=narrow_pdl())
        return out
    if ws_before_swap(m, n, k, a.device) and _launch_ws(DENSE, a, sa, b, sb, sb, sb, 1, out, packed_a, sb_div):
        return out
    if _launch_swap(DENSE, a, sa, b, sb, sb, out, m, packed_a, packed_b, sb_div):  # M <= SWAP_MAX_ROWS
        return out
    if _launch_ws(DENSE, a, sa, b, sb, sb, sb, 1, out, packed_a, sb_div):  # ids / counters: unread when dense
        return out
    bm, bn, bk, warps, stages, gm = _config(m, n, k)
    tiles_m = cdiv(m, bm)
    if not _launch_tma(DENSE, a, b, out, sa, sb, a, a, m, n, k, 1, tiles_m, sb_div, packed_a, packed_b, bm, bn, bk,
                       warps, stages, gm):
        _launch((tiles_m * cdiv(n, bn), 1), DENSE, a, b, out, sa, sb, a, a, m, n, k, 1, tiles_m, sb_div, packed_a,
                packed_b, bm, bn, bk, warps, stages, gm)
    return out


def _check_counters(counters, device):
    if (not isinstance(counters, torch.Tensor) or counters.dtype != torch.int32 or counters.shape != (2,)
            or counters.device != device or not counters.is_contiguous()):
        raise ValueError("counters must be contiguous int32 of shape (2,) on a's device")
    return counters


def check_contiguous(a, sa, b, sb, m_indices, out=None, counters=None, alignment=128):
    """Validate an m-grouped contiguous call: (out, counters, packed_a, packed_b, sb_div)."""
    _check_fp8(a, "a", 2)
    _check_fp8(b, "b", 3)
    m, k = a.shape
    e, n = b.shape[:2]
    if b.shape[2] != k:
        raise ValueError(f"b has K={b.shape[2]}, a has K={k}")
    if (not isinstance(m_indices, torch.Tensor) or m_indices.dtype != torch.int32 or m_indices.shape != (m,)
            or not m_indices.is_contiguous()):
        got = ((m_indices.dtype, tuple(m_indices.shape), m_indices.stride()) if isinstance(m_indices, torch.Tensor)
               else m_indices)
        raise ValueError(f"m_indices must be int32 of shape ({m},) and contiguous, got {got}")
    packed_a = _check_scale(sa, "sa", (), m, k)
    packed_b, sb_div = check_b_scales(sb, (e,), n, k)
    _same_device(a.device, b=b, sa=sa, sb=sb, m_indices=m_indices)
    out = _check_out(out, (m, n), a.device)
    counters = torch.zeros(2, dtype=torch.int32, device=a.device) if counters is None else _check_counters(counters,
                                                                                                           a.device)
    if isinstance(alignment, bool) or not isinstance(alignment, int) or alignment < 16 or alignment % 16:
        raise ValueError(f"alignment must be a positive multiple of 16 (tile rows share one expert), got {alignment!r}")
    return out, counters, packed_a, packed_b, sb_div


def m_grouped_fp8_gemm_nt_contiguous(a, sa, b, sb, m_indices, out=None, counters=None, alignment=128):
    """a [M_sum, K] rows grouped by expert (m_indices [M_sum] int32, -1 = padding),
    b [E, N, K] -> out [M_sum, N]. Every expert segment starts at a multiple of
    `alignment` (the mk-alignment, a multiple of 16); the tile height divides it.

    -1 rows are unspecified by the backend contract (DeepGEMM leaves them unwritten); this kernel
    writes zeros there and counts them (counters[0]), and zeroes and counts invalid ids (counters[1])."""
    out, counters, packed_a, packed_b, sb_div = check_contiguous(a, sa, b, sb, m_indices, out, counters, alignment)
    m, k = a.shape
    e, n = b.shape[:2]
    if m == 0 or n == 0:
        return out
    if _launch_ws(CONTIGUOUS, a, sa, b, sb, m_indices, counters, e, out, packed_a, sb_div, alignment):
        return out
    bm, bn, bk, warps, stages, gm = _config(m, n, k)
    bm = max(d for d in (16, 32, 64, 128) if alignment % d == 0 and d <= bm)
    tiles_m = cdiv(m, bm)
    if not _launch_tma(CONTIGUOUS, a, b, out, sa, sb, m_indices, counters, m, n, k, e, tiles_m, sb_div, packed_a,
                       packed_b, bm, bn, bk, warps, stages, gm):
        _launch((tiles_m * cdiv(n, bn), 1), CONTIGUOUS, a, b, out, sa, sb, m_indices, counters, m, n, k, e, tiles_m,
                sb_div, packed_a, packed_b, bm, bn, bk, warps, stages, gm)
    return out


def check_masked(a, sa, b, sb, masked_m, out=None):
    """Validate an m-grouped masked call: (out, packed_a, packed_b, sb_div)."""
    _check_fp8(a, "a", 3)
    _check_fp8(b, "b", 3)
    e, mmax, k = a.shape
    if b.shape[0] != e:
        raise ValueError(f"b has {b.shape[0]} experts, a has {e}")
    n = b.shape[1]
    if b.shape[2] != k:
        raise ValueError(f"b has K={b.shape[2]}, a has K={k}")
    if (not isinstance(masked_m, torch.Tensor) or masked_m.dtype != torch.int32 or masked_m.shape != (e,)
            or not masked_m.is_contiguous()):
        raise ValueError(f"masked_m must be int32 of shape ({e},) and contiguous")
    packed_a = _check_scale(sa, "sa", (e,), mmax, k)
    packed_b, sb_div = check_b_scales(sb, (e,), n, k)
    _same_device(a.device, b=b, sa=sa, sb=sb, masked_m=masked_m)
    return _check_out(out, (e, mmax, n), a.device), packed_a, packed_b, sb_div


def check_expected_m(expected_m):
    if expected_m is not None and (isinstance(expected_m, bool) or not isinstance(expected_m, int) or expected_m < 1):
        raise ValueError(f"expected_m must be a positive int (rows per expert, a tile-size hint) or None, "
                         f"got {expected_m!r}")


def m_grouped_fp8_gemm_nt_masked(a, sa, b, sb, masked_m, expected_m=None, out=None, counters=None):
    """a [E, Mmax, K], b [E, N, K], masked_m [E] int32 -> out [E, Mmax, N]; rows >= masked_m[e] unspecified.

    masked_m lives on the device, so the host cannot check it without a sync: an entry outside
    [0, Mmax] is clamped (negative: no rows; above: Mmax rows) and, when `counters` (int32 [2])
    is given, counted there: counters[0] += negative entries, counters[1] += entries above Mmax.

    The grouped contract (rtp_fp8.gemm.backends): rows past masked_m[e] are unspecified and callers
    must not read them. This kernel happens to leave them as they were; DeepGEMM writes whole row
    tiles past masked_m.

    expected_m (a hint of the typical rows per expert) picks the tile size."""
    out, packed_a, packed_b, sb_div = check_masked(a, sa, b, sb, masked_m, out)
    check_expected_m(expected_m)
    if counters is not None:
        _check_counters(counters, a.device)
    e, mmax, k = a.shape
    n = b.shape[1]
    if e == 0 or mmax == 0 or n == 0:
        return out
    rows = expected_m if expected_m is not None else mmax
    bm, bn, bk, warps, stages, gm = _config(rows, n, k)
    tiles_m = cdiv(mmax, bm)
    if (_launch_ws(MASKED, a, sa, b, sb, masked_m, counters, e, out, packed_a, sb_div, expected_m=rows)
            or _launch_swap(MASKED, a, sa, b, sb, masked_m, out, rows, packed_a, packed_b, sb_div)
            or _launch_tma(MASKED, a, b, out, sa, sb, masked_m, masked_m, mmax, n, k, e, tiles_m, sb_div, packed_a,
                           packed_b, bm, bn, bk, warps, stages, gm)):
        if counters is not None:  # the pointer kernel counts in-kernel; these three leave it to two device ops
            counters.add_(torch.stack(((masked_m < 0).sum(), (masked_m > mmax).sum())).to(torch.int32))
        return out
    grid = (tiles_m * cdiv(n, bn), e)
    _launch(grid, MASKED, a, b, out, sa, sb, masked_m, masked_m if counters is None else counters, mmax, n, k, e,
            tiles_m, sb_div, packed_a, packed_b, bm, bn, bk, warps, stages, gm, count_masked=counters is not None)
    return out
