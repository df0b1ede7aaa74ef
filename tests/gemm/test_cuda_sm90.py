"""The CUDA SM90 GEMM with 2-CTA clusters multicasting B (csrc/fp8_gemm_sm90.cu, rtp_fp8._ext.fp8_gemm_sm90).

SM90 GPU with the built extension: bit-identical to the Triton kernel (block_scaled.USE_WS off; the
same m64n128 products per 128-column half and K block, the same FP32 promotion) on ragged shapes: an
odd number of 128-row tiles (the last cluster's second CTA has no rows), M, N and the last 256-column
tile partial, K of 1 to 56 blocks; into a padded `out` whose guard rows and columns must stay
poisoned; within TOL of the float64 oracle; and each bad argument refused with a message naming it.
With multicast off (each CTA loads its own B, its ring its own) the bits are the same.
m-grouped contiguous (fp8_gemm_sm90_contiguous): bit-identical to the Triton kernel, counters too, on
a layout with padding rows, an out-of-range id, a ragged and an empty expert, and pairs of row tiles
of one expert (B multicast) and of two (each CTA loads its own). Through the dispatch with
block_scaled.USE_CLUSTER on (as shipped), dense and contiguous calls that sm90_ws runs in 128x256
tiles take it (column splits too).
CPU: block_scaled.cluster_refusal's reasons and wide_tiles' grids.
"""

import functools

import pytest
import torch

from helpers import assert_bits_equal, dense_operands, rel_l2
from rtp_fp8 import _ext
from rtp_fp8.gemm import reference as GR
from rtp_fp8.gemm.triton import block_scaled as G

TOL = 5e-3


needs_ext = pytest.mark.skipif(not (torch.cuda.is_available() and _ext.available()),
                               reason=f"needs the built extension ({_ext.unavailable_reason()})")


def _ops(m, n, k, seed, e=None):
    return dense_operands(m, n, k, seed, e)


def _triton(monkeypatch, a, sa, b, sb):
    """The Triton kernel, unsplit: small grids would otherwise split K (another FP32 summation order)."""
    with monkeypatch.context() as mp:
        mp.setattr(G, "USE_WS", False)
        mp.setattr(G, "USE_SWAP", False)
        mp.setattr(G, "USE_NARROW", False)
        mp.setattr(G, "FORCE_SPLIT_K", 1)
        return G.fp8_gemm_nt(a, sa, b, sb)


def _check_framed(monkeypatch, buf, out, ops, what):
    """out = buf[1:M + 1, 8:N + 8], written by a kernel: bit-identical to the Triton kernel's, the
    guard row above and below and the 8 guard columns each side still NaN, within TOL of the oracle."""
    m, n = out.shape
    assert_bits_equal(out, _triton(monkeypatch, *ops), what)
    assert bool(torch.isnan(buf[0]).all() and torch.isnan(buf[m + 1:]).all())  # guard rows
    assert bool(torch.isnan(buf[:, :8]).all() and torch.isnan(buf[:, n + 8:]).all())  # guard columns
    assert rel_l2(out.double().cpu(), GR.gemm_nt_ref(*ops)) <= TOL


@pytest.mark.gpu_sm90
@needs_ext
@pytest.mark.parametrize("m,n,k", [(4096, 2048, 640), (384, 512, 128), (1100, 2112, 1664), (200, 264, 7168),
                                   (2048, 4096, 256), (128, 7168, 2048)])
@pytest.mark.parametrize("group_m,multicast", [(1, True), (8, True), (8, False)])
def test_bit_identical_to_triton_and_guards_untouched(monkeypatch, m, n, k, group_m, multicast):
    a, sa, b, sb = _ops(m, n, k, seed=m + n + k)
    buf = torch.full((m + 3, n + 24), float("nan"), dtype=torch.bfloat16, device="cuda")
    out = buf[1:m + 1, 8:n + 8]  # 16-byte aligned start, row stride n + 24
    _ext.fp8_gemm_sm90(a, sa, b, sb, out, group_m, 0, multicast)
    _check_framed(monkeypatch, buf, out, (a, sa, b, sb), f"({m}, {n}, {k})")


def _replayed(out, call):
    """out as `call` writes it when captured in a CUDA graph and replayed, out NaN before the capture
    and again before the replay."""
    out.fill_(float("nan"))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    return out


@pytest.mark.gpu_sm90
@needs_ext
def test_repeated_calls_and_a_cuda_graph_replay_give_the_same_bits():
    a, sa, b, sb = _ops(1024, 1024, 1024, seed=7)
    out = torch.full((1024, 1024), float("nan"), dtype=torch.bfloat16, device="cuda")
    _ext.fp8_gemm_sm90(a, sa, b, sb, out)
    first = out.clone()
    assert torch.equal(_replayed(out, lambda: _ext.fp8_gemm_sm90(a, sa, b, sb, out)), first)


@pytest.mark.gpu_sm90
@needs_ext
def test_bad_arguments_are_refused_by_name():
    a, sa, b, sb = _ops(256, 256, 256, seed=1)
    out = torch.empty(256, 256, dtype=torch.bfloat16, device="cuda")
    cases = [
        ((a.float(), sa, b, sb, out), "a and b must be float8_e4m3fn"),
        ((a, sa.double(), b, sb, out), "sa and sb must be float32"),
        ((a, sa, b, sb, out.float()), "out must be bfloat16"),
        ((a, sa, b[:, :128], sb, out), "b must be \\[N, K\\]"),
        ((a, sa, b, sb, out[:, :128]), "out must be \\[M, N\\]"),
        ((a, sa, b, sb[:1], out), "sb must be"),
        ((a, sa.contiguous()[:, :1], b, sb, out), "sa must be"),
        ((a, sa.contiguous(), b, sb, out), "sa must be column-major"),
        ((a, sa, b, sb, out.cpu()), "must be CUDA tensors"),
        ((a, sa, b, sb, torch.empty(256, 512, dtype=torch.bfloat16, device="cuda")[:, 1:257]),
         "out must start 16-byte aligned"),
    ]
    for args, msg in cases:
        with pytest.raises(RuntimeError, match=msg):
            _ext.fp8_gemm_sm90(*args)
    with pytest.raises(RuntimeError, match="group_m must be positive"):
        _ext.fp8_gemm_sm90(a, sa, b, sb, out, 0)


def _spy(monkeypatch):
    calls = []
    real = G._ext.fp8_gemm_sm90

    def spy(a, sa, b, sb, out, group_m):
        calls.append((tuple(a.shape), tuple(b.shape), group_m))
        return real(a, sa, b, sb, out, group_m)

    monkeypatch.setattr(G._ext, "fp8_gemm_sm90", spy)
    return calls


@pytest.mark.gpu_sm90
@needs_ext
@pytest.mark.parametrize("m,n,k,wide", [(4096, 4096, 512, 4096), (4096, 2112, 7168, 2048)])  # 2112: column split
def test_dispatch_takes_the_cluster_kernel_for_128x256_tiles(monkeypatch, m, n, k, wide):
    a, sa, b, sb = _ops(m, n, k, seed=n + k)
    monkeypatch.setattr(G.A, "num_sms", lambda index: 132)  # tile_shape's choice as on the H100 / H200
    monkeypatch.setattr(G, "USE_CLUSTER", True)
    calls = _spy(monkeypatch)
    out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
    G.fp8_gemm_nt(a, sa, b, sb, out=out)
    assert calls == [((m, k), (wide, k), G.CLUSTER_GROUP_M)]
    assert not bool(torch.isnan(out).any())
    with monkeypatch.context() as mp:  # the dispatch without it: sm90_ws, bit-identical (unsplit columns)
        mp.setattr(G, "USE_CLUSTER", False)
        ref = G.fp8_gemm_nt(a, sa, b, sb)
    assert len(calls) == 1
    assert_bits_equal(out[:, :wide], ref[:, :wide], "the 128x256 columns")
    assert_bits_equal(out[:, wide:], ref[:, wide:], "the other columns")


def test_cluster_refusal_names_each_reason(monkeypatch):
    a = torch.empty(4096, 1024, dtype=torch.float8_e4m3fn)
    out = torch.empty(4096, 4096, dtype=torch.bfloat16)
    assert G.USE_CLUSTER is True  # as shipped
    monkeypatch.setattr(G._ext, "available", lambda: False)
    monkeypatch.setattr(G._ext, "unavailable_reason", lambda: "_C.so not built")
    assert G.cluster_refusal(a, out) == "the CUDA extension is absent: _C.so not built"
    monkeypatch.setattr(G._ext, "available", lambda: True)
    monkeypatch.setattr(G._ext, "_load", lambda: (object(), ""))  # an extension without the op
    assert G.cluster_refusal(a, out).startswith("the CUDA extension predates the cluster kernel")
    monkeypatch.setattr(G._ext, "_load", lambda: (type("Ops", (), {"fp8_gemm_sm90": None}), ""))
    assert G.cluster_refusal(a, out) is None
    assert G.cluster_refusal(a, torch.empty(4096, 4100, dtype=torch.bfloat16)[:, :4096]) == "out is not TMA-aligned"
    big = torch.empty(1, G.CLUSTER_MAX_K + 128, dtype=torch.float8_e4m3fn)
    assert G.cluster_refusal(big, out) == f"K={G.CLUSTER_MAX_K + 128} > {G.CLUSTER_MAX_K}"
    monkeypatch.setattr(G, "USE_CLUSTER", False)
    assert G.cluster_refusal(a, out) == "USE_CLUSTER is off"


@pytest.mark.skipif(G.sm90_ws is None, reason="this Triton has no Gluon (sm90_ws's operand rules)")
def test_narrow_refusal_names_each_reason_and_the_ring_follows_k(monkeypatch):
    m, n, k = 64, 7168, 2048  # the operands' metadata only: nothing is computed
    a80, sa80 = torch.empty(80, k, dtype=torch.float8_e4m3fn), torch.empty(k // 128, 80).t()  # sa col_tma
    b, sb = torch.empty(n, k, dtype=torch.float8_e4m3fn), torch.empty(n // 128, k // 128)
    out80 = torch.empty(80, n, dtype=torch.bfloat16)
    a, sa, out = a80[:m], sa80[:m], out80[:m]
    assert G.USE_NARROW is True  # as shipped
    monkeypatch.setattr(G._ext, "_load", lambda: (object(), ""))  # an extension without the op
    assert G.narrow_refusal(a, sa, b, sb, out).startswith("the CUDA extension predates the narrow kernel")
    monkeypatch.setattr(G._ext, "_load", lambda: (type("Ops", (), {"fp8_gemm_sm90_narrow": None}), ""))
    monkeypatch.setattr(G.A, "detect", lambda device: G.A.Arch(9, 0))
    monkeypatch.setattr(G.A, "num_sms", lambda index: 132)
    assert G.narrow_refusal(a, sa, b, sb, out) is None
    rows = G.NARROW_MIN_ROWS - 1
    assert G.narrow_refusal(a80[:rows], sa80[:rows], b, sb, out80[:rows]) == (
        f"M={rows} outside {G.NARROW_MIN_ROWS}..{G.NARROW_MAX_ROWS}")
    a200, sa200 = torch.empty(200, 7168, dtype=torch.float8_e4m3fn), torch.empty(56, 200).t()
    out200 = torch.empty(200, 4096, dtype=torch.bfloat16)
    b4, sb4 = torch.empty(4096, 7168, dtype=torch.float8_e4m3fn), torch.empty(32, 56)
    assert G.narrow_refusal(a200[:129], sa200[:129], b4, sb4, out200[:129]) == (
        f"M=129 outside {G.NARROW_MIN_ROWS}..{G.NARROW_MAX_ROWS}")
    assert G.narrow_refusal(a200[:128], sa200[:128], b4, sb4, out200[:128]) is None  # 2 x 64 tiles
    # (16-64, 4096, 7168): the swapped kernel would split K 4 ways; 128 tiles of 64x32 fill 128 of 132 SMs
    for rows in (16, 32, 64):
        assert G.swap_config(rows, 4096, 7168, rows, 132)[3] == 4
        assert G.narrow_refusal(a200[:rows], sa200[:rows], b4, sb4, out200[:rows]) is None
    # (64, 2048, 7168): 64 tiles, half the SMs, where the swapped kernel's splits spread the weight over all
    splits = G.swap_config(64, 2048, 7168, 64, 132)[3]
    assert splits > 1 and G.narrow_refusal(a200[:64], sa200[:64], b4[:2048], sb4[:16], out200[:64, :2048]) == (
        f"the swapped kernel splits K {splits} ways and 64 tiles of 64x32 fill fewer than 0.875 of 132 SMs")
    # 1-7 rows (an A box of M rows) as 8-64: 128 tiles of 64x32 where the swapped kernel splits K 4 ways, 128 of
    # 64x56 at N=7168, and grids of several tiles per CTA
    for rows in (1, 7, 8):
        assert G.narrow_refusal(a200[:rows], sa200[:rows], b4, sb4, out200[:rows]) is None
        assert G.narrow_refusal(a80[:rows], sa80[:rows], b, sb, out80[:rows]) is None
    b2, sb2 = torch.empty(16384, k, dtype=torch.float8_e4m3fn), torch.empty(128, k // 128)
    assert G.narrow_refusal(a80[:1], sa80[:1], b2, sb2, torch.empty(1, 16384, dtype=torch.bfloat16)) is None
    assert G.narrow_refusal(a200[:1], sa200[:1], b4[:2048], sb4[:16], out200[:1, :2048]) == (
        f"the swapped kernel splits K {G.swap_config(1, 2048, 7168, 1, 132)[3]} ways and 64 tiles of 64x32 fill "
        "fewer than 0.875 of 132 SMs")
    # (128, 1024, 7168): 32 tiles, which sm90_ws splits 4 ways to fill the GPU; each narrow tile reads all of K
    assert G.narrow_refusal(a200[:128], sa200[:128], b4[:1024], sb4[:8], out200[:128, :1024]) == (
        "sm90_ws splits K 4 ways")
    # (80, 7168, 2048): 224 tiles of 64x64 would make two waves; 128 of 64x112 make one
    assert G.narrow_refusal(a80, sa80, b, sb, out80) is None
    # up to 64 rows: 128 tiles of 64x56 in one wave, against 224 of 64x32, but at 16-48 rows 64x32
    assert [G.narrow_block_n(r, 7168, 132) for r in (1, 7, 8, 15, 16, 33, 48, 49, 64, 65, 80, 112, 113)] == [
        56, 56, 56, 56, 32, 32, 32, 56, 56, 112, 112, 112, 64]
    # 128 tiles of 64x32 make one wave: they stay; 147 of 64x56 would not fit
    assert [G.narrow_block_n(r, 4096, 132) for r in (1, 8, 64)] == [32, 32, 32]
    assert [G.narrow_block_n(r, 8192, 132) for r in (1, 8, 64)] == [32, 32, 32]
    # (128, 7168, 2048): over 112 rows 64x112 tiles lost to sm90_ws's 128x64
    a128, sa128, out128 = torch.empty(128, k, dtype=torch.float8_e4m3fn), torch.empty(k // 128, 128).t(), \
        torch.empty(128, n, dtype=torch.bfloat16)
    assert G.narrow_refusal(a128, sa128, b, sb, out128) == "224 tiles of 64x64 over 132 SMs"
    assert [G.narrow_block_n(r, 4096, 132) for r in (64, 65, 128)] == [32, 64, 64]
    b16, sb16 = torch.empty(16384, k, dtype=torch.float8_e4m3fn), torch.empty(128, k // 128)
    out16 = torch.empty(80, 16384, dtype=torch.bfloat16)
    assert G.narrow_refusal(a80, sa80, b16, sb16, out16) == "294 tiles of 64x112 over 132 SMs"
    assert G.narrow_refusal(a, sa.contiguous(), b, sb, out).startswith("needs A's scales column-major")
    huge = torch.empty(m, G.NARROW_MAX_K + 128, dtype=torch.float8_e4m3fn)
    assert G.narrow_refusal(huge, sa, b, sb, out) == f"K={G.NARROW_MAX_K + 128} > {G.NARROW_MAX_K}"
    assert G.narrow_refusal(a, sa, b, sb, out, packed_a=True) == "needs FP32 scales, B's per 128x128 block"
    assert G.narrow_refusal(a, sa, b, sb, torch.empty(m, n + 4, dtype=torch.bfloat16)[:, :n]) == (
        "needs out's start and row stride 16-byte aligned")
    assert G.narrow_refusal(a, sa, b, sb, torch.empty(m, n + 8, dtype=torch.bfloat16)[:, :n]) is None
    monkeypatch.setattr(G.A, "detect", lambda device: G.A.Arch(12, 0))
    assert G.narrow_refusal(a, sa, b, sb, out) == "needs SM90, got sm120"
    monkeypatch.setattr(G._ext, "available", lambda: False)
    monkeypatch.setattr(G._ext, "unavailable_reason", lambda: "_C.so not built")
    assert G.narrow_refusal(a, sa, b, sb, out) == "the CUDA extension is absent: _C.so not built"
    monkeypatch.setattr(G, "USE_NARROW", False)
    assert G.narrow_refusal(a, sa, b, sb, out) == "USE_NARROW is off"
    assert [G.narrow_stages(k) for k in (128, 2048, 4096, 7168, 16384)] == [6, 6, 8, 12, 12]
    assert [G.narrow_stages(k, 112) for k in (128, 2048, 4096, 7168, 16384)] == [6, 6, 8, 9, 9]
    assert [G.narrow_stages(k, 64) for k in (128, 2048, 4096, 7168, 16384)] == [8, 8, 8, 12, 12]
    assert [G.narrow_stages(k, 56) for k in (128, 2048, 4096, 7168, 16384)] == [8, 8, 8, 12, 12]


@pytest.mark.gpu_sm90
@needs_ext
@pytest.mark.parametrize("m,n,k", [(64, 7168, 2048), (33, 7168, 2048), (48, 264, 640), (128, 4096, 7168),
                                   (100, 1000, 384), (16, 7168, 2048), (20, 4096, 7168), (32, 4096, 7168),
                                   (64, 4096, 7168), (112, 7168, 2048), (80, 7000, 640), (1, 7168, 2048),
                                   (7, 7168, 2048), (8, 4096, 7168), (5, 264, 640), (12, 7000, 640), (56, 7000, 640),
                                   (1, 4096, 7168), (3, 4096, 7168)])
def test_dispatch_takes_the_narrow_kernel_for_1_to_128_rows(monkeypatch, m, n, k):
    a, sa, b, sb = _ops(m, n, k, seed=m + n)
    calls = []
    real = G._ext.fp8_gemm_sm90_narrow

    def spy(a, sa, b, sb, out, block_n, stages, pdl):
        calls.append((tuple(a.shape), block_n, stages, pdl))
        return real(a, sa, b, sb, out, block_n, stages, pdl=pdl)

    monkeypatch.setattr(G._ext, "fp8_gemm_sm90_narrow", spy)
    out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
    G.fp8_gemm_nt(a, sa, b, sb, out=out)
    bn = G.narrow_block_n(m, n, torch.cuda.get_device_properties(0).multi_processor_count)
    assert calls == [((m, k), bn, G.narrow_stages(k, bn), G.NARROW_PDL)]
    assert_bits_equal(out, _triton(monkeypatch, a, sa, b, sb), f"({m}, {n}, {k})")
    with monkeypatch.context() as mp:  # off: the kernel it replaced (swapped or sm90_ws), not it
        mp.setattr(G, "USE_NARROW", False)
        G.fp8_gemm_nt(a, sa, b, sb)
    assert len(calls) == 1


@pytest.mark.skipif(G.sm90_ws is None, reason="this Triton has no Gluon (sm90_ws)")
def test_wide_tiles_are_the_unsplit_dense_and_contiguous_128x256_grids():
    sms = 132
    assert G.wide_tiles(G.DENSE, 4096, 7168, 1, sms)  # 32 x 28 tiles of 128x256
    assert G.wide_tiles(G.CONTIGUOUS, 8 * 4096, 4096, 1, sms)
    assert not G.wide_tiles(G.DENSE, 4096, 7168, 2, sms)  # a K split
    assert not G.wide_tiles(G.MASKED, 4096, 7168, 1, sms)
    assert not G.wide_tiles(G.DENSE, 128, 7168, 1, sms)  # a decode batch: 128x64 tiles
    assert not G.wide_tiles(G.DENSE, 4096, 2112, 1, sms)  # N is not whole 256-column tiles


def _grouped_case(n, k, seed, reps=1):
    """(ids, a, sa, b, sb), E=4, reps times: expert 0: 512 rows; 128 padding rows; expert 2: 384 rows;
    128 rows of id 9; a ragged expert 3 segment of 200 rows padded to 256; expert 1 empty. Row tile
    pairs (0, 1) share expert 0, (4, 5) pair padding with expert 2, (6, 7) id 9 with expert 3."""
    parts = [(0, 512), (-1, 128), (2, 384), (9, 128), (3, 200), (-1, 56)] * reps
    ids = torch.cat([torch.full((c,), e, dtype=torch.int32) for e, c in parts]).cuda()
    return (ids, *_ops(ids.numel(), n, k, seed, e=4))


@pytest.mark.gpu_sm90
@needs_ext
@pytest.mark.parametrize("n,k,reps,multicast", [(2048, 512, 1, True), (2112, 1152, 1, True), (512, 7168, 2, True),
                                               (2112, 1152, 1, False)])
def test_contiguous_bit_identical_to_triton_with_counters(monkeypatch, n, k, reps, multicast):
    _check_contiguous(monkeypatch, *_grouped_case(n, k, seed=n + k, reps=reps), multicast, [184 * reps, 128 * reps])


def _check_contiguous(monkeypatch, ids, a, sa, b, sb, multicast, counts):
    """The extension's contiguous GEMM (out poisoned) against the Triton kernel: the same bits and
    counters (== counts), zeros on rows without a valid expert, the others near the reference."""
    m, n, k = ids.numel(), b.shape[1], a.shape[1]
    out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
    cnt = torch.zeros(2, dtype=torch.int32, device="cuda")
    _ext.fp8_gemm_sm90_contiguous(a, sa, b, sb, ids, out, cnt, 8, 0, multicast)
    with monkeypatch.context() as mp:
        mp.setattr(G, "USE_WS", False)
        cnt_ref = torch.zeros(2, dtype=torch.int32, device="cuda")
        ref = G.m_grouped_fp8_gemm_nt_contiguous(a, sa, b, sb, ids, counters=cnt_ref)
    assert_bits_equal(out, ref, f"contiguous ({m}, {n}, {k})")
    assert cnt.tolist() == cnt_ref.tolist() == counts
    valid = (ids >= 0) & (ids < b.shape[0])
    assert bool((out[~valid] == 0).all())
    want = GR.grouped_contiguous_ref(a, sa, b, sb, ids)
    assert rel_l2(out[valid].double().cpu(), want[valid.cpu()]) <= TOL


@pytest.mark.gpu_sm90
@needs_ext
@pytest.mark.parametrize("multicast", [True, False])
def test_contiguous_idle_pairs_store_zeros(monkeypatch, multicast):
    """Row tile pairs with no expert in either tile (padding pairs mid-layout and the workspace's padded
    tail, as an MoE executor leaves them) run no K block: zeros stored, counted, the other tiles' bits
    unchanged, and the ring stays in step for the tiles after them."""
    parts = [(0, 256), (-1, 256), (2, 200), (-1, 56), (3, 128), (-1, 512)]  # pairs (2, 3), (8, 9), (10, past M) idle
    ids = torch.cat([torch.full((c,), e, dtype=torch.int32) for e, c in parts]).cuda()
    _check_contiguous(monkeypatch, ids, *_ops(ids.numel(), 2048, 1152, 11, e=4), multicast, [824, 0])


@pytest.mark.gpu_sm90
@needs_ext
def test_dispatch_takes_the_cluster_kernel_for_contiguous_128x256_tiles(monkeypatch):
    ids, a, sa, b, sb = _grouped_case(4096, 256, seed=3, reps=16)  # 176 row tiles x 16 wide tiles
    monkeypatch.setattr(G.A, "num_sms", lambda index: 132)
    monkeypatch.setattr(G, "USE_CLUSTER", True)
    calls = []
    real = G._ext.fp8_gemm_sm90_contiguous
    monkeypatch.setattr(G._ext, "fp8_gemm_sm90_contiguous", lambda *args: calls.append(args[-1]) or real(*args))
    out = G.m_grouped_fp8_gemm_nt_contiguous(a, sa, b, sb, ids)
    assert calls == [G.CLUSTER_GROUP_M]
    with monkeypatch.context() as mp:
        mp.setattr(G, "USE_CLUSTER", False)
        ref = G.m_grouped_fp8_gemm_nt_contiguous(a, sa, b, sb, ids)
    assert_bits_equal(out, ref, "contiguous through the dispatch")


@pytest.mark.gpu_sm90
@needs_ext
def test_clusters_fit_and_a_smaller_grid_gives_the_same_bits():
    fit = _ext.fp8_gemm_sm90_clusters(2048)
    assert 1 <= fit <= torch.cuda.get_device_properties(0).multi_processor_count // 2
    a, sa, b, sb = _ops(1024, 2048, 2048, seed=11)  # 4 x 8 pair tiles
    out = torch.full((1024, 2048), float("nan"), dtype=torch.bfloat16, device="cuda")
    _ext.fp8_gemm_sm90(a, sa, b, sb, out)
    few = torch.full_like(out, float("nan"))
    _ext.fp8_gemm_sm90(a, sa, b, sb, few, 8, 3)  # 3 clusters walk the 32 pair tiles
    assert_bits_equal(few, out, "3 clusters")
    with pytest.raises(RuntimeError, match="clusters must be >= 0"):
        _ext.fp8_gemm_sm90(a, sa, b, sb, few, 8, -1)


# The narrow kernel (fp8_gemm_sm90_narrow): 64 x block_n tiles for few rows. Ragged M (a partial
# second row tile; below 64 rows an A box of M rows, its slot's other rows stale, and an A-scale box of M
# rounded up to 4: 1, 5 and 13 rows; with multicast the 16-row boxes), N not a multiple of the tile (and odd: the
# last column stored alone; an odd number of column tiles, so the last cluster's second CTA has none), K of 1 to
# 56 blocks (odd and even counts, and 1 and 2, where the consumer's loop, unrolled by two, runs only
# its tail), rings of 2 or 3 slots and of as many as fit, with and without A multicast, and grids
# with more tiles than SMs (each CTA walks several, its ring running on across them).
@pytest.mark.gpu_sm90
@needs_ext
@pytest.mark.parametrize("m,n,k", [(1, 4096, 7168), (5, 264, 640), (13, 1000, 384), (64, 7168, 2048),
                                   (100, 131, 1664), (128, 4096, 128), (40, 520, 256), (256, 7168, 512)])
@pytest.mark.parametrize("block_n", [32, 56, 64, 112, 128])
@pytest.mark.parametrize("stages,multicast,pdl", [(2, False, 0), (0, False, 1), (3, True, 2), (0, True, 0)])
def test_narrow_bit_identical_to_triton_and_guards_untouched(monkeypatch, m, n, k, block_n, stages, multicast, pdl):
    a, sa, b, sb = _ops(m, n, k, seed=m + n + k + block_n)
    width = (n + 24 + 7) // 8 * 8  # a row stride of whole 16-byte units
    buf = torch.full((m + 3, width), float("nan"), dtype=torch.bfloat16, device="cuda")
    out = buf[1:m + 1, 8:n + 8]
    _ext.fp8_gemm_sm90_narrow(a, sa, b, sb, out, block_n, stages, multicast, pdl)
    _check_framed(monkeypatch, buf, out, (a, sa, b, sb),
                  f"({m}, {n}, {k}) 64x{block_n} s{stages} mc {multicast} pdl {pdl}")


@pytest.mark.gpu_sm90
@needs_ext
def test_narrow_graph_replay_and_bad_arguments():
    a, sa, b, sb = _ops(64, 1024, 1024, seed=5)
    out = torch.full((64, 1024), float("nan"), dtype=torch.bfloat16, device="cuda")
    _ext.fp8_gemm_sm90_narrow(a, sa, b, sb, out)
    first = out.clone()
    for pdl in (0, 1, 2):  # a programmatic dependent is captured as such
        call = functools.partial(_ext.fp8_gemm_sm90_narrow, a, sa, b, sb, out, 64, 0, True, pdl)
        assert_bits_equal(_replayed(out, call), first, f"graph replay, pdl {pdl}")
    most = _ext.fp8_gemm_sm90_narrow_stages(64)
    assert 2 <= most <= 16
    assert _ext.fp8_gemm_sm90_narrow_stages(G.NARROW_WIDE_BLOCK_N) == G.NARROW_WIDE_STAGES  # the dispatch's cap
    for bn, st, msg in [(48, 0, "block_n must be one of 32, 56, 64, 112, 128, got 48"), (64, 1, "stages must be 0"),
                        (64, most + 1, "stages must be 0")]:
        with pytest.raises(RuntimeError, match=msg):
            _ext.fp8_gemm_sm90_narrow(a, sa, b, sb, out, bn, st)
    for pdl in (-1, 3):
        with pytest.raises(RuntimeError, match="pdl must be 0"):
            _ext.fp8_gemm_sm90_narrow(a, sa, b, sb, out, 64, 0, False, pdl)
    with pytest.raises(RuntimeError, match="sa must be column-major"):
        _ext.fp8_gemm_sm90_narrow(a, sa.contiguous(), b, sb, out)
    big = _ops(1, 128, G.NARROW_MAX_K + 128, seed=6)  # 1025 K blocks: a B-scale row over 4 KB
    with pytest.raises(RuntimeError, match=f"is over {G.NARROW_MAX_K} "):  # the dispatch's limit is the op's
        _ext.fp8_gemm_sm90_narrow(*big, torch.empty(1, 128, dtype=torch.bfloat16, device="cuda"))
    with pytest.raises(RuntimeError, match="block_n must be one of 32, 56, 64, 112, 128, got 96"):
        _ext.fp8_gemm_sm90_narrow_stages(96)
