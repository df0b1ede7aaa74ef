"""SM90 warp-specialized block-scaled FP8 GEMM in Gluon: dense and m-grouped contiguous.

block_scaled.py routes here on an SM90 GPU when `plan()` accepts the operands (FP32 scales, A's
column-major and TMA-aligned, B's per 128x128 block, 128-row expert segments, enough tiles to
fill the GPU); everything else, and every other architecture, stays on the Triton kernels.
Results are bit-identical to the Triton kernel's (tests/gemm/test_sm90_ws.py): same tiles, the
same FP32 promotion order.

Why: in a plain Triton kernel each K step's promotion `acc += (a @ b) * scale` waits for that
step's MMA and every warp shares one instruction stream, so the tensor cores idle while the
promotion and the TMA issue run. Here the work is split as fast SM90 GEMMs split it:

- a producer warp issues the TMA loads of A [128, 128], B [128, 128] and the step's 128 A-row
  scales (a 1-D box of the column-major scale tensor) into a ring of STAGES slots, each with a
  `full` barrier (TMA transaction bytes) and an `empty` one;
- two consumer warpgroups, separate partitions with their own instruction streams, each own
  64 rows of the 128x128 tile: per K step each waits `full`, issues its wgmma into a fresh
  register tile, promotes the previous step's tile while that MMA runs, waits for the MMA and
  arrives on `empty` (count 2: both consumers). Two steps per loop trip, so that the two fresh
  tiles alternate registers. B's block scale is a scalar global load per step, or, where the tile
  stages its B-scale row (SB_STAGE_TILES), a shared load from the row the producer copied in with
  one more TMA box when it started the tile.
- epilogue: the bf16 tile through shared memory and a TMA store (EPI_TMA, when `out` allows),
  else pointer stores. Grouped: rows whose id is not the tile's expert become zeros and are
  counted, as in the Triton kernel.

Persistent programs walk tiles pid, pid + nprog, ... in block_scaled's grouped-M order; all
three partitions walk the same sequence.

Launched as a programmatic dependent (launch(pdl=1 or 2); block_scaled.ws_pdl()), every partition runs
griddepcontrol.wait before it touches global memory, so the kernel's set-up (shared memory, barriers)
overlaps the grid before it; with pdl 2 the producer runs griddepcontrol.launch_dependents once it has
issued its last load, so the next dependent's launch overlaps this grid's last MMAs and epilogue.

Tile width: launch() takes what tile_n() says: 128x256 (WIDE_BN) where N is whole wide tiles and
there are enough of them to fill the GPU, 128x64 (NARROW_BN) where even those make at most one
wave (decode-sized M), else 128x128 (BN); `bn=` forces one.
"""

from __future__ import annotations

import inspect

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

from rtp_fp8 import arch as A
from rtp_fp8.quant.layout import cdiv

# gl.warp_specialize([(fn, args), ...], warps, regs) is Triton >= 3.6's form; 3.5 (the cuda12_8
# toolchain's pin) takes (default_args, default_fn, worker_args, worker_fns, ...): plan() refuses there.
LIST_WARP_SPECIALIZE = "functions_and_args" in inspect.signature(gl.warp_specialize).parameters
BM, BK, HALF = 128, 128, 64
# Tile width. 128 (shipped): each consumer's m64n128 wgmma runs while it promotes the previous
# step (three 64x128 FP32 tiles live). WIDE_BN (256): per step each consumer runs two m64n128
# wgmmas, one per 128-column half (one B scale each), each promoted right after its wait (three
# 64x128 tiles live: two accumulators and the fresh one); the other consumer's MMAs keep the
# tensor cores busy meanwhile, and each A tile the TMA loads serves twice the FLOPs (a quarter
# less load traffic per FLOP; the wgmmas still read A from shared memory once per half).
# bench/ws_tiles.py on the H200 (docs/perf.md): WIDE_BN is 4-9 % faster on every M=4096 shape whose N
# is whole wide tiles, and 11 % slower at N=2112 (a last tile three quarters empty; 2.2 waves).
# NARROW_BN (64): each consumer's m64n64 wgmma; for grids too small for the GPU in 128-wide tiles
# (decode batches of 128-256 rows): twice the tiles, so fewer (or no) K splits.
BN = 128
WIDE_BN = 256
NARROW_BN = 64
STAGES = 5  # bench/decode_sweep.py --only ring, weights in device memory: 5 beat 4 (docs/perf.md, 2026-12-04k)
STAGES_WIDE = 3  # 48.5 KB a slot with B [256, 128]: four would not fit beside the epilogue buffers
STAGES_NARROW = 6  # 24.5 KB a slot with B [64, 128]
# HALF_BM (64-row) tiles, for dense decode batches (at most HALF_MAX_ROWS rows) of at most 64 rows, or
# whose 128-row tiles would not fill the GPU: one consumer warpgroup runs the tile's m64nBN wgmma
# (tile widths HALF_WIDTHS), so a 64-token batch fills the SMs without K splits. Two consumers each
# taking half the columns (the first design) read A's slot from shared memory twice a step: (128,
# 4096, 7168) took 14.3 us, one consumer 13.7 (docs/perf.md). STAGES_HALF: ring slots by width.
# Timed over one operand set (its weights in the L2), deeper rings ran slower (bench/decode_sweep.py
# --only half: 64 wide at (64, 7168, 2048) 5.9 us in 4 slots, 6.2 in 6); with the weights in device
# memory, as a model's layers find them (--only ring), 6 slots beat 4 (7.9 against 8.7 us there, 15.7
# against 18.2 at (128, 4096, 7168)), 8 to 12 ran slower again. 64x32 tiles lost on every decode shape.
HALF_BM, HALF_MAX_ROWS = 64, 256
# Tile heights whose producer asks the L2 for a tile's B-scale row(s) when it starts the tile, a
# ring ahead of the consumers' loads of them: the ring profile put FMULs waiting on those loads. On the
# H200 the 64-row tiles of (64, 7168, 2048) and (128, 4096, 7168) ran 0.7 and 1.0 % faster with it,
# bit-identical (bench/sb_prefetch.py, docs/perf.md, 2026-12-05 tenth session). 128-row tiles keep the
# kernel without it: timed at M=4096 (eleventh session), it was 2.4 % slower on contiguous G=32 and
# faster nowhere beyond the reps' spread.
SB_PREFETCH_ROWS = frozenset({HALF_BM})
# Tiles (mode, rows, width) that stage their B-scale row in shared memory, and the ring slots each then
# takes (None: its usual _stages): the producer copies the tile's run of K-block scales (one TMA box,
# SB_STAGE_MAX at most) into one of two buffers when it starts the tile, and the consumers read each
# step's scale there instead of a global load in the K loop, as DeepGEMM's math warps do (they copy it
# themselves). A tile that stages does not also prefetch. On the H200 (bench/sb_prefetch.py, docs/perf.md,
# 2026-12-05 eleventh session) staging alone changed nothing, but it let an 8-slot ring pay, where
# before deeper rings traded slot waits for waits on the scales' loads: dense 64x64 tiles 1.4-1.8 %
# and 128x64 tiles 3.2-4.1 % faster than shipped, in every rep, bit-identical. 128x128 tiles cannot
# hold 8 slots; contiguous and masked tiles were not timed, nor were K-split grids (SB_STAGE_SPLIT: they
# stage only when it is on; their staging is tested on the GPU, its speed unmeasured).
SB_STAGE_TILES = {(0, HALF_BM, 64): 8, (0, BM, NARROW_BN): 8}
SB_STAGE_SPLIT = False
SB_STAGE_MAX = 256  # a TMA box's elements
HALF_WIDTHS = (128, 64)
STAGES_HALF = {128: 4, 64: 6}
GROUP_M = 8
# Tiles of this many 128-column blocks or more walk GROUP_M_WIDE row tiles per group: measured on the H200
# (4096 x 24576 x 1536: 940 -> 975 TFLOP/s, 4096 x 32768 x 512: 775 -> 801; N <= 7168 within 1 % of 8).
WIDE_N_TILES, GROUP_M_WIDE = 128, 32
# TMA box and element type of each descriptor (the launch and the offline compile build from it):
# A and B tiles, the step's A-row scales, a consumer's share of the output tile.
def boxes(bn=None, bm=BM, a_rows=None, sb_k=0):
    """bm HALF_BM: a 64-row tile, stored whole by its one consumer; a_rows: A's box rows (a_box_rows);
    sb_k: the B-scale row run a tile stages (sb_stage_k; 0: none, and sb_desc is sa_desc's twin)."""
    bn = bn or BN
    cw = bn if bm == HALF_BM else min(bn, 128)
    return {"a_desc": ([a_rows or bm, BK], "float8e4nv", "fp8e4nv"), "b_desc": ([bn, BK], "float8e4nv", "fp8e4nv"),
            "sa_desc": ([bm], "float32", "fp32"), "c_desc": ([HALF, cw], "bfloat16", "bf16"),
            "sb_desc": ([sb_k or bm], "float32", "fp32")}


def _box_layout(block, dtype):
    return gl.NVMMASharedLayout.get_default_for(block, getattr(gl, dtype))


@gluon.jit
def _coords(t, TILES_M, tiles_n, GROUP_M):
    """block_scaled._swizzled_tile's walk, restated: a Gluon kernel cannot call a Triton function."""
    width = GROUP_M * tiles_n
    first_m = (t // width) * GROUP_M
    size_m = gl.minimum(TILES_M - first_m, GROUP_M)
    return first_m + (t % width) % size_m, (t % width) // size_m


@gluon.jit
def _operands(c: gl.constexpr, a_bufs, b_bufs, sa_bufs, s):
    """Consumer c's A rows, B rows and A-row scales in ring slot s: of a 128-row tile its 64 rows
    and all of B; of a 64-row (HALF_BM) tile, whose one consumer runs it, all of them."""
    if a_bufs.shape[1] == 64:
        return a_bufs.index(s), b_bufs.index(s), sa_bufs.index(s)
    else:
        return a_bufs.index(s).slice(c * 64, 64), b_bufs.index(s), sa_bufs.index(s).slice(c * 64, 64)


@gluon.jit
def _sb_at(sb_row, kb, stride_sbk, sbv, k0, SBS: gl.constexpr):
    """K block kb's B scale: SBS, from the tile's row staged in shared memory (sbv, its buffer as
    [SBK, 1], holding K blocks from k0); else a global load."""
    if SBS:
        return gl.max(sbv.index(kb - k0).load(gl.BlockedLayout([1], [32], [4], [0])), axis=0)
    else:
        return gl.load(sb_row + kb * stride_sbk)


@gluon.jit
def _step(c: gl.constexpr, kb, g, acc, part, sa_prev, sb_prev, ring, sb_row, stride_sbk, zero,
          row_layout: gl.constexpr, sbv, k0, SBS: gl.constexpr):
    """K step kb (ring step g): its wgmma into a fresh tile, the previous step's tile promoted
    while it runs; -> (acc, this step's tile, its scales, g + 1). sbv, k0, SBS: _sb_at's."""
    a_bufs, b_bufs, sa_bufs, full, empty = ring
    NSTAGES: gl.constexpr = full.shape[0]
    s = g % NSTAGES
    mbarrier.wait(full.index(s), (g // NSTAGES) & 1)
    a, b, sa = _operands(c, a_bufs, b_bufs, sa_bufs, s)
    tok = warpgroup_mma(a, b.permute((1, 0)), zero, use_acc=False, is_async=True)
    sa_now = sa.load(row_layout)
    sb_now = _sb_at(sb_row, kb, stride_sbk, sbv, k0, SBS)
    acc = acc + part * gl.expand_dims(sa_prev * sb_prev, 1)
    part = warpgroup_mma_wait(0, deps=(tok, ))  # waited here: a running MMA carried across the loop edge
    mbarrier.arrive(empty.index(s), count=1)  # would make ptxas serialize every wgmma (C7514)
    return acc, part, sa_now, sb_now, g + 1


@gluon.jit
def _step_wide(c: gl.constexpr, kb, g, acc0, acc1, ring, sb_row, stride_sbn, stride_sbk, hi_ok, zero,
               row_layout: gl.constexpr):
    """K step kb (ring step g) of a 256-column tile: per 128-column half, its wgmma, waited, then
    promoted with the half's B scale -> (acc0, acc1, g + 1). A second half past N (hi_ok false)
    multiplies TMA's zero fill with a zero scale (its scale row does not exist) and is not stored."""
    a_bufs, b_bufs, sa_bufs, full, empty = ring
    NSTAGES: gl.constexpr = full.shape[0]
    s = g % NSTAGES
    mbarrier.wait(full.index(s), (g // NSTAGES) & 1)
    a = a_bufs.index(s).slice(c * 64, 64)
    b = b_bufs.index(s)
    tok = warpgroup_mma(a, b.slice(0, 128).permute((1, 0)), zero, use_acc=False, is_async=True)
    sa = sa_bufs.index(s).slice(c * 64, 64).load(row_layout)
    sb0 = gl.load(sb_row + kb * stride_sbk)
    sb1 = gl.load(sb_row + stride_sbn + kb * stride_sbk, mask=hi_ok, other=0.0)
    part = warpgroup_mma_wait(0, deps=(tok, ))
    acc0 = acc0 + part * gl.expand_dims(sa * sb0, 1)
    # The second MMA writes into `part`'s registers (use_acc=False: their values are not read), so
    # ptxas must finish the promotion above before issuing it: four live 64x128 tiles would spill.
    tok = warpgroup_mma(a, b.slice(128, 128).permute((1, 0)), part, use_acc=False, is_async=True)
    part = warpgroup_mma_wait(0, deps=(tok, ))
    mbarrier.arrive(empty.index(s), count=1)
    acc1 = acc1 + part * gl.expand_dims(sa * sb1, 1)
    return acc0, acc1, g + 1


@gluon.jit
def _tile_work(grp_ptr, pid_m, nk, E, MODE: gl.constexpr):
    """(expert of the tile, K steps to run): contiguous mode takes the tile's first row's id and
    runs no step when it is -1 or out of range; dense: (0, nk). Every partition derives it alike."""
    if MODE == 1:
        e = gl.load(grp_ptr + pid_m * 128)
        valid = (e >= 0) & (e < E)
        return gl.where(valid, e, 0), gl.where(valid, nk, 0)
    else:
        return pid_m * 0, nk


@gluon.jit
def _item(item, SPLITS, TILES_M, tiles_n, GROUP_M, grp_ptr, K, E, MODE: gl.constexpr):
    """Dense / contiguous work item -> (pid_m, pid_n, expert, first K block, K blocks): tile item //
    SPLITS, split item % SPLITS of SPLITS equal runs of K blocks (block_scaled's split_k runs)."""
    pid_m, pid_n = _coords(item // SPLITS, TILES_M, tiles_n, GROUP_M)
    nk = gl.cdiv(K, 128)
    per = gl.cdiv(nk, SPLITS)
    lo = (item % SPLITS) * per
    e, run = _tile_work(grp_ptr, pid_m, gl.maximum(gl.minimum(nk, lo + per) - lo, 0), E, MODE)
    return pid_m, pid_n, e, lo, run


@gluon.jit
def _expert_rows(grp_ptr, e, E, M):
    """Masked mode: expert e's rows, masked_m[e] clamped to [0, M]; 0 past the last expert."""
    mm = gl.load(grp_ptr + gl.minimum(e, E - 1))
    return gl.where(e < E, gl.minimum(gl.maximum(mm, 0), M), 0)


@gluon.jit
def _seek(tile, e, base, mm, grp_ptr, E, M, tiles_n):
    """Masked mode: the experts' tiles are numbered one expert after another (cdiv(masked_m[e],
    128) x tiles_n each); advance the cursor (e, its first tile number base, its rows mm) to the
    expert holding `tile`. e == E: no expert does (the walk is over). Every partition walks alike."""
    while (tile >= base + gl.cdiv(mm, 128) * tiles_n) & (e < E):
        base += gl.cdiv(mm, 128) * tiles_n
        e += 1
        mm = _expert_rows(grp_ptr, e, E, M)
    return e, base, mm


@gluon.jit
def _mask_rows(v, layout: gl.constexpr, grp_ptr, cnt_ptr, r0, col0, e, nk, M, MODE: gl.constexpr):
    """Contiguous mode: rows whose id is not the tile's expert (every row of a tile without one)
    become zeros; the store of column 0 counts the -1 rows (counters[0]) and rows of another or an
    invalid id (counters[1]), as the Triton kernels do. Dense and masked: v unchanged. r0: the
    consumer's first row."""
    if MODE == 1:
        rows = r0 + gl.arange(0, 64, layout=gl.SliceLayout(1, layout))
        rmask = rows < M
        ids = gl.load(grp_ptr + rows, mask=rmask, other=-1)
        ok = rmask & (ids == e) & (nk > 0)
        v = gl.where(gl.expand_dims(ok, 1), v, gl.zeros_like(v))
        if col0 == 0:
            gl.atomic_add(cnt_ptr, gl.sum((rmask & (ids == -1)).to(gl.int32), axis=0), sem="relaxed")
            gl.atomic_add(cnt_ptr + 1, gl.sum((rmask & (ids != -1) & ~ok).to(gl.int32), axis=0), sem="relaxed")
    return v


@gluon.jit
def _store_half(acc, c: gl.constexpr, c_desc, c_bufs, d_ptr, grp_ptr, cnt_ptr, r0, col0, e, nk, M, N, stride_dm,
                mma_layout: gl.constexpr, MODE: gl.constexpr, EPI_TMA: gl.constexpr):
    """Consumer c's 64 rows from r0 of the acc-wide column run from col0 (its share of a tile, or a
    wide tile's half), as bf16 into `out` (viewed as 2-D); M: the end of the rows it may write (the
    expert's masked_m in masked mode, whose TMA store needs M rows per expert in whole halves)."""
    TW: gl.constexpr = acc.shape[1]
    if EPI_TMA == 1:  # through this consumer's shared buffer; the store runs while the next step starts
        vt = _mask_rows(acc.to(gl.bfloat16), mma_layout, grp_ptr, cnt_ptr, r0, col0, e, nk, M, MODE)
        cbuf = c_bufs.index(c)
        tma.store_wait(0)  # the previous store has read the buffer
        cbuf.store(vt)
        fence_async_shared()
        if (MODE != 2) | (r0 < M):  # masked: a half past masked_m is another expert's rows
            tma.async_copy_shared_to_global(c_desc, [r0, col0], cbuf)
    else:
        out_layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
        v = _mask_rows(gl.convert_layout(acc.to(d_ptr.dtype.element_ty), out_layout), out_layout, grp_ptr, cnt_ptr,
                       r0, col0, e, nk, M, MODE)
        rows = r0 + gl.arange(0, 64, layout=gl.SliceLayout(1, out_layout))
        cols = col0 + gl.arange(0, TW, layout=gl.SliceLayout(0, out_layout))
        dst = d_ptr + gl.expand_dims(rows, 1) * stride_dm + gl.expand_dims(cols, 0)
        gl.store(dst, v, mask=gl.expand_dims(rows < M, 1) & gl.expand_dims(cols < N, 0))


@gluon.jit
def _consume_tile(c: gl.constexpr, row0, row_end, pid_n, e, k_lo, nk, g, t, descs, bufs, ptrs, dims,
                  MODE: gl.constexpr, EPI_TMA: gl.constexpr, SBS: gl.constexpr):
    """Consumer c's share of one tile (the partition's t-th): K blocks k_lo .. k_lo + nk - 1 (first row
    row0 of A and out, rows below row_end stored) -> g. d_ptr is the output, or a split's FP32 partials.
    A 128-row tile's consumers take 64 rows each; a 64-row (HALF_BM) tile has one consumer. SBS: the
    tile's B-scale row is staged (_stage_scales) in buffer t % 2."""
    a_desc, b_desc, sa_desc, c_desc, sb_desc = descs
    a_bufs, b_bufs, sa_bufs, c_bufs, full, empty, sb_bufs, sb_full, sb_empty = bufs
    TN: gl.constexpr = b_bufs.shape[1]  # the tile width travels in B's buffer type, as MODE in cfg's
    HALF_M: gl.constexpr = a_bufs.shape[1] == 64  # and the tile height in A's
    TW: gl.constexpr = TN if HALF_M else (128 if TN > 128 else TN)  # one wgmma's width (a wide tile runs two)
    d_ptr, sb_ptr, grp_ptr, cnt_ptr = ptrs
    M, N, K, E, TILES_M, GROUP_M, stride_dm, stride_sbe, stride_sbn, stride_sbk, m_pad, stride_sae, SPLITS, \
        stride_ws = dims
    ring = (a_bufs, b_bufs, sa_bufs, full, empty)
    mma_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                         instr_shape=[16, TW, 32])
    row_layout: gl.constexpr = gl.SliceLayout(1, mma_layout)
    zero = gl.zeros((64, TW), gl.float32, mma_layout)
    col0 = pid_n * TN
    r0 = row0 if HALF_M else row0 + c * 64
    sb_row = sb_ptr + e * stride_sbe + (col0 // 128) * stride_sbn  # the tile's first 128-column block's B scales
    acc = zero
    if TN <= 128:
        k0 = k_lo
        if SBS:
            SBK: gl.constexpr = sb_bufs.shape[1]
            k0 = k_lo - _sb_flat(e, col0, k_lo, stride_sbe, stride_sbn) % 4  # the box starts at the aligned run
            mbarrier.wait(sb_full.index(t % 2), (t // 2) & 1)
            sbv = sb_bufs.index(t % 2)._reinterpret(gl.float32, [SBK, 1], gl.SwizzledSharedLayout(1, 1, 1, [0]))
        else:
            sbv = sb_bufs  # unused
        # Step 0 promotes a zero tile with zero scales: acc stays +0, as the Triton kernel's starts.
        part = zero
        sa = gl.zeros((64, ), gl.float32, row_layout)
        sb = 0.0
        for kb in range(k_lo, k_lo + nk - 1, 2):
            acc, part, sa, sb, g = _step(c, kb, g, acc, part, sa, sb, ring, sb_row, stride_sbk, zero, row_layout,
                                         sbv, k0, SBS)
            acc, part, sa, sb, g = _step(c, kb + 1, g, acc, part, sa, sb, ring, sb_row, stride_sbk, zero,
                                         row_layout, sbv, k0, SBS)
        if nk % 2 == 1:
            acc, part, sa, sb, g = _step(c, k_lo + nk - 1, g, acc, part, sa, sb, ring, sb_row, stride_sbk, zero,
                                         row_layout, sbv, k0, SBS)
        if SBS:  # every scale read: the producer may refill the buffer
            mbarrier.arrive(sb_empty.index(t % 2), count=1)
        acc = acc + part * gl.expand_dims(sa * sb, 1)
        _store_half(acc, c, c_desc, c_bufs, d_ptr, grp_ptr, cnt_ptr, r0, col0, e, nk, row_end, N, stride_dm,
                    mma_layout, MODE, EPI_TMA)
    else:
        acc1 = zero
        hi_ok = col0 + 128 < N
        for kb in range(k_lo, k_lo + nk):
            acc, acc1, g = _step_wide(c, kb, g, acc, acc1, ring, sb_row, stride_sbn, stride_sbk, hi_ok, zero,
                                      row_layout)
        _store_half(acc, c, c_desc, c_bufs, d_ptr, grp_ptr, cnt_ptr, r0, col0, e, nk, row_end, N, stride_dm,
                    mma_layout, MODE, EPI_TMA)
        if hi_ok:
            _store_half(acc1, c, c_desc, c_bufs, d_ptr, grp_ptr, cnt_ptr, r0, col0 + 128, e, nk, row_end, N,
                        stride_dm, mma_layout, MODE, EPI_TMA)
    return g


@gluon.jit
def _gdc_wait():
    """griddepcontrol.wait: return once the grids this one depends on (a programmatic dependent launch)
    have finished and their memory is visible; at once for a plain launch."""
    gl.inline_asm_elementwise("griddepcontrol.wait; // dummy $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _gdc_launch_dependents():
    """griddepcontrol.launch_dependents: the next programmatic dependent may launch once every CTA of
    this grid ran it or exited (it then waits in its own _gdc_wait for this grid to finish)."""
    gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // dummy $0", "=r", [], dtype=gl.int32,
                              is_pure=False, pack=1)


@gluon.jit
def _consume(c: gl.constexpr, descs, bufs, ptrs, dims, cfg):
    """Consumer c: rows [c * 64, c * 64 + 64) of every 128-row tile; consumer 0 alone: all of
    every 64-row tile (dense only)."""
    MODE: gl.constexpr = cfg.shape[0] - 1  # see _ws_gemm_kernel: the flags travel as cfg's shape
    EPI_TMA: gl.constexpr = cfg.shape[1] - 1
    SBS: gl.constexpr = cfg.shape[3] - 1
    PDL: gl.constexpr = cfg.shape[4] // 2
    TN: gl.constexpr = bufs[1].shape[1]
    TM: gl.constexpr = bufs[0].shape[1]  # tile rows: BM, or HALF_BM (dense)
    if PDL:  # a programmatic dependent: nothing in global memory before the grid before has finished
        _gdc_wait()
    d_ptr, sb_ptr, grp_ptr, cnt_ptr = ptrs
    M, N, K, E, TILES_M, GROUP_M, stride_dm, stride_sbe, stride_sbn, stride_sbk, m_pad, stride_sae, SPLITS, \
        stride_ws = dims
    pid = gl.program_id(0)
    nprog = gl.num_programs(0)
    tiles_n = gl.cdiv(N, TN)
    g = pid * 0
    t = pid * 0  # tiles taken, for the staged B-scale buffers
    if MODE == 2:
        tile = pid
        e, base, mm = _seek(tile, pid * 0, pid * 0, _expert_rows(grp_ptr, pid * 0, E, M), grp_ptr, E, M, tiles_n)
        while e < E:
            pid_m, pid_n = _coords(tile - base, gl.cdiv(mm, 128), tiles_n, GROUP_M)
            g = _consume_tile(c, e * M + pid_m * 128, e * M + mm, pid_n, e, 0, gl.cdiv(K, 128), g, t, descs, bufs,
                              ptrs, dims, MODE, EPI_TMA, SBS)
            t += 1
            tile += nprog
            e, base, mm = _seek(tile, e, base, mm, grp_ptr, E, M, tiles_n)
    else:
        for item in range(pid, TILES_M * tiles_n * SPLITS, nprog):
            pid_m, pid_n, e, k_lo, nk = _item(item, SPLITS, TILES_M, tiles_n, GROUP_M, grp_ptr, K, E, MODE)
            part_ptrs = (d_ptr + (item % SPLITS) * stride_ws, sb_ptr, grp_ptr, cnt_ptr)  # split s: partials [s]
            g = _consume_tile(c, pid_m * TM, M, pid_n, e, k_lo, nk, g, t, descs, bufs, part_ptrs, dims, MODE, EPI_TMA,
                              SBS)
            t += 1
    if EPI_TMA == 1:
        tma.store_wait(0)


@gluon.jit
def _consumer0(descs, bufs, ptrs, dims, cfg):
    _consume(0, descs, bufs, ptrs, dims, cfg)


@gluon.jit
def _consumer1(descs, bufs, ptrs, dims, cfg):
    _consume(1, descs, bufs, ptrs, dims, cfg)


@gluon.jit
def _prefetch_l2(ptr):
    """Ask the L2 for the 128-byte line at ptr (nothing comes back; nothing waits for it)."""
    gl.inline_asm_elementwise("prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;", "=r,l", [ptr], dtype=gl.int32,
                              is_pure=False, pack=1)


@gluon.jit
def _prefetch_scales(sb_ptr, e, col0, k_lo, nk, N, TN: gl.constexpr, stride_sbe, stride_sbn, stride_sbk):
    """The L2 lines of the B scales a tile of TN columns from col0 reads over K blocks k_lo ..
    k_lo + nk - 1 (every 16th block where they are contiguous, else each)."""
    step = 16 if stride_sbk == 1 else 1
    sb_row = sb_ptr + e * stride_sbe + (col0 // 128) * stride_sbn
    for kb in range(k_lo, k_lo + nk, step):
        _prefetch_l2(sb_row + kb * stride_sbk)
    if TN > 128:
        if col0 + 128 < N:
            for kb in range(k_lo, k_lo + nk, step):
                _prefetch_l2(sb_row + stride_sbn + kb * stride_sbk)


@gluon.jit
def _sb_flat(e, col0, k_lo, stride_sbe, stride_sbn):
    """The flat index in B's scales of K block k_lo's scale for the tile of expert e from column col0."""
    return e * stride_sbe + (col0 // 128) * stride_sbn + k_lo


@gluon.jit
def _stage_scales(t, sb0, descs, bufs):
    """The partition's t-th tile's B-scale row into buffer t % 2: one TMA box from flat element sb0 (the
    tile's first K block) rounded down to a multiple of 4 (a TMA box's innermost coordinate must be
    16-byte aligned, else the copy is an illegal instruction; the consumers skip the sb0 % 4 before it),
    once the consumers have released the buffer's previous tile."""
    sb_desc = descs[4]
    sb_bufs, sb_full, sb_empty = bufs[6], bufs[7], bufs[8]
    mbarrier.wait(sb_empty.index(t % 2), ((t // 2) & 1) ^ 1)  # a fresh barrier passes phase 1
    fence_async_shared()  # the consumers' shared loads of the buffer's previous row come first
    mbarrier.expect(sb_full.index(t % 2), sb_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(sb_desc, [sb0 - sb0 % 4], sb_full.index(t % 2), sb_bufs.index(t % 2))


@gluon.jit
def _produce_tile(row0, sa0, pid_n, e, k_lo, nk, g, descs, bufs, N, m_pad):
    """The TMA loads of one tile's K blocks k_lo .. k_lo + nk - 1 (A rows from row0, its scale run
    from sa0) -> g."""
    a_desc, b_desc, sa_desc, c_desc, sb_desc = descs
    a_bufs, b_bufs, sa_bufs, c_bufs, full, empty, sb_bufs, sb_full, sb_empty = bufs
    NSTAGES: gl.constexpr = full.shape[0]
    TN: gl.constexpr = b_bufs.shape[1]
    nbytes: gl.constexpr = a_desc.block_type.nbytes + b_desc.block_type.nbytes + sa_desc.block_type.nbytes
    RA: gl.constexpr = a_desc.block_type.shape[0]  # A's box: the tile's rows, or the first 16 / 32 of 64
    for kb in range(k_lo, k_lo + nk):
        s = g % NSTAGES
        mbarrier.wait(empty.index(s), ((g // NSTAGES) & 1) ^ 1)  # a fresh barrier passes phase 1
        # The consumers read the slot's scales with ordinary shared loads: order those
        # before the TMA overwrites them (one fence here instead of one per consumer step).
        fence_async_shared()
        bar = full.index(s)
        mbarrier.expect(bar, nbytes)
        a_dst = a_bufs.index(s)
        if RA != a_bufs.shape[1]:
            a_dst = a_dst.slice(0, RA)
        tma.async_copy_global_to_shared(a_desc, [row0, kb * 128], bar, a_dst)
        tma.async_copy_global_to_shared(b_desc, [e * N + pid_n * TN, kb * 128], bar, b_bufs.index(s))
        tma.async_copy_global_to_shared(sa_desc, [sa0 + kb * m_pad], bar, sa_bufs.index(s))
        g += 1
    return g


@gluon.jit
def _produce(descs, bufs, ptrs, dims, cfg):
    """The TMA producer warp."""
    MODE: gl.constexpr = cfg.shape[0] - 1
    PF: gl.constexpr = cfg.shape[2] - 1  # the launch's sb_prefetch (SB_PREFETCH_ROWS)
    SBS: gl.constexpr = cfg.shape[3] - 1  # and its sb_stage (SB_STAGE_TILES)
    PDL: gl.constexpr = cfg.shape[4] // 2  # and its pdl
    TN: gl.constexpr = bufs[1].shape[1]
    TM: gl.constexpr = bufs[0].shape[1]  # tile rows: BM, or HALF_BM (dense)
    if PDL:
        _gdc_wait()
    d_ptr, sb_ptr, grp_ptr, cnt_ptr = ptrs
    M, N, K, E, TILES_M, GROUP_M, stride_dm, stride_sbe, stride_sbn, stride_sbk, m_pad, stride_sae, SPLITS, \
        stride_ws = dims
    pid = gl.program_id(0)
    nprog = gl.num_programs(0)
    tiles_n = gl.cdiv(N, TN)
    g = pid * 0
    t = pid * 0
    if MODE == 2:
        tile = pid
        e, base, mm = _seek(tile, pid * 0, pid * 0, _expert_rows(grp_ptr, pid * 0, E, M), grp_ptr, E, M, tiles_n)
        while e < E:
            pid_m, pid_n = _coords(tile - base, gl.cdiv(mm, 128), tiles_n, GROUP_M)
            if SBS:
                _stage_scales(t, _sb_flat(e, pid_n * TN, 0, stride_sbe, stride_sbn), descs, bufs)
                t += 1
            if PF:
                _prefetch_scales(sb_ptr, e, pid_n * TN, 0, gl.cdiv(K, 128), N, TN, stride_sbe, stride_sbn, stride_sbk)
            g = _produce_tile(e * M + pid_m * 128, e * stride_sae + pid_m * 128, pid_n, e, 0, gl.cdiv(K, 128), g,
                              descs, bufs, N, m_pad)
            tile += nprog
            e, base, mm = _seek(tile, e, base, mm, grp_ptr, E, M, tiles_n)
    else:
        for item in range(pid, TILES_M * tiles_n * SPLITS, nprog):
            pid_m, pid_n, e, k_lo, nk = _item(item, SPLITS, TILES_M, tiles_n, GROUP_M, grp_ptr, K, E, MODE)
            if SBS:
                _stage_scales(t, _sb_flat(e, pid_n * TN, k_lo, stride_sbe, stride_sbn), descs, bufs)
                t += 1
            if PF:
                _prefetch_scales(sb_ptr, e, pid_n * TN, k_lo, nk, N, TN, stride_sbe, stride_sbn, stride_sbk)
            g = _produce_tile(pid_m * TM, pid_m * TM, pid_n, e, k_lo, nk, g, descs, bufs, N, m_pad)
    if PDL == 2:  # every load issued: the next dependent's launch may overlap this grid's last MMAs
        _gdc_launch_dependents()


@gluon.jit
def _ws_gemm_kernel(a_desc, b_desc, sa_desc, c_desc, sb_desc, d_ptr, sb_ptr, grp_ptr, cnt_ptr, M, N, K, E, TILES_M,
                    GROUP_M, stride_dm, stride_sbe, stride_sbn, stride_sbk, m_pad, stride_sae, SPLITS, stride_ws,
                    STAGES: gl.constexpr, MODE: gl.constexpr, EPI_TMA: gl.constexpr, num_warps: gl.constexpr,
                    SB_PF: gl.constexpr = 0, SB_STAGE: gl.constexpr = 0, PDL: gl.constexpr = 0):
    # A's slot holds the tile's rows (a 64-row tile's whole wgmma operand when its box is 16 or 32 rows)
    HALF_M: gl.constexpr = a_desc.block_type.shape[0] <= 64  # a 64-row tile: one consumer
    TM: gl.constexpr = 64 if HALF_M else a_desc.block_type.shape[0]
    a_bufs = gl.allocate_shared_memory(a_desc.dtype, [STAGES, TM, a_desc.block_type.shape[1]], a_desc.layout)
    b_bufs = gl.allocate_shared_memory(b_desc.dtype, [STAGES] + b_desc.block_type.shape, b_desc.layout)
    sa_bufs = gl.allocate_shared_memory(sa_desc.dtype, [STAGES] + sa_desc.block_type.shape, sa_desc.layout)
    if EPI_TMA == 1:  # one output buffer per consumer
        c_bufs = gl.allocate_shared_memory(c_desc.dtype, [2] + c_desc.block_type.shape, c_desc.layout)
    else:
        c_bufs = sa_bufs  # unused
    full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(full.index(i), count=1)
        mbarrier.init(empty.index(i), count=1 if HALF_M else 2)  # every consumer releases a slot
    if SB_STAGE == 1:  # two tiles' B-scale rows (sb_desc's box each) and their barriers
        sb_bufs = gl.allocate_shared_memory(sb_desc.dtype, [2] + sb_desc.block_type.shape, sb_desc.layout)
        sb_full = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        sb_empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(2):
            mbarrier.init(sb_full.index(i), count=1)
            mbarrier.init(sb_empty.index(i), count=1 if HALF_M else 2)
    else:  # unused
        sb_bufs, sb_full, sb_empty = sa_bufs, full, empty
    # A constexpr reaches a worker partition as an i32 argument (its `if` stays a runtime branch, and
    # Triton 3.6 aborts lowering a tensor load in the dead side), while a shared-memory descriptor
    # keeps its shape in its type: MODE, EPI_TMA, SB_PF, SB_STAGE and PDL travel as cfg's shape (64 bytes
    # of shared memory at most; a dimension must be a power of two, so PDL's is 1 << PDL).
    cfg = gl.allocate_shared_memory(gl.int8, [MODE + 1, EPI_TMA + 1, SB_PF + 1, SB_STAGE + 1, 1 << PDL],
                                    gl.SwizzledSharedLayout(1, 1, 1, [4, 3, 2, 1, 0]))
    args = ((a_desc, b_desc, sa_desc, c_desc, sb_desc),
            (a_bufs, b_bufs, sa_bufs, c_bufs, full, empty, sb_bufs, sb_full, sb_empty),
            (d_ptr, sb_ptr, grp_ptr, cnt_ptr),
            (M, N, K, E, TILES_M, GROUP_M, stride_dm, stride_sbe, stride_sbn, stride_sbk, m_pad, stride_sae, SPLITS,
             stride_ws), cfg)
    if HALF_M:
        gl.warp_specialize([(_consumer0, args), (_produce, args)], [1], [40])
    else:
        gl.warp_specialize([(_consumer0, args), (_consumer1, args), (_produce, args)], [4, 1], [232, 40])


def tile_n(m, n, num_sms):
    """The tile width launch() takes by default: WIDE_BN where N is whole 256-column tiles and they
    make at least one wave on num_sms SMs; NARROW_BN where even 64-column tiles make at most one
    wave (a grid of 128-wide tiles would fill at most half the SMs); else BN."""
    if n % WIDE_BN == 0 and cdiv(m, BM) * (n // WIDE_BN) >= num_sms:
        return WIDE_BN
    return NARROW_BN if cdiv(m, BM) * cdiv(n, NARROW_BN) <= num_sms else BN


def tile_shape(m, n, num_sms, dense=True):
    """(tile rows, tile width) launch() takes by default: 128 x tile_n's width, unless the call is
    dense with at most HALF_MAX_ROWS rows and either at most 64 rows (a 128-row tile would be half
    empty) or too few 128-row tiles to fill MIN_FILL of the SMs; then 64-row tiles of the widest
    HALF_WIDTHS width that fills MIN_FILL (else the narrowest, whose K splits fill it)."""
    bn = tile_n(m, n, num_sms)
    if not dense or m > HALF_MAX_ROWS or (m > HALF_BM and cdiv(m, BM) * cdiv(n, bn) >= MIN_FILL * num_sms):
        return BM, bn
    for w in HALF_WIDTHS:
        if cdiv(m, HALF_BM) * cdiv(n, w) >= MIN_FILL * num_sms:
            return HALF_BM, w
    return HALF_BM, HALF_WIDTHS[-1]


def column_split(m, n, num_sms):
    """Columns of a dense call to run in 128x256 tiles on their own, the rest in a second call: N's
    whole 256-column tiles when they are not all of N and make at least a wave on num_sms SMs (0:
    no split). At (4096, 2112, 7168) that turns 4.1 waves of 128x128 tiles into 1.9 waves of wide
    ones plus 64 columns (bench/decode_sweep.py --only colsplit, docs/perf.md)."""
    n0 = n // WIDE_BN * WIDE_BN
    return n0 if 0 < n0 < n and cdiv(m, BM) * (n0 // WIDE_BN) >= num_sms else 0


def a_box_rows(m, bm=HALF_BM):
    """Rows of A's TMA box: the tile's, except that a 64-row tile over at most 32 rows (its only
    row tile) loads 16 or 32 of them; its wgmma reads the slot's other rows unwritten, and their
    outputs are never stored. Rows past M cost TMA time all the same (docs/perf.md)."""
    if bm != HALF_BM or m > 32:
        return bm
    return 16 if m <= 16 else 32


def _tile_rows(a, masked_rows):
    """Rows the tile count is taken over: M, or masked_rows per expert rounded up to whole tiles."""
    return a.shape[0] * cdiv(masked_rows, BM) * BM if masked_rows is not None else a.shape[0]


# Dense grids with fewer tiles than SMs split K (FP32 partials, added in split order by block_scaled,
# as the Triton kernel's split_k): as many splits as fill the SMs, at most SPLIT_MAX, each keeping
# SPLIT_MIN_BLOCKS K blocks. Grids whose work items (tiles x splits) fill at least MIN_FILL of the SMs
# run here; smaller ones take the Triton kernels' smaller tiles.
SPLIT_MAX, SPLIT_MIN_BLOCKS, MIN_FILL = 4, 12, 0.75


def split_k(tiles, nk, num_sms, dense=True):
    """K splits of a dense grid of `tiles` tiles over nk K blocks on num_sms SMs (1: none)."""
    if not dense or tiles >= num_sms:
        return 1
    return max(1, min(SPLIT_MAX, num_sms // tiles, nk // SPLIT_MIN_BLOCKS))


def grid(rows, n, k, num_sms, bn=None, dense=True, bm=None):
    """(tile rows, tile width, tiles, K splits) of a call whose tiles cover `rows` rows (_tile_rows)
    by N, over K: tile_shape's tile unless bm / bn force one (bn alone: a 128-row tile); split_k's
    splits (dense only). plan() and block_scaled.ws_splits both take the grid from here."""
    if bn is None and bm is None:
        bm, bn = tile_shape(rows, n, num_sms, dense)
    bm = bm or BM
    bn = bn or (tile_n(rows, n, num_sms) if bm == BM else HALF_WIDTHS[-1])
    tiles = cdiv(rows, bm) * cdiv(n, bn)
    return bm, bn, tiles, split_k(tiles, cdiv(k, BK), num_sms, dense)


def operand_refusal(a, sa, b, sb, out, *, packed_a, sb_div):
    """None when the operands are in the SM90 kernels' formats (this kernel's and csrc/fp8_gemm_sm90.cu's:
    FP32 scales, B's per 128x128 block, A's column-major with a 16-byte aligned column stride, contiguous
    16-byte aligned A and B), else what is not."""
    if packed_a or sb_div != 128:
        return "needs FP32 scales, B's per 128x128 block"
    if sa.stride(-2) != 1 or sa.stride(-1) % 4 or sa.data_ptr() % 16:
        return "needs A's scales column-major with a 16-byte aligned column stride (scale_layout='col_tma')"
    if a.shape[-1] % 16 or not (a.is_contiguous() and b.is_contiguous() and sb.is_contiguous()) or (
            a.data_ptr() % 16 or b.data_ptr() % 16):
        return "needs contiguous, 16-byte aligned A, B and B scales (K a multiple of 16)"
    if out.stride(-1) != 1:
        return "needs out with unit column stride"
    return None


def plan(a, sa, b, sb, out, *, packed_a, sb_div, grouped=False, alignment=128, arch=None, num_sms=None, bn=None,
         masked_rows=None, bm=None):
    """None when the kernel applies, else the reason it does not (block_scaled falls back then).
    masked_rows: an m-grouped masked call (a [E, M, K], sa [E, M, KG], out [E, M, N]) expecting
    that many rows per expert (its tile count).

    arch (rtp_fp8.arch.Arch) / num_sms default to a's device's; tests pass them to check the
    rules on CPU."""
    if arch is None:
        if not a.is_cuda:
            return "not a CUDA tensor"
        arch = A.detect(a.device)
    if (arch.major, arch.minor) != (9, 0):
        return f"needs SM90 (wgmma), got {arch.name}"
    if not LIST_WARP_SPECIALIZE:
        return "needs Triton >= 3.6 (gl.warp_specialize taking (function, args) pairs)"
    m, k = a.shape[-2:]
    n = b.shape[-2]
    why = operand_refusal(a, sa, b, sb, out, packed_a=packed_a, sb_div=sb_div)
    if why is not None:
        return why
    if masked_rows is not None and out.stride(0) != m * out.stride(1):
        return "needs out's experts one after another (viewable as [E * M, N])"
    if grouped and alignment % BM:
        return f"needs expert segments aligned to {BM} rows, got alignment {alignment}"
    if num_sms is None:
        num_sms = A.num_sms(a.device.index or 0)
    dense = not grouped and masked_rows is None
    bm, bn, tiles, splits = grid(_tile_rows(a, masked_rows), n, k, num_sms, bn, dense, bm)
    if bm == HALF_BM:
        if not dense:
            return f"{HALF_BM}-row tiles are dense only"
        if bn not in HALF_WIDTHS:
            return f"bn of a {HALF_BM}-row tile must be one of {HALF_WIDTHS}, got {bn}"
    elif bm != BM:
        return f"bm must be {BM} or {HALF_BM}, got {bm}"
    elif bn not in (NARROW_BN, BN, WIDE_BN):
        return f"bn must be {NARROW_BN}, {BN} or {WIDE_BN}, got {bn}"
    if tiles * splits < MIN_FILL * num_sms:  # too little work to fill the GPU: the Triton kernel's smaller tiles
        return f"{tiles} tiles of {bm}x{bn}{f' x {splits} K splits' if splits > 1 else ''} for {num_sms} SMs"
    return None


def _descriptors(a, b2, sa, sb, out, epi_tma, bn, bm, a_rows, sb_k):
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    m, kg = sa.shape[-2:]
    # A's scales as the 1-D run of their storage: column kb (K block) of expert e starts at
    # e * stride(0) + kb * m_pad (stride(0) 0 for a 2-D sa)
    span = (sa.shape[0] - 1) * sa.stride(0) if sa.dim() == 3 else 0
    sa_flat = torch.as_strided(sa, (span + (kg - 1) * sa.stride(-1) + m, ), (1, ))
    c = out if epi_tma else torch.empty(BM, 128, dtype=torch.bfloat16, device=a.device)  # unused without EPI_TMA
    # staged B-scale rows: B's scales as their flat storage (contiguous, checked by plan)
    sb_flat = torch.as_strided(sb, (sb.numel(), ), (1, )) if sb_k else sa_flat
    tensors = {"a_desc": a, "b_desc": b2, "sa_desc": sa_flat, "c_desc": c, "sb_desc": sb_flat}
    return tuple(TensorDescriptor.from_tensor(tensors[name], block, _box_layout(block, dtype))
                 for name, (block, dtype, _) in boxes(bn, bm, a_rows, sb_k).items())


def _stages(bn, bm=BM):
    if bm == HALF_BM:
        return STAGES_HALF[bn]
    return {NARROW_BN: STAGES_NARROW, WIDE_BN: STAGES_WIDE}.get(bn, STAGES)


def launch(mode, a, sa, b, sb, grp, cnt, e, out, *, epi_tma=None, nprog=None, bn=None, masked_rows=None,
           splits=1, bm=None, stages=None, a_rows=None, sb_prefetch=None, sb_stage=None, pdl=0):
    """D = A @ B^T into out; mode 0 dense (b [N, K]), 1 m-grouped contiguous (b [E, N, K], grp the
    int32 row ids, cnt the two counters), 2 m-grouped masked (a [E, M, K], out [E, M, N], grp
    masked_m, masked_rows the expected rows per expert); tiles bm x bn (default grid()'s). The
    caller checked plan(). Dense with splits > 1: out is FP32 [splits, M, N], split s's partial
    sums go to out[s] (the caller adds them in split order). stages: the ring's slots (default
    _stages; benchmarks sweep it); a_rows: A's box rows (default a_box_rows's); sb_prefetch: the
    producer's L2 prefetch of B-scale rows (default: for tile heights in SB_PREFETCH_ROWS); sb_stage:
    B-scale rows staged in shared memory, the ring then SB_STAGE_TILES's (default: for the tiles there,
    unsplit unless SB_STAGE_SPLIT, where sb_stage_k allows; forced on where it does not, a ValueError);
    pdl: 0 a plain launch, 1 a programmatic dependent (every partition waits, griddepcontrol.wait, before
    it touches global memory), 2 one that also lets the next dependent launch once the producer issued
    its last load (block_scaled passes ws_pdl())."""
    if pdl not in (0, 1, 2):
        raise ValueError(f"pdl must be 0 (a plain launch), 1 or 2 (a programmatic dependent), got {pdl!r}")
    m, k = a.shape[-2:]
    n = b.shape[-2]
    num_sms = A.num_sms(a.device.index or 0)
    rows = _tile_rows(a, masked_rows if mode == 2 else None)
    bm, bn = grid(rows, n, k, num_sms, bn, mode == 0, bm)[:2]
    if bm == HALF_BM and mode != 0:
        raise ValueError(f"{HALF_BM}-row tiles are dense only (mode 0), got mode {mode}")
    a_rows = a_rows or a_box_rows(m, bm)
    if a_rows != bm and not (bm == HALF_BM and a_rows in (16, 32) and m <= a_rows):
        raise ValueError(f"a_rows {a_rows} must be the tile's {bm} rows, or 16 / 32 of a 64-row tile over at most "
                         f"as many rows (M={m})")
    stride_ws = 0
    if splits > 1:
        stride_ws, out, epi_tma = out.stride(0), out[0], False
    a2, out2 = a.reshape(-1, k), out.reshape(-1, n)  # masked: [E * M, K] and [E * M, N] (plan checked the strides)
    if epi_tma is None:  # a TMA store needs 16-byte aligned rows
        epi_tma = out2.stride(0) % 8 == 0 and out2.data_ptr() % 16 == 0
        # wide contiguous tiles keep pointer stores: with the TMA store ptxas spills in the K loop
        epi_tma = epi_tma and not (bn == WIDE_BN and mode == 1)
        # masked: a 64-row half must not reach the next expert's rows
        epi_tma = epi_tma and not (mode == 2 and m % 64)
    tiles_m = cdiv(m, bm)
    nprog = nprog or min(cdiv(rows, bm) * cdiv(n, bn) * splits if mode != 2 else e * tiles_m * cdiv(n, bn), num_sms)
    sb_e = sb.stride(0) if sb.dim() == 3 else 0
    sa_e = sa.stride(0) if sa.dim() == 3 else 0
    group_m = GROUP_M_WIDE if cdiv(n, 128) >= WIDE_N_TILES else GROUP_M
    sb_k = sb_stage_k(sb, k, bn, splits)
    if sb_stage is None:
        sb_stage = sb_stage_default(mode, bm, bn, sb_k, splits)
    elif sb_stage and not sb_k:
        raise ValueError(f"sb_stage needs a tile of at most 128 columns, B's scales contiguous and 16-byte aligned "
                         f"and at most {SB_STAGE_MAX - 3} K blocks per tile (bn={bn}, K={k}, splits={splits})")
    sb_k = sb_k if sb_stage else 0
    descs = _descriptors(a2, b.reshape(-1, k), sa, sb, out2, epi_tma, bn, bm, a_rows, sb_k)
    _ws_gemm_kernel[(nprog, )](*descs, out2, sb, grp, cnt, m, n, k, e, tiles_m, group_m, out2.stride(0), sb_e,
                               sb.stride(-2), sb.stride(-1), sa.stride(-1), sa_e, splits, stride_ws,
                               STAGES=stages or _ring(mode, bm, bn, sb_stage), MODE=mode, EPI_TMA=int(epi_tma),
                               num_warps=4, maxnreg=168, SB_PF=_sb_prefetch(bm, sb_prefetch, sb_k),
                               SB_STAGE=int(sb_k > 0), PDL=pdl, launch_pdl=bool(pdl))
    return out


def sb_stage_k(sb, k, bn, splits=1):
    """The B-scale run a tile stages: its box holds the tile's K blocks (per split) and the up to 3 before
    them that its 16-byte aligned start takes in, rounded up to a power of two and at least 32 (so that
    the second buffer starts 128 bytes in, as a TMA destination must). 0 where staging cannot run: a
    tile over 128 columns, B's scales not contiguous or 16-byte aligned, or a box over SB_STAGE_MAX."""
    per = cdiv(cdiv(k, BK), splits) + 3
    if bn > 128 or not sb.is_contiguous() or sb.data_ptr() % 16 or per > SB_STAGE_MAX:
        return 0
    return max(32, 1 << (per - 1).bit_length())


def sb_stage_default(mode, bm, bn, sb_k, splits=1):
    """Whether launch() stages a call's B-scale rows unless told: its tile is in SB_STAGE_TILES, sb_stage_k
    gave a box (sb_k), and it is unsplit (or SB_STAGE_SPLIT)."""
    return (mode, bm, bn) in SB_STAGE_TILES and sb_k > 0 and (splits == 1 or SB_STAGE_SPLIT)


def _ring(mode, bm, bn, staged):
    """Ring slots of a launch: SB_STAGE_TILES's for a staged tile listed there with a depth, else _stages."""
    return (SB_STAGE_TILES.get((mode, bm, bn)) if staged else None) or _stages(bn, bm)


def _sb_prefetch(bm, sb_prefetch=None, sb_k=0) -> int:
    """The kernel's SB_PF: 0 for a tile that stages its B-scale rows (sb_k), else sb_prefetch where given,
    else whether tiles of bm rows prefetch (SB_PREFETCH_ROWS)."""
    if sb_k:
        return 0
    return int(bm in SB_PREFETCH_ROWS if sb_prefetch is None else sb_prefetch)


def compile_sm90a(mode=0, epi_tma=0, bn=None, split=False, bm=BM, a_rows=None, sb_prefetch=None, sb_k=None, pdl=0):
    """Offline compile for sm_90a (no GPU needed): -> triton CompiledKernel (asm: ttgir, ptx, cubin).
    split: the variant storing FP32 split-K partials; bm HALF_BM: 64-row tiles; a_rows: A's box rows;
    sb_prefetch: the producer's B-scale prefetch (default: as launch() takes it for bm); sb_k: the
    staged B-scale run (sb_stage_k's; 0: none; default: as launch() takes it for the tile at K=7168,
    SB_STAGE_TILES's ring with it); pdl: as launch() takes it."""
    bn = bn or BN
    if sb_k is None:
        sb_k = 64 if sb_stage_default(mode, bm, bn, 64, 2 if split else 1) else 0
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    sig = {name: f"tensordesc<{ty}{block},{_box_layout(block, dtype)!r}>"
           for name, (block, dtype, ty) in boxes(bn, bm, a_rows, sb_k).items()}
    sig |= {name: ("*fp32" if split else "*bf16") if name == "d_ptr" else "*fp32" if name == "sb_ptr" else "*i32"
            for name in ("d_ptr", "sb_ptr", "grp_ptr", "cnt_ptr")}
    sig |= {name: "i32" for name in ("M", "N", "K", "E", "TILES_M", "GROUP_M", "stride_dm", "stride_sbe",
                                     "stride_sbn", "stride_sbk", "m_pad", "stride_sae", "SPLITS", "stride_ws")}
    const = {"STAGES": _ring(mode, bm, bn, sb_k > 0), "MODE": mode, "EPI_TMA": epi_tma, "num_warps": 4,
             "SB_PF": _sb_prefetch(bm, sb_prefetch, sb_k), "SB_STAGE": int(sb_k > 0), "PDL": pdl}
    sig |= {name: "constexpr" for name in const}
    return triton.compile(GluonASTSource(_ws_gemm_kernel, sig, const), target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": 4, "maxnreg": 168})
