"""Experiment, not shipped and not selected by any backend: a warp-specialized SM90
block-scaled FP8 GEMM in Gluon, dense and m-grouped contiguous, FP32 scales (A 1x128 column-major TMA-aligned, B
128x128 blocks). Compiled offline for sm_90a (tests/gemm/test_sm90_ws_compile.py); its
numbers on the GPU come from bench/gemm_ws_gluon.py. It moves into rtp_fp8 only if it
beats the Triton kernel there.

Why: in block_scaled.py (plain Triton) and in a single-stream Gluon kernel (68b77e9) each K
step's promotion `acc += (a @ b) * scale` waits for that step's MMA, and every warp shares
one instruction stream, so the tensor cores idle while the promotion and the TMA issue run.
Here the work is split the way fast SM90 GEMMs do it:

- a producer warp issues the TMA loads of A [128, 128], B [128, 128], the step's 128
  A-row scales (a 1-D box of the column-major scale tensor) and B's block scale into a ring
  of STAGES slots,
  each with a `full` barrier (TMA transaction bytes) and an `empty` one;
- two consumer warpgroups, separate partitions with their own instruction streams, each own
  64 rows of the 128x128 tile: per K step each waits `full`, issues its wgmma into a fresh
  register tile, promotes the previous step's tile while that MMA runs, waits for the MMA and
  arrives on `empty` (count 2: both consumers). As their streams drift apart one promotes
  while the other multiplies.

B's scale per (N block, K step) is one float: by default TMA-loaded into the slot with the rest
(a 16-byte box of its flat tensor; SB_TMA=0 loads it from global memory in the consumers).
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
# TMA box and element type of each descriptor (launch and offline compile both build from it):
# A and B tiles, the step's A-row scales, B's block scale (16-byte minimum box), a consumer's
# half of the output tile.
BOXES = {"a_desc": ([BM, BK], "float8e4nv", "fp8e4nv"), "b_desc": ([BN, BK], "float8e4nv", "fp8e4nv"),
         "sa_desc": ([BM], "float32", "fp32"), "sb_desc": ([4], "float32", "fp32"),
         "c_desc": ([HALF, BN], "bfloat16", "bf16")}


def _box_layout(name):
    block, dtype, _ = BOXES[name]
    return gl.NVMMASharedLayout.get_default_for(block, getattr(gl, dtype))


@gluon.jit
def _coords(t, TILES_M, tiles_n, GROUP_M: gl.constexpr):
    """block_scaled._swizzled_tile's walk, restated: a Gluon kernel cannot call a Triton function."""
    width = GROUP_M * tiles_n
    first_m = (t // width) * GROUP_M
    size_m = gl.minimum(TILES_M - first_m, GROUP_M)
    return first_m + (t % width) % size_m, (t % width) // size_m


@gluon.jit
def _step(c: gl.constexpr, kb, g, acc, part, sa_prev, sb_prev, ring, sb_row, stride_sbk, zero,
          row_layout: gl.constexpr, STAGES: gl.constexpr, SB_TMA: gl.constexpr):
    """K step kb (ring step g): its wgmma into a fresh tile, the previous step's tile promoted
    while it runs; -> (acc, this step's tile, its scales, g + 1)."""
    a_bufs, b_bufs, sa_bufs, sb_bufs, full, empty = ring
    s = g % STAGES
    mbarrier.wait(full.index(s), (g // STAGES) & 1)
    tok = warpgroup_mma(a_bufs.index(s).slice(c * 64, 64), b_bufs.index(s).permute((1, 0)), zero, use_acc=False,
                        is_async=True)
    sa_now = sa_bufs.index(s).slice(c * 64, 64).load(row_layout)
    if SB_TMA == 1:  # B's scale came with the slot: element 0 of its 4-float box
        sb_layout: gl.constexpr = gl.BlockedLayout([4], [32], [4], [0])
        sbv = sb_bufs.index(s).load(sb_layout)
        sb_now = gl.sum(gl.where(gl.arange(0, 4, layout=sb_layout) == 0, sbv, 0.0), axis=0)
    else:  # a global load (the warp waits for it before the MMA wait: it moves to a uniform register)
        sb_now = gl.load(sb_row + kb * stride_sbk)
    acc = acc + part * gl.expand_dims(sa_prev * sb_prev, 1)
    part = warpgroup_mma_wait(0, deps=(tok, ))  # waited here: a running MMA carried across the loop edge
    mbarrier.arrive(empty.index(s), count=1)  # would make ptxas serialize every wgmma (C7514)
    return acc, part, sa_now, sb_now, g + 1


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
def _mask_rows(v, layout: gl.constexpr, grp_ptr, cnt_ptr, pid_m, pid_n, c: gl.constexpr, e, nk, M, MODE: gl.constexpr):
    """Contiguous mode: rows whose id is not the tile's expert (every row of a tile without one)
    become zeros; column tile 0 counts the -1 rows (counters[0]) and rows of another or an
    invalid id (counters[1]), as the Triton kernels do. Dense: v unchanged."""
    if MODE == 1:
        rows = pid_m * 128 + c * 64 + gl.arange(0, 64, layout=gl.SliceLayout(1, layout))
        rmask = rows < M
        ids = gl.load(grp_ptr + rows, mask=rmask, other=-1)
        ok = rmask & (ids == e) & (nk > 0)
        v = gl.where(gl.expand_dims(ok, 1), v, gl.zeros_like(v))
        if pid_n == 0:
            gl.atomic_add(cnt_ptr, gl.sum((rmask & (ids == -1)).to(gl.int32), axis=0), sem="relaxed")
            gl.atomic_add(cnt_ptr + 1, gl.sum((rmask & (ids != -1) & ~ok).to(gl.int32), axis=0), sem="relaxed")
    return v


@gluon.jit
def _consume(c: gl.constexpr, descs, bufs, ptrs, dims, GROUP_M: gl.constexpr, STAGES: gl.constexpr,
             UNROLL: gl.constexpr, MODE: gl.constexpr, EPI_TMA: gl.constexpr, SB_TMA: gl.constexpr):
    """Consumer c: rows [c * 64, c * 64 + 64) of every tile. UNROLL=2 runs two steps per loop
    trip, so that the two fresh MMA tiles can alternate registers (no copy of each result).
    EPI_TMA: the bf16 tile leaves through shared memory and a TMA store, else by pointer stores."""
    a_desc, b_desc, sa_desc, sb_desc, c_desc = descs
    a_bufs, b_bufs, sa_bufs, sb_bufs, c_bufs, full, empty = bufs
    d_ptr, sb_ptr, grp_ptr, cnt_ptr = ptrs
    M, N, K, E, TILES_M, stride_dm, stride_sbe, stride_sbn, stride_sbk, m_pad = dims
    ring = (a_bufs, b_bufs, sa_bufs, sb_bufs, full, empty)
    mma_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                         instr_shape=[16, 128, 32])
    row_layout: gl.constexpr = gl.SliceLayout(1, mma_layout)
    out_layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    pid = gl.program_id(0)
    nprog = gl.num_programs(0)
    tiles_n = gl.cdiv(N, 128)
    num_tiles = TILES_M * tiles_n
    zero = gl.zeros((64, 128), gl.float32, mma_layout)
    no_scale = gl.zeros((64, ), gl.float32, row_layout)
    g = pid * 0
    for tile in range(pid, num_tiles, nprog):
        pid_m, pid_n = _coords(tile, TILES_M, tiles_n, GROUP_M)
        e, nk = _tile_work(grp_ptr, pid_m, gl.cdiv(K, 128), E, MODE)
        sb_row = sb_ptr + e * stride_sbe + pid_n * stride_sbn
        # Step 0 promotes a zero tile with zero scales: acc stays +0, as the Triton kernel's starts.
        acc = zero
        part = zero
        sa = no_scale
        sb = 0.0
        if UNROLL == 2:
            for kb in range(0, nk - 1, 2):
                acc, part, sa, sb, g = _step(c, kb, g, acc, part, sa, sb, ring, sb_row, stride_sbk, zero, row_layout,
                                             STAGES, SB_TMA)
                acc, part, sa, sb, g = _step(c, kb + 1, g, acc, part, sa, sb, ring, sb_row, stride_sbk, zero,
                                             row_layout, STAGES, SB_TMA)
            if nk % 2 == 1:
                acc, part, sa, sb, g = _step(c, nk - 1, g, acc, part, sa, sb, ring, sb_row, stride_sbk, zero,
                                             row_layout, STAGES, SB_TMA)
        else:
            for kb in range(0, nk):
                acc, part, sa, sb, g = _step(c, kb, g, acc, part, sa, sb, ring, sb_row, stride_sbk, zero, row_layout,
                                             STAGES, SB_TMA)
        acc = acc + part * gl.expand_dims(sa * sb, 1)
        if EPI_TMA == 1:  # through this consumer's shared buffer; the store runs while the next tile starts
            vt = _mask_rows(acc.to(gl.bfloat16), mma_layout, grp_ptr, cnt_ptr, pid_m, pid_n, c, e, nk, M, MODE)
            cbuf = c_bufs.index(c)
            tma.store_wait(0)  # the previous tile's store has read the buffer
            cbuf.store(vt)
            fence_async_shared()
            tma.async_copy_shared_to_global(c_desc, [pid_m * 128 + c * 64, pid_n * 128], cbuf)
        else:
            v = _mask_rows(gl.convert_layout(acc.to(gl.bfloat16), out_layout), out_layout, grp_ptr, cnt_ptr, pid_m,
                           pid_n, c, e, nk, M, MODE)
            rows = pid_m * 128 + c * 64 + gl.arange(0, 64, layout=gl.SliceLayout(1, out_layout))
            cols = pid_n * 128 + gl.arange(0, 128, layout=gl.SliceLayout(0, out_layout))
            dst = d_ptr + gl.expand_dims(rows, 1) * stride_dm + gl.expand_dims(cols, 0)
            gl.store(dst, v, mask=gl.expand_dims(rows < M, 1) & gl.expand_dims(cols < N, 0))
    if EPI_TMA == 1:
        tma.store_wait(0)


@gluon.jit
def _consumer0(descs, bufs, ptrs, dims, GROUP_M: gl.constexpr, STAGES: gl.constexpr, UNROLL: gl.constexpr,
               MODE: gl.constexpr, EPI_TMA: gl.constexpr, SB_TMA: gl.constexpr):
    _consume(0, descs, bufs, ptrs, dims, GROUP_M, STAGES, UNROLL, MODE, EPI_TMA, SB_TMA)


@gluon.jit
def _consumer1(descs, bufs, ptrs, dims, GROUP_M: gl.constexpr, STAGES: gl.constexpr, UNROLL: gl.constexpr,
               MODE: gl.constexpr, EPI_TMA: gl.constexpr, SB_TMA: gl.constexpr):
    _consume(1, descs, bufs, ptrs, dims, GROUP_M, STAGES, UNROLL, MODE, EPI_TMA, SB_TMA)


@gluon.jit
def _producer_sb(descs, bufs, ptrs, dims, GROUP_M: gl.constexpr, STAGES: gl.constexpr, UNROLL: gl.constexpr,
                 MODE: gl.constexpr, EPI_TMA: gl.constexpr, SB_TMA: gl.constexpr):
    _produce(descs, bufs, ptrs, dims, GROUP_M, STAGES, MODE, 1)


@gluon.jit
def _producer_nosb(descs, bufs, ptrs, dims, GROUP_M: gl.constexpr, STAGES: gl.constexpr, UNROLL: gl.constexpr,
                   MODE: gl.constexpr, EPI_TMA: gl.constexpr, SB_TMA: gl.constexpr):
    _produce(descs, bufs, ptrs, dims, GROUP_M, STAGES, MODE, 0)


@gluon.jit
def _produce(descs, bufs, ptrs, dims, GROUP_M, STAGES, MODE, WITH_SB: gl.constexpr):
    """The TMA producer. Arguments through warp_specialize arrive as folded constants, not
    constexprs; the expected byte count must be one, hence WITH_SB from the two wrappers."""
    a_desc, b_desc, sa_desc, sb_desc, c_desc = descs
    a_bufs, b_bufs, sa_bufs, sb_bufs, c_bufs, full, empty = bufs
    d_ptr, sb_ptr, grp_ptr, cnt_ptr = ptrs
    M, N, K, E, TILES_M, stride_dm, stride_sbe, stride_sbn, stride_sbk, m_pad = dims
    pid = gl.program_id(0)
    nprog = gl.num_programs(0)
    tiles_n = gl.cdiv(N, 128)
    num_tiles = TILES_M * tiles_n
    nbytes: gl.constexpr = (a_desc.block_type.nbytes + b_desc.block_type.nbytes + sa_desc.block_type.nbytes
                            + WITH_SB * sb_desc.block_type.nbytes)
    g = pid * 0
    for tile in range(pid, num_tiles, nprog):
        pid_m, pid_n = _coords(tile, TILES_M, tiles_n, GROUP_M)
        e, nk = _tile_work(grp_ptr, pid_m, gl.cdiv(K, 128), E, MODE)
        for kb in range(nk):
            s = g % STAGES
            mbarrier.wait(empty.index(s), ((g // STAGES) & 1) ^ 1)  # a fresh barrier passes phase 1
            # The consumers read the slot's scales with ordinary shared loads: order those
            # before the TMA overwrites them (one fence here instead of one per consumer step).
            fence_async_shared()
            bar = full.index(s)
            mbarrier.expect(bar, nbytes)
            tma.async_copy_global_to_shared(a_desc, [pid_m * 128, kb * 128], bar, a_bufs.index(s))
            tma.async_copy_global_to_shared(b_desc, [e * N + pid_n * 128, kb * 128], bar, b_bufs.index(s))
            tma.async_copy_global_to_shared(sa_desc, [kb * m_pad + pid_m * 128], bar, sa_bufs.index(s))
            if WITH_SB:  # B's scale of (expert, N block, kb) and the 3 floats after it (box minimum 16 B)
                tma.async_copy_global_to_shared(sb_desc, [e * stride_sbe + pid_n * stride_sbn + kb], bar,
                                                sb_bufs.index(s))
            g += 1


@gluon.jit
def _ws_gemm_kernel(a_desc, b_desc, sa_desc, sb_desc, c_desc, d_ptr, sb_ptr, grp_ptr, cnt_ptr, M, N, K, E, TILES_M,
                    stride_dm, stride_sbe, stride_sbn, stride_sbk, m_pad, GROUP_M: gl.constexpr, STAGES: gl.constexpr,
                    UNROLL: gl.constexpr, MODE: gl.constexpr, EPI_TMA: gl.constexpr, SB_TMA: gl.constexpr,
                    num_warps: gl.constexpr):
    a_bufs = gl.allocate_shared_memory(a_desc.dtype, [STAGES] + a_desc.block_type.shape, a_desc.layout)
    b_bufs = gl.allocate_shared_memory(b_desc.dtype, [STAGES] + b_desc.block_type.shape, b_desc.layout)
    sa_bufs = gl.allocate_shared_memory(sa_desc.dtype, [STAGES] + sa_desc.block_type.shape, sa_desc.layout)
    sb_bufs = gl.allocate_shared_memory(sb_desc.dtype, [STAGES] + sb_desc.block_type.shape, sb_desc.layout)
    # One output buffer per consumer, allocated also without EPI_TMA: the partitions see EPI_TMA
    # as a folded constant, not a constexpr, so both epilogue branches must type-check.
    c_bufs = gl.allocate_shared_memory(c_desc.dtype, [2] + c_desc.block_type.shape, c_desc.layout)
    full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(full.index(i), count=1)
        mbarrier.init(empty.index(i), count=2)  # both consumers release a slot
    args = ((a_desc, b_desc, sa_desc, sb_desc, c_desc), (a_bufs, b_bufs, sa_bufs, sb_bufs, c_bufs, full, empty),
            (d_ptr, sb_ptr, grp_ptr, cnt_ptr), (M, N, K, E, TILES_M, stride_dm, stride_sbe, stride_sbn, stride_sbk,
                                                m_pad), GROUP_M, STAGES, UNROLL, MODE, EPI_TMA, SB_TMA)
    if SB_TMA == 1:
        gl.warp_specialize([(_consumer0, args), (_consumer1, args), (_producer_sb, args)], [4, 1], [232, 40])
    else:
        gl.warp_specialize([(_consumer0, args), (_consumer1, args), (_producer_nosb, args)], [4, 1], [232, 40])


def _descriptors(a, b, sa, sb, out):
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    def flat(t, n):  # the storage behind t as a 1-D tensor of n elements
        return torch.as_strided(t, (n, ), (1, ))

    tensors = {"a_desc": a, "b_desc": b, "sa_desc": flat(sa, sa.stride(1) * sa.shape[1]),  # [KG, M_pad] storage
               "sb_desc": flat(sb, sb.numel()), "c_desc": out}
    return tuple(TensorDescriptor.from_tensor(tensors[name], BOXES[name][0], _box_layout(name)) for name in BOXES)


def applies(a, sa, b, sb, grouped=False) -> bool:
    """The shapes and layouts this kernel handles: SM90, FP32 scales, A scales column-major with a
    16-byte aligned column stride, B per 128x128 block ([E, ...] when grouped), 16-byte rows."""
    m, k = a.shape
    n = b.shape[-2]
    lead = b.shape[:1] if grouped else ()
    return (a.is_cuda and torch.cuda.get_device_capability(a.device)[0] == 9 and sa.dtype == torch.float32
            and sb.dtype == torch.float32 and sa.stride(0) == 1 and sa.stride(1) % 4 == 0 and k > 0 and k % 16 == 0
            and tuple(sb.shape) == (*lead, -(-n // 128), -(-k // 128)) and sb.is_contiguous()
            and a.is_contiguous() and b.is_contiguous())


def _launch(mode, a, sa, b2, sb, grp, cnt, n, e, out, stages, group_m, nprog, unroll, epi_tma, sb_tma):
    m, k = a.shape
    if epi_tma and (out.stride(1) != 1 or out.stride(0) % 8 or out.data_ptr() % 16):
        raise ValueError("epi_tma needs out with 16-byte aligned rows")
    tiles_m = -(-m // BM)
    tiles = tiles_m * -(-n // BN)
    nprog = nprog or min(tiles, torch.cuda.get_device_properties(a.device).multi_processor_count)
    sb_e = sb.stride(0) if sb.dim() == 3 else 0
    _ws_gemm_kernel[(nprog, )](*_descriptors(a, b2, sa, sb, out), out, sb, grp, cnt, m, n, k, e, tiles_m, out.stride(0),
                               sb_e, sb.stride(-2), sb.stride(-1), sa.stride(1), GROUP_M=group_m, STAGES=stages,
                               UNROLL=unroll, MODE=mode, EPI_TMA=int(epi_tma), SB_TMA=int(sb_tma), num_warps=4,
                               maxnreg=168)
    return out


def fp8_gemm_nt_ws(a, sa, b, sb, out=None, stages=4, group_m=8, nprog=None, unroll=2, epi_tma=False, sb_tma=True):
    """Dense D = A @ B^T (bf16) through the warp-specialized kernel; the caller checks applies()."""
    m, n = a.shape[0], b.shape[0]
    out = torch.empty(m, n, dtype=torch.bfloat16, device=a.device) if out is None else out
    return _launch(0, a, sa, b, sb, a, a, n, 1, out, stages, group_m, nprog, unroll, epi_tma, sb_tma)


def m_grouped_fp8_gemm_nt_contiguous_ws(a, sa, b, sb, m_indices, out=None, counters=None, stages=4, group_m=8,
                                        nprog=None, unroll=2, epi_tma=False, sb_tma=True):
    """m-grouped contiguous: a [M_sum, K] (expert segments aligned to 128 rows, m_indices int32,
    -1 = padding), b [E, N, K] -> out [M_sum, N]; counters [2] int32 as the Triton kernel's."""
    m = a.shape[0]
    e, n = b.shape[:2]
    out = torch.empty(m, n, dtype=torch.bfloat16, device=a.device) if out is None else out
    counters = torch.zeros(2, dtype=torch.int32, device=a.device) if counters is None else counters
    return _launch(1, a, sa, b.reshape(-1, b.shape[-1]), sb, m_indices, counters, n, e, out, stages, group_m, nprog,
                   unroll, epi_tma, sb_tma)


def compile_sm90a(stages=4, unroll=2, mode=0, epi_tma=0, sb_tma=1):
    """Offline compile for sm_90a (no GPU needed): -> triton CompiledKernel (asm: ttgir, ptx, cubin)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    sig = {name: f"tensordesc<{ty}{block},{_box_layout(name)!r}>" for name, (block, _, ty) in BOXES.items()}
    sig |= {"d_ptr": "*bf16", "sb_ptr": "*fp32", "grp_ptr": "*i32", "cnt_ptr": "*i32", "M": "i32", "N": "i32",
            "K": "i32", "E": "i32", "TILES_M": "i32", "stride_dm": "i32", "stride_sbe": "i32", "stride_sbn": "i32",
            "stride_sbk": "constexpr", "m_pad": "i32", "GROUP_M": "constexpr", "STAGES": "constexpr",
            "UNROLL": "constexpr", "MODE": "constexpr", "EPI_TMA": "constexpr", "SB_TMA": "constexpr",
            "num_warps": "constexpr"}
    const = {"stride_sbk": 1, "GROUP_M": 8, "STAGES": stages, "UNROLL": unroll, "MODE": mode, "EPI_TMA": epi_tma,
             "SB_TMA": sb_tma, "num_warps": 4}
    return triton.compile(GluonASTSource(_ws_gemm_kernel, sig, const), target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": 4, "maxnreg": 168})


if __name__ == "__main__":  # python -m bench.sm90_ws_gemm OUT_DIR [stages unroll mode epi_tma sb_tma]: sm_90a PTX
    import json
    import pathlib
    import sys

    out_dir = pathlib.Path(sys.argv[1])
    stages, unroll, mode, epi_tma, sb_tma = (int(v) for v in (sys.argv[2:7] if len(sys.argv) > 6 else (4, 2, 0, 0, 1)))
    kernel = compile_sm90a(stages, unroll, mode, epi_tma, sb_tma)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "kernel.ptx").write_text(kernel.asm["ptx"])
    (out_dir / "kernel.cubin").write_bytes(kernel.asm["cubin"])
    (out_dir / "meta.json").write_text(json.dumps({"num_warps": kernel.metadata.num_warps,
                                                   "shared": kernel.metadata.shared}))
