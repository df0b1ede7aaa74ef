"""Experiment, not shipped and not selected by any backend: a warp-specialized SM90
block-scaled FP8 GEMM in Gluon, dense, FP32 scales (A 1x128 column-major TMA-aligned, B
128x128 blocks). Compiled offline for sm_90a (tests/gemm/test_sm90_ws_compile.py); its
numbers on the GPU come from bench/gemm_ws_gluon.py. It moves into rtp_fp8 only if it
beats the Triton kernel there.

Why: in block_scaled.py (plain Triton) and in a single-stream Gluon kernel (68b77e9) each K
step's promotion `acc += (a @ b) * scale` waits for that step's MMA, and every warp shares
one instruction stream, so the tensor cores idle while the promotion and the TMA issue run.
Here the work is split the way fast SM90 GEMMs do it:

- a producer warp issues the TMA loads of A [128, 128], B [128, 128] and the step's 128
  A-row scales (a 1-D box of the column-major scale tensor) into a ring of STAGES slots,
  each with a `full` barrier (TMA transaction bytes) and an `empty` one;
- two consumer warpgroups, separate partitions with their own instruction streams, each own
  64 rows of the 128x128 tile: per K step each waits `full`, issues its wgmma into a fresh
  register tile, promotes the previous step's tile while that MMA runs, waits for the MMA and
  arrives on `empty` (count 2: both consumers). As their streams drift apart one promotes
  while the other multiplies.

B's scale per (N block, K step) is one float, loaded by the consumers one step ahead.
Walk: persistent programs, tiles pid, pid + nprog, ... with the grouped-M swizzle of
block_scaled.py; all three partitions walk the same sequence.
"""

from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

BM, BN, BK, HALF = 128, 128, 128, 64


@gluon.jit
def _coords(t, TILES_M, tiles_n, GROUP_M: gl.constexpr):
    """block_scaled._swizzled_tile's walk, restated: a Gluon kernel cannot call a Triton function."""
    width = GROUP_M * tiles_n
    first_m = (t // width) * GROUP_M
    size_m = gl.minimum(TILES_M - first_m, GROUP_M)
    return first_m + (t % width) % size_m, (t % width) // size_m


@gluon.jit
def _step(c: gl.constexpr, kb, g, acc, part, sa_prev, sb_prev, a_bufs, b_bufs, sa_bufs, full, empty, sb_row, stride_sbk,
          zero, row_layout: gl.constexpr, STAGES: gl.constexpr):
    """K step kb (ring step g): its wgmma into a fresh tile, the previous step's tile promoted
    while it runs; -> (acc, this step's tile, its scales, g + 1)."""
    s = g % STAGES
    mbarrier.wait(full.index(s), (g // STAGES) & 1)
    tok = warpgroup_mma(a_bufs.index(s).slice(c * 64, 64), b_bufs.index(s).permute((1, 0)), zero, use_acc=False,
                        is_async=True)
    sa_now = sa_bufs.index(s).slice(c * 64, 64).load(row_layout)
    sb_now = gl.load(sb_row + kb * stride_sbk)
    acc = acc + part * gl.expand_dims(sa_prev * sb_prev, 1)
    part = warpgroup_mma_wait(0, deps=(tok, ))  # waited here: a running MMA carried across the loop edge
    mbarrier.arrive(empty.index(s), count=1)  # would make ptxas serialize every wgmma (C7514)
    return acc, part, sa_now, sb_now, g + 1


@gluon.jit
def _consume(c: gl.constexpr, a_bufs, b_bufs, sa_bufs, full, empty, d_ptr, sb_ptr, M, N, K, TILES_M, stride_dm,
             stride_sbn, stride_sbk, GROUP_M: gl.constexpr, STAGES: gl.constexpr, UNROLL: gl.constexpr):
    """Consumer c: rows [c * 64, c * 64 + 64) of every tile. UNROLL=2 runs two steps per loop
    trip, so that the two fresh MMA tiles can alternate registers (no copy of each result)."""
    mma_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                         instr_shape=[16, 128, 32])
    row_layout: gl.constexpr = gl.SliceLayout(1, mma_layout)
    out_layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    pid = gl.program_id(0)
    nprog = gl.num_programs(0)
    tiles_n = gl.cdiv(N, 128)
    num_tiles = TILES_M * tiles_n
    nk = gl.cdiv(K, 128)
    zero = gl.zeros((64, 128), gl.float32, mma_layout)
    no_scale = gl.zeros((64, ), gl.float32, row_layout)
    g = pid * 0
    for tile in range(pid, num_tiles, nprog):
        pid_m, pid_n = _coords(tile, TILES_M, tiles_n, GROUP_M)
        sb_row = sb_ptr + pid_n * stride_sbn
        # Step 0 promotes a zero tile with zero scales: acc stays +0, as the Triton kernel's starts.
        acc = zero
        part = zero
        sa = no_scale
        sb = 0.0
        if UNROLL == 2:
            for kb in range(0, nk - 1, 2):
                acc, part, sa, sb, g = _step(c, kb, g, acc, part, sa, sb, a_bufs, b_bufs, sa_bufs, full, empty,
                                             sb_row, stride_sbk, zero, row_layout, STAGES)
                acc, part, sa, sb, g = _step(c, kb + 1, g, acc, part, sa, sb, a_bufs, b_bufs, sa_bufs, full, empty,
                                             sb_row, stride_sbk, zero, row_layout, STAGES)
            if nk % 2 == 1:
                acc, part, sa, sb, g = _step(c, nk - 1, g, acc, part, sa, sb, a_bufs, b_bufs, sa_bufs, full, empty,
                                             sb_row, stride_sbk, zero, row_layout, STAGES)
        else:
            for kb in range(0, nk):
                acc, part, sa, sb, g = _step(c, kb, g, acc, part, sa, sb, a_bufs, b_bufs, sa_bufs, full, empty,
                                             sb_row, stride_sbk, zero, row_layout, STAGES)
        acc = acc + part * gl.expand_dims(sa * sb, 1)
        v = gl.convert_layout(acc.to(gl.bfloat16), out_layout)
        rows = pid_m * 128 + c * 64 + gl.arange(0, 64, layout=gl.SliceLayout(1, out_layout))
        cols = pid_n * 128 + gl.arange(0, 128, layout=gl.SliceLayout(0, out_layout))
        ptrs = d_ptr + gl.expand_dims(rows, 1) * stride_dm + gl.expand_dims(cols, 0)
        gl.store(ptrs, v, mask=gl.expand_dims(rows < M, 1) & gl.expand_dims(cols < N, 0))


@gluon.jit
def _consumer1(a_desc, b_desc, sa_desc, a_bufs, b_bufs, sa_bufs, full, empty, d_ptr, sb_ptr, M, N, K, TILES_M,
               stride_dm, stride_sbn, stride_sbk, m_pad, GROUP_M: gl.constexpr, STAGES: gl.constexpr,
               UNROLL: gl.constexpr):
    _consume(1, a_bufs, b_bufs, sa_bufs, full, empty, d_ptr, sb_ptr, M, N, K, TILES_M, stride_dm, stride_sbn,
             stride_sbk, GROUP_M, STAGES, UNROLL)


@gluon.jit
def _producer(a_desc, b_desc, sa_desc, a_bufs, b_bufs, sa_bufs, full, empty, d_ptr, sb_ptr, M, N, K, TILES_M,
              stride_dm, stride_sbn, stride_sbk, m_pad, GROUP_M: gl.constexpr, STAGES: gl.constexpr,
              UNROLL: gl.constexpr):
    pid = gl.program_id(0)
    nprog = gl.num_programs(0)
    tiles_n = gl.cdiv(N, 128)
    num_tiles = TILES_M * tiles_n
    nk = gl.cdiv(K, 128)
    nbytes: gl.constexpr = a_desc.block_type.nbytes + b_desc.block_type.nbytes + sa_desc.block_type.nbytes
    g = pid * 0
    for tile in range(pid, num_tiles, nprog):
        pid_m, pid_n = _coords(tile, TILES_M, tiles_n, GROUP_M)
        for kb in range(nk):
            s = g % STAGES
            mbarrier.wait(empty.index(s), ((g // STAGES) & 1) ^ 1)  # a fresh barrier passes phase 1
            # The consumers read the slot's A scales with ordinary shared loads: order those
            # before the TMA overwrites them (one fence here instead of one per consumer step).
            fence_async_shared()
            bar = full.index(s)
            mbarrier.expect(bar, nbytes)
            tma.async_copy_global_to_shared(a_desc, [pid_m * 128, kb * 128], bar, a_bufs.index(s))
            tma.async_copy_global_to_shared(b_desc, [pid_n * 128, kb * 128], bar, b_bufs.index(s))
            tma.async_copy_global_to_shared(sa_desc, [kb * m_pad + pid_m * 128], bar, sa_bufs.index(s))
            g += 1


@gluon.jit
def _ws_gemm_kernel(a_desc, b_desc, sa_desc, d_ptr, sb_ptr, M, N, K, TILES_M, stride_dm, stride_sbn, stride_sbk,
                    m_pad, GROUP_M: gl.constexpr, STAGES: gl.constexpr, UNROLL: gl.constexpr,
                    num_warps: gl.constexpr):
    a_bufs = gl.allocate_shared_memory(a_desc.dtype, [STAGES] + a_desc.block_type.shape, a_desc.layout)
    b_bufs = gl.allocate_shared_memory(b_desc.dtype, [STAGES] + b_desc.block_type.shape, b_desc.layout)
    sa_bufs = gl.allocate_shared_memory(sa_desc.dtype, [STAGES] + sa_desc.block_type.shape, sa_desc.layout)
    full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(full.index(i), count=1)
        mbarrier.init(empty.index(i), count=2)  # both consumers release a slot
    worker_args = (a_desc, b_desc, sa_desc, a_bufs, b_bufs, sa_bufs, full, empty, d_ptr, sb_ptr, M, N, K, TILES_M,
                   stride_dm, stride_sbn, stride_sbk, m_pad, GROUP_M, STAGES, UNROLL)
    gl.warp_specialize([
        (_consume, (0, a_bufs, b_bufs, sa_bufs, full, empty, d_ptr, sb_ptr, M, N, K, TILES_M, stride_dm, stride_sbn,
                    stride_sbk, GROUP_M, STAGES, UNROLL)),
        (_consumer1, worker_args),
        (_producer, worker_args),
    ], [4, 1], [232, 40])


def _descriptors(a, b, sa):
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    op = gl.NVMMASharedLayout.get_default_for([BM, BK], gl.float8e4nv)
    sa_flat = torch.as_strided(sa, (sa.stride(1) * sa.shape[1], ), (1, ))  # [KG, M_pad] storage as 1-D
    return (TensorDescriptor.from_tensor(a, [BM, BK], op), TensorDescriptor.from_tensor(b, [BN, BK], op),
            TensorDescriptor.from_tensor(sa_flat, [BM], gl.NVMMASharedLayout.get_default_for([BM], gl.float32)))


def applies(a, sa, b, sb) -> bool:
    """The shapes and layouts this kernel handles: SM90 dense, FP32 scales, A scales column-major
    with a 16-byte aligned column stride, B per 128x128 block, 16-byte aligned rows."""
    m, k = a.shape
    n = b.shape[0]
    return (a.is_cuda and torch.cuda.get_device_capability(a.device)[0] == 9 and sa.dtype == torch.float32
            and sb.dtype == torch.float32 and sa.stride(0) == 1 and sa.stride(1) % 4 == 0 and k > 0 and k % 16 == 0
            and tuple(sb.shape) == (-(-n // 128), -(-k // 128)) and a.is_contiguous() and b.is_contiguous())


def fp8_gemm_nt_ws(a, sa, b, sb, out=None, stages=4, group_m=8, nprog=None, unroll=2):
    """Dense D = A @ B^T (bf16) through the warp-specialized kernel; the caller checks applies()."""
    m, k = a.shape
    n = b.shape[0]
    out = torch.empty(m, n, dtype=torch.bfloat16, device=a.device) if out is None else out
    a_desc, b_desc, sa_desc = _descriptors(a, b, sa)
    tiles_m = -(-m // BM)
    tiles = tiles_m * -(-n // BN)
    nprog = nprog or min(tiles, torch.cuda.get_device_properties(a.device).multi_processor_count)
    _ws_gemm_kernel[(nprog, )](a_desc, b_desc, sa_desc, out, sb, m, n, k, tiles_m, out.stride(0), sb.stride(0),
                               sb.stride(1), sa.stride(1), GROUP_M=group_m, STAGES=stages, UNROLL=unroll, num_warps=4,
                               maxnreg=168)
    return out
