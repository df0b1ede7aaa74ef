"""Block-scaled FP8 GEMM for SM90 in Gluon (Triton's explicit-layout dialect): dense and
m-grouped contiguous, FP32 scales (A 1x128 per-row groups, B 128x128 blocks).

Why a second kernel: in plain Triton the per-K-step promotion `acc += dot(a, b) * scale`
waits for each MMA before the next is issued, so the tensor cores idle while the
promotion runs (block_scaled.py tops out near 740 TFLOP/s on the H200). Here each K step's
warpgroup MMA is issued asynchronously into a fresh register tile and the *previous*
step's tile is promoted while it runs (`warpgroup_mma_wait(1)`), so MMA and promotion
overlap; TMA loads run STAGES - 1 steps ahead through an mbarrier ring.

Walk: a persistent program visits tiles pid, pid + nprog, ... (grouped-M swizzle), each
tile nk = cdiv(K, 128) steps, as one flat sequence of steps so that loads, MMAs and the
epilogue of one tile overlap the next tile's first steps. Contiguous mode: a tile whose
first row's expert id is -1 or out of range is zero-stored (and its rows counted) in a
pre-pass and is not part of the walk (no loads, no MMA); in a valid tile, rows whose id
differs from the tile's are stored as zeros and counted (same contract as the Triton
kernels in block_scaled.py, which stay the path for every other case).

Needs: SM90, BLOCK_N == 128 (one B scale per step, folded into A's row scales), FP32
scales, 16-byte aligned operands (TMA). block_scaled.py decides when it applies.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

BLOCK_M, BLOCK_N, BLOCK_K = 128, 128, 128
NUM_WARPS = 8  # two warpgroups, 64 rows each
STAGES = 4


@gluon.jit
def _coords(t, TILES_M, tiles_n, GROUP_M: gl.constexpr):
    """(pid_m, pid_n) of linear tile t: GROUP_M row tiles walked together (B reuse in L2)."""
    width = GROUP_M * tiles_n
    first_m = (t // width) * GROUP_M
    size_m = gl.minimum(TILES_M - first_m, GROUP_M)
    return first_m + (t % width) % size_m, (t % width) // size_m


@gluon.jit
def _expert(grp_ptr, t, num_tiles, TILES_M, tiles_n, BM: gl.constexpr, GROUP_M: gl.constexpr, MODE: gl.constexpr):
    """Expert id of tile t (its first row's), contiguous mode; 0 in dense mode."""
    if MODE == 1:
        pid_m, pid_n = _coords(t, TILES_M, tiles_n, GROUP_M)
        return gl.load(grp_ptr + pid_m * BM, mask=t < num_tiles, other=0)
    else:
        return t * 0


@gluon.jit
def _next_valid(t, nprog, num_tiles, grp_ptr, E, TILES_M, tiles_n, BM: gl.constexpr, GROUP_M: gl.constexpr,
                MODE: gl.constexpr):
    """First tile >= t (stepping by nprog) that has work: any tile in dense mode; one whose
    expert id lies in [0, E) in contiguous mode."""
    if MODE == 1:
        e = _expert(grp_ptr, t, num_tiles, TILES_M, tiles_n, BM, GROUP_M, MODE)
        while (t < num_tiles) & ((e < 0) | (e >= E)):
            t += nprog
            e = _expert(grp_ptr, t, num_tiles, TILES_M, tiles_n, BM, GROUP_M, MODE)
    return t


@gluon.jit
def _issue_load(a_desc, b_desc, bars, a_bufs, b_bufs, prod, tile, kb, num_tiles, N, grp_ptr, TILES_M, tiles_n,
                BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr, GROUP_M: gl.constexpr, STAGES: gl.constexpr,
                MODE: gl.constexpr):
    """TMA loads of step (tile, kb) into ring slot prod % STAGES (none past the last tile)."""
    live = tile < num_tiles
    pid_m, pid_n = _coords(tile, TILES_M, tiles_n, GROUP_M)
    e = _expert(grp_ptr, tile, num_tiles, TILES_M, tiles_n, BM, GROUP_M, MODE)
    s = prod % STAGES
    bar = bars.index(s)
    mbarrier.expect(bar, a_desc.block_type.nbytes + b_desc.block_type.nbytes, pred=live)
    tma.async_copy_global_to_shared(a_desc, [pid_m * BM, kb * BK], bar, a_bufs.index(s), pred=live)
    tma.async_copy_global_to_shared(b_desc, [e * N + pid_n * BN, kb * BK], bar, b_bufs.index(s), pred=live)
    return prod + 1


@gluon.jit
def _advance(tile, kb, nk, nprog, num_tiles, grp_ptr, E, TILES_M, tiles_n, BM: gl.constexpr, GROUP_M: gl.constexpr,
             MODE: gl.constexpr):
    kb += 1
    if kb == nk:
        kb = 0
        tile = _next_valid(tile + nprog, nprog, num_tiles, grp_ptr, E, TILES_M, tiles_n, BM, GROUP_M, MODE)
    return tile, kb


@gluon.jit
def _step_scale(sa_ptr, sb_ptr, grp_ptr, tile, kb, M, num_tiles, TILES_M, tiles_n, stride_sam, stride_sak,
                stride_sbe, stride_sbn, stride_sbk, layout: gl.constexpr, BM: gl.constexpr, GROUP_M: gl.constexpr,
                MODE: gl.constexpr, DIAG: gl.constexpr = 0):
    """(scale_a[rows, kb], scale_b[expert, pid_n, kb]) of step (tile, kb), rows in `layout`. Kept
    apart until the promotion: a product here would wait for the loads before the next MMA
    issue (the load latency then adds to every step)."""
    live = tile < num_tiles
    pid_m, pid_n = _coords(tile, TILES_M, tiles_n, GROUP_M)
    e = _expert(grp_ptr, tile, num_tiles, TILES_M, tiles_n, BM, GROUP_M, MODE)
    rows = pid_m * BM + gl.arange(0, BM, layout=layout)
    if DIAG == 1:  # timing diagnostic only (wrong results): no scale loads
        return gl.full((BM, ), 1.0, gl.float32, layout), 1.0
    sa = gl.load(sa_ptr + rows * stride_sam + kb * stride_sak, mask=live & (rows < M), other=0.0)
    sb = gl.load(sb_ptr + e * stride_sbe + pid_n * stride_sbn + kb * stride_sbk, mask=live, other=0.0)
    return sa, sb


@gluon.jit
def _store_tile(d_ptr, cnt_ptr, grp_ptr, acc, tile, e, M, N, TILES_M, tiles_n, stride_dm, layout: gl.constexpr,
                BM: gl.constexpr, BN: gl.constexpr, GROUP_M: gl.constexpr, MODE: gl.constexpr):
    """bf16 store of one output tile (rows past M, columns past N masked). Contiguous mode:
    rows whose id is not e become zeros; column tile 0 counts the -1 rows (counters[0]) and
    rows of another or an invalid id (counters[1])."""
    pid_m, pid_n = _coords(tile, TILES_M, tiles_n, GROUP_M)
    v = gl.convert_layout(acc.to(gl.bfloat16), layout)
    rows = pid_m * BM + gl.arange(0, BM, layout=gl.SliceLayout(1, layout))
    cols = pid_n * BN + gl.arange(0, BN, layout=gl.SliceLayout(0, layout))
    rmask = rows < M
    if MODE == 1:
        ids = gl.load(grp_ptr + rows, mask=rmask, other=-1)
        ok = rmask & (ids == e)
        v = gl.where(gl.expand_dims(ok, 1), v, gl.zeros_like(v))
        if pid_n == 0:
            gl.atomic_add(cnt_ptr, gl.sum((rmask & (ids == -1)).to(gl.int32), axis=0), sem="relaxed")
            gl.atomic_add(cnt_ptr + 1, gl.sum((rmask & (ids != -1) & (ids != e)).to(gl.int32), axis=0), sem="relaxed")
    ptrs = d_ptr + gl.expand_dims(rows, 1) * stride_dm + gl.expand_dims(cols, 0)
    gl.store(ptrs, v, mask=gl.expand_dims(rmask, 1) & gl.expand_dims(cols < N, 0))


@gluon.jit
def _gemm_kernel(a_desc, b_desc, d_ptr, sa_ptr, sb_ptr, grp_ptr, cnt_ptr, M, N, K, E, TILES_M,
                 stride_dm, stride_sam, stride_sak, stride_sbe, stride_sbn, stride_sbk,
                 MODE: gl.constexpr, GROUP_M: gl.constexpr, STAGES: gl.constexpr, num_warps: gl.constexpr,
                 DIAG: gl.constexpr = 0):
    BM: gl.constexpr = a_desc.block_type.shape[0]
    BK: gl.constexpr = a_desc.block_type.shape[1]
    BN: gl.constexpr = b_desc.block_type.shape[0]
    mma_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                         instr_shape=[16, BN, 32])
    row_layout: gl.constexpr = gl.SliceLayout(1, mma_layout)
    out_layout: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [num_warps, 1], [1, 0])

    pid = gl.program_id(0)
    nprog = gl.num_programs(0)
    tiles_n = gl.cdiv(N, BN)
    num_tiles = TILES_M * tiles_n
    nk = gl.cdiv(K, BK)

    # Contiguous pre-pass: zero-store (and count) this program's tiles without work.
    n_valid = pid * 0
    for t in range(pid, num_tiles, nprog):
        if MODE == 1:
            e = _expert(grp_ptr, t, num_tiles, TILES_M, tiles_n, BM, GROUP_M, MODE)
            if (e >= 0) & (e < E):
                n_valid += 1
            else:
                _store_tile(d_ptr, cnt_ptr, grp_ptr, gl.zeros((BM, BN), gl.float32, out_layout), t, e, M, N, TILES_M,
                            tiles_n, stride_dm, out_layout, BM, BN, GROUP_M, MODE)
        else:
            n_valid += 1
    total = n_valid * nk

    a_bufs = gl.allocate_shared_memory(a_desc.dtype, [STAGES] + a_desc.block_type.shape, a_desc.layout)
    b_bufs = gl.allocate_shared_memory(b_desc.dtype, [STAGES] + b_desc.block_type.shape, b_desc.layout)
    bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(bars.index(i), count=1)

    # Producer runs STAGES - 1 steps ahead of the consumer.
    p_tile = _next_valid(pid, nprog, num_tiles, grp_ptr, E, TILES_M, tiles_n, BM, GROUP_M, MODE)
    p_kb = pid * 0
    prod = pid * 0
    for i in gl.static_range(STAGES - 1):
        prod = _issue_load(a_desc, b_desc, bars, a_bufs, b_bufs, prod, p_tile, p_kb, num_tiles, N, grp_ptr, TILES_M,
                           tiles_n, BM, BN, BK, GROUP_M, STAGES, MODE)
        p_tile, p_kb = _advance(p_tile, p_kb, nk, nprog, num_tiles, grp_ptr, E, TILES_M, tiles_n, BM, GROUP_M, MODE)

    if total > 0:
        zero = gl.zeros((BM, BN), gl.float32, mma_layout)
        acc = gl.zeros((BM, BN), gl.float32, mma_layout)
        c_tile = _next_valid(pid, nprog, num_tiles, grp_ptr, E, TILES_M, tiles_n, BM, GROUP_M, MODE)
        c_kb = pid * 0
        mbarrier.wait(bars.index(0), 0)
        tok = warpgroup_mma(a_bufs.index(0), b_bufs.index(0).permute((1, 0)), zero, use_acc=False, is_async=True)
        # Scales are loaded two steps before their promotion (their load latency exceeds one MMA).
        sa_prev, sb_prev = _step_scale(sa_ptr, sb_ptr, grp_ptr, c_tile, c_kb, M, num_tiles, TILES_M, tiles_n,
                                       stride_sam, stride_sak, stride_sbe, stride_sbn, stride_sbk, row_layout, BM,
                                       GROUP_M, MODE, DIAG)
        prev_tile = c_tile
        prev_last = c_kb == nk - 1
        c_tile, c_kb = _advance(c_tile, c_kb, nk, nprog, num_tiles, grp_ptr, E, TILES_M, tiles_n, BM, GROUP_M, MODE)
        sa_next, sb_next = _step_scale(sa_ptr, sb_ptr, grp_ptr, c_tile, c_kb, M, num_tiles, TILES_M, tiles_n,
                                       stride_sam, stride_sak, stride_sbe, stride_sbn, stride_sbk, row_layout, BM,
                                       GROUP_M, MODE, DIAG)
        part = warpgroup_mma_wait(0, deps=(tok, ))
        for g in range(1, total):
            # MMA g runs while step g - 1 (waited at the end of the previous iteration, so its
            # registers are plain values) is promoted. Carrying a still-running MMA's result
            # across the loop edge would make ptxas serialize every wgmma (C7514).
            s = g % STAGES
            mbarrier.wait(bars.index(s), (g // STAGES) & 1)
            tok = warpgroup_mma(a_bufs.index(s), b_bufs.index(s).permute((1, 0)), zero, use_acc=False, is_async=True)
            acc = acc + part * gl.expand_dims(sa_prev * sb_prev, 1)
            if prev_last:
                e_prev = _expert(grp_ptr, prev_tile, num_tiles, TILES_M, tiles_n, BM, GROUP_M, MODE)
                _store_tile(d_ptr, cnt_ptr, grp_ptr, acc, prev_tile, e_prev, M, N, TILES_M, tiles_n, stride_dm,
                            out_layout, BM, BN, GROUP_M, MODE)
                acc = gl.zeros((BM, BN), gl.float32, mma_layout)
            prev_tile = c_tile
            prev_last = c_kb == nk - 1
            c_tile, c_kb = _advance(c_tile, c_kb, nk, nprog, num_tiles, grp_ptr, E, TILES_M, tiles_n, BM, GROUP_M,
                                    MODE)
            sa_prev, sb_prev = sa_next, sb_next
            sa_next, sb_next = _step_scale(sa_ptr, sb_ptr, grp_ptr, c_tile, c_kb, M, num_tiles, TILES_M, tiles_n,
                                           stride_sam, stride_sak, stride_sbe, stride_sbn, stride_sbk, row_layout, BM,
                                           GROUP_M, MODE, DIAG)
            # ring slot of step g - 1 is free (its MMA was waited): load step g + STAGES - 1 into it
            prod = _issue_load(a_desc, b_desc, bars, a_bufs, b_bufs, prod, p_tile, p_kb, num_tiles, N, grp_ptr,
                               TILES_M, tiles_n, BM, BN, BK, GROUP_M, STAGES, MODE)
            p_tile, p_kb = _advance(p_tile, p_kb, nk, nprog, num_tiles, grp_ptr, E, TILES_M, tiles_n, BM, GROUP_M,
                                    MODE)
            part = warpgroup_mma_wait(0, deps=(tok, ))
        acc = acc + part * gl.expand_dims(sa_prev * sb_prev, 1)
        e_prev = _expert(grp_ptr, prev_tile, num_tiles, TILES_M, tiles_n, BM, GROUP_M, MODE)
        _store_tile(d_ptr, cnt_ptr, grp_ptr, acc, prev_tile, e_prev, M, N, TILES_M, tiles_n, stride_dm, out_layout,
                    BM, BN, GROUP_M, MODE)
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(bars.index(i))


def descriptors(a, b2):
    """TMA descriptors of A [M, K] and B [E * N, K] (float8_e4m3fn) for 128x128 blocks."""
    layout = gl.NVMMASharedLayout.get_default_for([BLOCK_M, BLOCK_K], gl.float8e4nv)
    return (TensorDescriptor.from_tensor(a, [BLOCK_M, BLOCK_K], layout),
            TensorDescriptor.from_tensor(b2, [BLOCK_N, BLOCK_K], layout))


def launch(mode, a, b2, d, sa, sb3, grp, cnt, m, n, k, e, group_m, nprog, stages=STAGES, diag=0):
    """sb3: B scales as [E, ceil(N/128), ceil(K/128)] (expert stride 0 when dense)."""
    a_desc, b_desc = descriptors(a, b2)
    tiles_m = -(-m // BLOCK_M)
    _gemm_kernel[(nprog,)](a_desc, b_desc, d, sa, sb3, grp, cnt, m, n, k, e, tiles_m,
                           d.stride(0), sa.stride(0), sa.stride(1), sb3.stride(0), sb3.stride(1), sb3.stride(2),
                           MODE=mode, GROUP_M=group_m, STAGES=stages, num_warps=NUM_WARPS, DIAG=diag)
