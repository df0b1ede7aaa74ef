"""The SM90 warp-specialized Gluon GEMM (rtp_fp8/gemm/triton/sm90_ws.py).

CPU: plan()'s rules, for an explicit Arch and SM count (where it applies, and the reason
where it does not). SM90 GPU: through the shipped dispatch it must be bit-identical to the
Triton kernel (block_scaled.USE_WS off; same tiles, same FP32 promotion order) on ragged shapes
with an odd number of K steps, both epilogues (TMA store; pointer stores into a padded `out`
whose guard columns must stay poisoned), grouped layouts with padding rows, an out-of-range id
and empty experts (counters too); and within 5e-3 relative L2 of the float64 oracle.
"""

import pytest
import torch

from helpers import masked_operands, rel_l2, spy_ws_pdls
from rtp_fp8 import arch as A
from rtp_fp8.gemm import reference as GR
from rtp_fp8.gemm.triton import block_scaled as G
from rtp_fp8.quant import block as B
from rtp_fp8.quant import token_group as T

W = pytest.importorskip("rtp_fp8.gemm.triton.sm90_ws", reason="needs Triton with Gluon")
TOL = 5e-3


def _ops(m, n, k, device, e=None, seed=0, layout="col_tma"):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g).to(torch.bfloat16).to(device)
    w = (torch.randn(*((e,) if e else ()), n, k, generator=g) / k**0.5).to(torch.bfloat16).to(device)
    a, sa = T.per_token_group_quant(x, 128, scale_layout=layout)
    b, sb = B.quantize_weight_blocks(w)
    return a, sa, b, sb


def _plan(a, sa, b, sb, out=None, cap=(9, 0), sms=132, **kw):
    out = torch.empty(a.shape[0], b.shape[-2], dtype=torch.bfloat16) if out is None else out
    return W.plan(a, sa, b, sb, out, packed_a=kw.pop("packed_a", False), sb_div=kw.pop("sb_div", 128),
                  arch=A.Arch(*cap), num_sms=sms, **kw)


def test_plan_accepts_the_sm90_case_and_names_each_refusal():
    a, sa, b, sb = _ops(1536, 1408, 256, "cpu")  # 12 x 11 = 132 tiles
    assert _plan(a, sa, b, sb) is None
    assert "SM90" in _plan(a, sa, b, sb, cap=(10, 0)) and "sm120" in _plan(a, sa, b, sb, cap=(12, 0))
    assert _plan(a, sa, b, sb, sms=176) is None  # 132 tiles fill MIN_FILL of 176 SMs
    assert _plan(a, sa, b, sb, sms=177) == "132 tiles of 128x128 for 177 SMs"  # K=256: too short to split
    assert "FP32 scales" in _plan(a, sa, b, sb, packed_a=True)
    assert "per 128x128 block" in _plan(a, sa, b, sb, sb_div=1)
    _, sa_row, _, _ = _ops(1536, 1408, 256, "cpu", layout="row")
    assert "column-major" in _plan(a, sa_row, b, sb)
    assert "contiguous" in _plan(a, sa, b.t().contiguous().t(), sb)
    out = torch.empty(1536, 2 * 1408, dtype=torch.bfloat16)[:, ::2]
    assert "unit column stride" in _plan(a, sa, b, sb, out=out)
    ge, gsa, gb, gsb = _ops(1536, 1408, 256, "cpu", e=4)
    assert _plan(ge, gsa, gb, gsb, grouped=True, alignment=256) is None
    assert "aligned to 128 rows" in _plan(ge, gsa, gb, gsb, grouped=True, alignment=64)


def test_plan_splits_k_of_small_dense_grids():
    a, sa, b, sb = _ops(256, 4096, 7168, "cpu")  # 2 x 32 tiles of 128x128, 56 K blocks
    assert W.split_k(64, 56, 132) == 2 and _plan(a, sa, b, sb, bn=128) is None
    assert W.split_k(32, 56, 132) == 4  # M=128
    assert W.split_k(56, 16, 132) == 1  # K=2048: 16 K blocks, too few to split
    assert W.split_k(132, 56, 132) == 1 and W.split_k(8, 56, 132, dense=False) == 1
    a, sa, b, sb = _ops(128, 7168, 2048, "cpu")  # 56 tiles of 128x128, no split: 56 < 0.75 x 132
    assert _plan(a, sa, b, sb, bn=128) == "56 tiles of 128x128 for 132 SMs"
    assert _plan(a, sa, b, sb) is None  # tile_n's default: 112 tiles of 128x64
    a, sa, b, sb = _ops(128, 1024, 7168, "cpu")  # 16 tiles of 128x64 x 4 splits
    assert _plan(a, sa, b, sb, bn=64) == "16 tiles of 128x64 x 4 K splits for 132 SMs"
    assert _plan(a, sa, b, sb) is None  # tile_shape's default: 32 tiles of 64x64 x 4 splits


def test_plan_takes_64_row_tiles_for_dense_grids_too_small_in_128_row_ones():
    a, sa, b, sb = _ops(64, 7168, 2048, "cpu")
    assert W.tile_shape(64, 7168, 132) == (64, 64) and _plan(a, sa, b, sb) is None  # 112 tiles of 64x64
    assert _plan(a, sa, b, sb, bm=64, bn=256) == "bn of a 64-row tile must be one of (128, 64), got 256"
    assert _plan(a, sa, b, sb, bm=32, bn=64) == "bm must be 128 or 64, got 32"
    assert _plan(a, sa, b, sb, bm=64, bn=128) == "56 tiles of 64x128 for 132 SMs"
    ge, gsa, gb, gsb = _ops(256, 1024, 256, "cpu", e=4)  # grouped calls keep 128-row tiles
    assert W.tile_shape(256, 1024, 132, dense=False) == (128, 64)
    assert _plan(ge, gsa, gb, gsb, grouped=True, bm=64, bn=64) == "64-row tiles are dense only"


def test_plan_counts_wide_tiles(monkeypatch):
    a, sa, b, sb = _ops(1536, 1408, 256, "cpu")  # 12 x 6 tiles of 128x256
    assert _plan(a, sa, b, sb, bn=W.WIDE_BN) == "72 tiles of 128x256 for 132 SMs"
    assert _plan(a, sa, b, sb, bn=W.WIDE_BN, sms=72) is None
    assert _plan(a, sa, b, sb, bn=192) == "bn must be 64, 128 or 256, got 192"
    assert _plan(a, sa, b, sb, bn=32) == "bn must be 64, 128 or 256, got 32"  # 32 is a 64-row tile's
    monkeypatch.setattr(W, "tile_n", lambda m, n, sms: W.WIDE_BN)  # plan's default counts tile_n's tiles
    assert _plan(a, sa, b, sb) == "72 tiles of 128x256 for 132 SMs"


@pytest.mark.parametrize("m,n,sms,bn", [
    (4096, 2048, 132, 256), (4096, 7168, 132, 256), (4096, 24576, 132, 256),  # whole wide tiles, >= 1 wave
    (4096, 2112, 132, 128), (1100, 2000, 132, 128), (1536, 1408, 132, 128),  # N not whole wide tiles
    (2048, 2048, 132, 128), (2048, 2048, 128, 256), (2049, 2048, 132, 256),  # 16 x 8 = 128 wide tiles
    (256, 4096, 132, 64), (128, 4096, 132, 64), (128, 7168, 132, 64), (64, 7168, 132, 64),  # narrow: <= 1 wave
    (256, 7168, 132, 128), (256, 4096, 127, 128), (257, 4096, 132, 128), (1, 8448, 132, 64), (1, 8512, 132, 128),
])
def test_tile_n_takes_wide_tiles_where_they_fill_the_gpu_and_narrow_ones_where_those_make_one_wave(m, n, sms, bn):
    assert W.tile_n(m, n, sms) == bn


@pytest.mark.parametrize("m,n,sms,shape", [
    (4096, 2112, 132, (128, 128)), (256, 4096, 132, (128, 64)), (128, 7168, 132, (128, 64)),  # 128-row tiles fill
    (128, 4096, 132, (64, 64)), (64, 7168, 132, (64, 64)), (16, 7168, 132, (64, 64)),  # 64 tiles of 128x64 do not
    (64, 4096, 132, (64, 64)), (1, 4096, 132, (64, 64)), (64, 16384, 132, (64, 128)),
    (128, 1024, 132, (64, 64)),  # nothing fills: the narrowest, which splits K
    (257, 1024, 132, (128, 64)), (1536, 1408, 177, (128, 128)),  # past HALF_MAX_ROWS: 128-row tiles
])
def test_tile_shape_takes_64_row_tiles_only_where_128_row_ones_would_not_fill_the_gpu(m, n, sms, shape):
    assert W.tile_shape(m, n, sms) == shape


def test_launch_refuses_64_row_tiles_for_grouped_calls(monkeypatch):
    """A direct launch (no plan) of a contiguous call in 64-row tiles is refused before any descriptor
    is built: the grouped modes walk 128-row tiles."""
    monkeypatch.setattr(W.A, "num_sms", lambda index: 132)
    a, sa, b, sb = _ops(256, 1024, 256, "cpu", e=2)
    ids = torch.zeros(256, dtype=torch.int32)
    out = torch.empty(256, 1024, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="64-row tiles are dense only"):
        W.launch(G.CONTIGUOUS, a, sa, b, sb, ids, torch.zeros(2, dtype=torch.int32), 2, out, bm=W.HALF_BM, bn=64)


@pytest.mark.parametrize("m,bm,rows", [(1, 64, 16), (16, 64, 16), (17, 64, 32), (32, 64, 32), (33, 64, 64),
                                       (64, 64, 64), (100, 64, 64), (16, 128, 128), (1, 128, 128)])
def test_a_box_rows_loads_16_or_32_rows_only_for_a_64_row_tile_over_that_many(m, bm, rows):
    assert W.a_box_rows(m, bm) == rows


@pytest.mark.parametrize("m,bm,a_rows", [(17, 64, 16), (33, 64, 32), (16, 128, 16), (16, 64, 48)])
def test_launch_refuses_an_a_box_shorter_than_the_rows_it_must_load(monkeypatch, m, bm, a_rows):
    """Rows of A past the box would be stored from unwritten shared memory: refused before any
    descriptor is built."""
    monkeypatch.setattr(W.A, "num_sms", lambda index: 132)
    a, sa, b, sb = _ops(m, 1024, 256, "cpu")
    out = torch.empty(m, 1024, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=f"a_rows {a_rows} must be the tile's {bm} rows"):
        W.launch(G.DENSE, a, sa, b, sb, sb, sb, 1, out, bm=bm, bn=64 if bm == 64 else 128, a_rows=a_rows)


@pytest.mark.parametrize("m,n,sms,n0", [(4096, 2112, 132, 2048), (4096, 2048, 132, 0), (4096, 200, 132, 0),
                                        (512, 2112, 132, 0), (512, 2112, 32, 2048), (4096, 4352, 132, 0),
                                        (4096, 4416, 132, 4352)])
def test_column_split_runs_whole_wide_tiles_apart_where_they_make_a_wave(m, n, sms, n0):
    assert W.column_split(m, n, sms) == n0


@pytest.mark.parametrize("m,n,k,first", [(64, 7168, 2048, True), (33, 7168, 2048, True), (32, 7168, 2048, False),
                                         (64, 4096, 7168, False), (65, 7168, 2048, False), (64, 512, 2048, False)])
def test_64_row_tiles_replace_the_swapped_kernel_only_where_they_fill_the_gpu_unsplit(monkeypatch, m, n, k, first):
    """block_scaled.ws_before_swap: 33-64 rows, 64-row tiles, no K split (64, 4096, 7168 would split);
    never on a CPU tensor, under the interpreter or with USE_WS off."""
    monkeypatch.setattr(G.A, "num_sms", lambda index: 132)
    monkeypatch.setattr(G.triton_env, "interpreting", lambda: False)
    cuda = torch.device("cuda", 0)
    assert G.ws_before_swap(m, n, k, cuda) is first
    assert G.ws_before_swap(m, n, k, torch.device("cpu")) is False
    monkeypatch.setattr(G, "USE_WS", False)
    assert G.ws_before_swap(m, n, k, cuda) is False


def test_64_row_grids_that_split_replace_the_swapped_kernel_only_with_ws_split_before_swap(monkeypatch):
    """WS_SPLIT_BEFORE_SWAP (off as shipped) lets 64-row grids that split K take sm90_ws first:
    (64, 4096, 7168), 64 tiles of 64x64 in 2 splits; 128-row grids and too few rows never."""
    monkeypatch.setattr(G.A, "num_sms", lambda index: 132)
    monkeypatch.setattr(G.triton_env, "interpreting", lambda: False)
    cuda = torch.device("cuda", 0)
    assert W.grid(64, 4096, 7168, 132) == (W.HALF_BM, 64, 64, 2)
    assert G.WS_SPLIT_BEFORE_SWAP is False and not G.ws_before_swap(64, 4096, 7168, cuda)
    monkeypatch.setattr(G, "WS_SPLIT_BEFORE_SWAP", True)
    assert G.ws_before_swap(64, 4096, 7168, cuda) and G.ws_before_swap(64, 7168, 2048, cuda)
    assert not G.ws_before_swap(32, 4096, 7168, cuda) and not G.ws_before_swap(65, 4096, 7168, cuda)


def test_plan_refuses_the_older_warp_specialize_api(monkeypatch):
    a, sa, b, sb = _ops(1536, 1408, 256, "cpu")
    monkeypatch.setattr(W, "LIST_WARP_SPECIALIZE", False)
    assert "Triton >= 3.6" in _plan(a, sa, b, sb)


def test_dispatch_names_why_it_keeps_the_triton_kernel(monkeypatch):
    a, sa, b, sb = _ops(1536, 1408, 256, "cpu")
    out = torch.empty(1536, 1408, dtype=torch.bfloat16)
    assert G.ws_refusal(G.DENSE, a, sa, b, sb, out) in ("the Triton interpreter runs the Triton kernels",
                                                        "not a CUDA tensor")
    monkeypatch.setattr(G, "USE_WS", False)
    assert G.ws_refusal(G.DENSE, a, sa, b, sb, out) == "USE_WS is off"


def test_plan_refuses_cpu_tensors():
    a, sa, b, sb = _ops(1536, 1408, 256, "cpu")
    out = torch.empty(1536, 1408, dtype=torch.bfloat16)
    assert W.plan(a, sa, b, sb, out, packed_a=False, sb_div=128) == "not a CUDA tensor"


def _spy(monkeypatch):
    """-> (the modes block_scaled launches sm90_ws with, the tile width each launch took: launch
    looks its ring depth up by tile, _ring(mode, bm, bn, staged); a 64-row tile's as (64, bn))."""
    calls, widths = [], []
    launch, ring = W.launch, W._ring

    def spy(*args, **kwargs):
        calls.append(args[0])
        return launch(*args, **kwargs)

    def width(mode, bm, bn, staged):
        widths.append(bn if bm == W.BM else (bm, bn))
        return ring(mode, bm, bn, staged)

    monkeypatch.setattr(G.sm90_ws, "launch", spy)
    monkeypatch.setattr(W, "_ring", width)
    monkeypatch.setattr(G, "USE_CLUSTER", False)  # 128x256 dense tiles stay on sm90_ws (test_cuda_sm90 has them)
    return calls, widths


def _triton(monkeypatch, fn, *args, **kwargs):
    """fn with the Triton kernel: sm90_ws and the CUDA narrow kernel (16-128 dense rows) off."""
    with monkeypatch.context() as mp:
        mp.setattr(G, "USE_WS", False)
        mp.setattr(G, "USE_NARROW", False)
        return fn(*args, **kwargs)


@pytest.mark.gpu_sm90
@pytest.mark.parametrize("m,n,k,bn", [(1100, 2000, 1664, 128), (2048, 2112, 640, 128), (1536, 1408, 128, 128),
                                      (4096, 2048, 640, 256),  # 128x256 tiles (tile_n)
                                      (256, 4100, 1664, 64)])  # 2 x 65 tiles of 128x64, the last 4 columns wide
@pytest.mark.parametrize("epilogue", ["tma", "pointer"])
def test_dense_is_bit_identical_to_triton(monkeypatch, m, n, k, bn, epilogue):
    a, sa, b, sb = _ops(m, n, k, "cuda", seed=m + k)
    pad = 8 if epilogue == "tma" else 3  # an odd row stride rules the TMA store out
    buf = torch.full((m, n + pad), float("nan"), dtype=torch.bfloat16, device="cuda")
    out = buf[:, :n]
    calls, widths = _spy(monkeypatch)
    G.fp8_gemm_nt(a, sa, b, sb, out=out)
    assert calls == [G.DENSE] and widths == [bn]  # H200: 132 SMs
    ref = _triton(monkeypatch, G.fp8_gemm_nt, a, sa, b, sb)
    assert torch.equal(out, ref)
    assert bool(torch.isnan(buf[:, n:]).all())  # guard columns untouched
    assert rel_l2(out.double().cpu(), GR.gemm_nt_ref(a, sa, b, sb)) <= TOL


def _grouped_case(n, k, seed, reps=1):
    """(ids, a, sa, b, sb, poisoned out, zero counters), E=4, reps times: expert 0: 512 rows; 128
    padding rows; expert 2: 384 rows; 128 rows of id 9; a ragged expert 3 segment of 200 rows padded
    to 256; expert 1 empty. The counters must end at reps * [184 padding rows, 128 invalid]."""
    parts = [(0, 512), (-1, 128), (2, 384), (9, 128), (3, 200), (-1, 56)] * reps
    ids = torch.cat([torch.full((c,), e, dtype=torch.int32) for e, c in parts]).cuda()
    a, sa, b, sb = _ops(ids.numel(), n, k, "cuda", e=4, seed=seed)
    out = torch.full((ids.numel(), n), float("nan"), dtype=torch.bfloat16, device="cuda")
    return ids, a, sa, b, sb, out, torch.zeros(2, dtype=torch.int32, device="cuda")


@pytest.mark.gpu_sm90
@pytest.mark.parametrize("k,reps", [(512, 1), (1152, 1), (1152, 2)])  # reps=2: 22 x 8 tiles of 128x256
def test_grouped_contiguous_is_bit_identical_to_triton(monkeypatch, k, reps):
    ids, a, sa, b, sb, out, cnt = _grouped_case(2048, k, seed=k, reps=reps)
    calls, widths = _spy(monkeypatch)
    G.m_grouped_fp8_gemm_nt_contiguous(a, sa, b, sb, ids, out=out, counters=cnt)
    assert calls == [G.CONTIGUOUS] and widths == [256 if reps == 2 else 128]
    cnt_ref = torch.zeros(2, dtype=torch.int32, device="cuda")
    ref = _triton(monkeypatch, G.m_grouped_fp8_gemm_nt_contiguous, a, sa, b, sb, ids, counters=cnt_ref)
    assert torch.equal(out, ref) and torch.equal(cnt, cnt_ref)
    assert cnt.tolist() == [184 * reps, 128 * reps]
    assert bool((out[(ids < 0) | (ids >= 4)] == 0).all())
    oracle = GR.grouped_contiguous_ref(a, sa, b, sb, ids)
    valid = ((ids >= 0) & (ids < 4)).cpu()
    assert rel_l2(out.cpu()[valid].double(), oracle.cpu()[valid].double()) <= TOL


@pytest.mark.gpu_sm90
@pytest.mark.parametrize("m,n,k", [(1100, 2000, 1664), (4096, 2112, 640), (1536, 1408, 128)])
@pytest.mark.parametrize("epilogue", ["tma", "pointer"])
def test_wide_tiles_are_bit_identical_to_triton(monkeypatch, m, n, k, epilogue):
    """The 128x256 experiment (sm90_ws.WIDE_BN), launched directly: N=2000 ends in a partial second
    half, N=2112 in a tile whose second half lies past N (not computed from real data, not
    stored), N=1408 in whole halves; guard columns stay poisoned."""
    a, sa, b, sb = _ops(m, n, k, "cuda", seed=m + k + 1)
    pad = 8 if epilogue == "tma" else 3
    buf = torch.full((m, n + pad), float("nan"), dtype=torch.bfloat16, device="cuda")
    out = buf[:, :n]
    W.launch(G.DENSE, a, sa, b, sb, sb, sb, 1, out, bn=W.WIDE_BN)
    ref = _triton(monkeypatch, G.fp8_gemm_nt, a, sa, b, sb)
    assert torch.equal(out, ref)
    assert bool(torch.isnan(buf[:, n:]).all())


def _assert_as_the_triton_split(monkeypatch, splits, a, sa, b, sb, out, buf):
    """out equals the Triton kernel's (swapped kernel off) split into `splits` K runs (1: unsplit) bit
    for bit, buf's guard columns past out stay poisoned, and out is within TOL of the oracle."""
    with monkeypatch.context() as mp:
        mp.setattr(G, "FORCE_SPLIT_K", splits)
        mp.setattr(G, "USE_SWAP", False)
        ref = _triton(monkeypatch, G.fp8_gemm_nt, a, sa, b, sb)
    assert torch.equal(out, ref)
    assert bool(torch.isnan(buf[:, out.shape[1]:]).all())
    assert rel_l2(out.double().cpu(), GR.gemm_nt_ref(a, sa, b, sb)) <= TOL


@pytest.mark.gpu_sm90
@pytest.mark.parametrize("m,n,k,bn,via", [(128, 4096, 1664, 64, "dispatch"), (100, 4100, 1664, 64, "dispatch"),
                                         (64, 7168, 2048, 64, "dispatch"), (16, 8192, 1664, 64, "dispatch"),
                                         (100, 2000, 1664, 64, "launch"), (100, 2000, 1664, 128, "launch"),
                                         (1, 1000, 384, 64, "launch"), (30, 1000, 1664, 128, "launch")])
@pytest.mark.parametrize("epilogue", ["tma", "pointer"])
def test_64_row_tiles_are_bit_identical_to_triton(monkeypatch, m, n, k, bn, via, epilogue):
    """64-row tiles (sm90_ws.HALF_BM; one consumer warpgroup runs each), unsplit, through
    the dispatch (M=64 before the swapped kernel, ws_before_swap; M=16 with it off) or a direct
    launch, bit-identical to the Triton kernel unsplit: ragged M (100: a second tile of 36 rows; 1,
    16 and 30 rows, whose tiles load a 16- or 32-row box of A, sm90_ws.a_box_rows), N ending in a
    partial tile (4100 in 64-wide tiles: 4 columns in the last; 2000 and 1000), an odd number of K
    steps; guard columns stay poisoned; within TOL of the float64 oracle."""
    a, sa, b, sb = _ops(m, n, k, "cuda", seed=m + n + k)
    pad = 8 if epilogue == "tma" else 3
    buf = torch.full((m, n + pad), float("nan"), dtype=torch.bfloat16, device="cuda")
    out = buf[:, :n]
    if via == "dispatch":
        monkeypatch.setattr(G, "USE_NARROW", False)  # it takes 1-128 rows first
        if m < G.SWAP_WS_MIN_ROWS:
            monkeypatch.setattr(G, "USE_SWAP", False)
        assert G.ws_splits(G.DENSE, a, b) == 1
        calls, widths = _spy(monkeypatch)
        G.fp8_gemm_nt(a, sa, b, sb, out=out)
        assert calls == [G.DENSE] and widths == [(W.HALF_BM, bn)]
    else:
        W.launch(G.DENSE, a, sa, b, sb, sb, sb, 1, out, bn=bn, bm=W.HALF_BM, epi_tma=epilogue == "tma")
    _assert_as_the_triton_split(monkeypatch, 1, a, sa, b, sb, out, buf)


@pytest.mark.gpu_sm90
@pytest.mark.parametrize("m,n,k,splits,bn", [(128, 1024, 7168, None, (64, 64)), (100, 1100, 1664, 3, 128),
                                             (300, 2048, 512, 4, 128), (200, 2080, 1664, 3, 64),
                                             (100, 1100, 1664, 3, (64, 128)), (72, 2080, 1664, 4, (64, 64)),
                                             (20, 1100, 1664, 3, (64, 64))])
def test_split_k_is_bit_identical_to_the_triton_split(monkeypatch, m, n, k, splits, bn):
    """Dense grids smaller than the GPU split K in sm90_ws (through the dispatch: M=128, N=1024 in 32
    tiles of 64x64, 4 splits; or forced by a direct launch, 128-row tiles 128 and 64 wide, 64-row
    tiles 128 and 64 wide, 20 rows of a 32-row A box): the partials equal the Triton kernel's split
    into the same runs of K blocks, so the reduced output is bit-identical; a 4-way split of 4 K
    blocks leaves no split empty-handed."""
    a, sa, b, sb = _ops(m, n, k, "cuda", seed=m + n)
    buf = torch.full((m, n + 3), float("nan"), dtype=torch.bfloat16, device="cuda")
    out = buf[:, :n]
    bm, bn = bn if isinstance(bn, tuple) else (W.BM, bn)
    if splits is None:
        splits = G.ws_splits(G.DENSE, a, b)
        assert splits == 4
        calls, widths = _spy(monkeypatch)
        G.fp8_gemm_nt(a, sa, b, sb, out=out)
        assert calls == [G.DENSE] and widths == [(bm, bn)]
    else:
        parts = torch.full((splits, m, n), float("nan"), dtype=torch.float32, device="cuda")
        W.launch(G.DENSE, a, sa, b, sb, sb, sb, 1, parts, splits=splits, bn=bn, bm=bm)
        G._reduce_splits(parts, out)
    _assert_as_the_triton_split(monkeypatch, splits, a, sa, b, sb, out, buf)


@pytest.mark.gpu_sm90
@pytest.mark.parametrize("m,n,k", [(64, 4096, 7168), (40, 4100, 7168)])
def test_64_row_split_grids_before_the_swapped_kernel_are_bit_identical_to_the_triton_split(monkeypatch, m, n, k):
    """WS_SPLIT_BEFORE_SWAP with split grids staging (SB_STAGE_SPLIT): the dispatch runs sm90_ws's 64x64
    tiles in K splits instead of the swapped kernel, staged, bit-identical to the Triton kernel split
    into the same K runs; ragged M (40 rows) and a last tile 4 columns wide. (A third case, (48, 2000,
    5120), was dropped after the H100: 32 tiles x 3 splits fill too few SMs, so plan() refused it and
    the dispatch fell back to the swapped kernel, as it should.)"""
    monkeypatch.setattr(G, "WS_SPLIT_BEFORE_SWAP", True)
    monkeypatch.setattr(G, "USE_NARROW", False)  # it takes 1-128 rows first
    monkeypatch.setattr(W, "SB_STAGE_SPLIT", True)
    a, sa, b, sb = _ops(m, n, k, "cuda", seed=m + n + k)
    buf = torch.full((m, n + 3), float("nan"), dtype=torch.bfloat16, device="cuda")
    out = buf[:, :n]
    splits = G.ws_splits(G.DENSE, a, b)
    assert splits > 1 and G.ws_before_swap(m, n, k, a.device)
    staged = []
    descriptors = W._descriptors
    monkeypatch.setattr(W, "_descriptors", lambda *args: staged.append(args[-1]) or descriptors(*args))
    calls, widths = _spy(monkeypatch)
    G.fp8_gemm_nt(a, sa, b, sb, out=out)
    assert calls == [G.DENSE] and widths == [(W.HALF_BM, 64)] and staged[-1] > 0
    _assert_as_the_triton_split(monkeypatch, splits, a, sa, b, sb, out, buf)


@pytest.mark.gpu_sm90
@pytest.mark.parametrize("epilogue", ["tma", "pointer"])
def test_column_split_is_the_dispatch_on_each_column_range(monkeypatch, epilogue):
    """sm90_ws.column_split on a 32-SM budget (num_sms patched): N=1088 runs its first 1024 columns
    in 4 x 4 tiles of 128x256 (a wave), bit-identical to the Triton kernel there, and its last 64
    through the dispatch on their own, bit-identical to that call; guard columns stay poisoned."""
    monkeypatch.setattr(G.A, "num_sms", lambda index: 16)
    m, n, k = 512, 1088, 1664
    a, sa, b, sb = _ops(m, n, k, "cuda", seed=7)
    pad = 8 if epilogue == "tma" else 3
    buf = torch.full((m, n + pad), float("nan"), dtype=torch.bfloat16, device="cuda")
    out = buf[:, :n]
    calls, widths = _spy(monkeypatch)
    G.fp8_gemm_nt(a, sa, b, sb, out=out)
    assert calls[0] == G.DENSE and widths[0] == W.WIDE_BN
    with monkeypatch.context() as mp:
        mp.setattr(G, "FORCE_SPLIT_K", 1)
        ref = _triton(monkeypatch, G.fp8_gemm_nt, a, sa, b[:1024], sb[:8])
    assert torch.equal(out[:, :1024], ref)
    assert torch.equal(out[:, 1024:], G.fp8_gemm_nt(a, sa, b[1024:], sb[8:]))
    assert bool(torch.isnan(buf[:, n:]).all())
    assert rel_l2(out.double().cpu(), GR.gemm_nt_ref(a, sa, b, sb)) <= TOL


@pytest.mark.gpu_sm90
@pytest.mark.parametrize("n,bn", [(2048, 256), (2112, 256), (2048, 64), (2080, 64)])
def test_wide_and_narrow_grouped_tiles_are_bit_identical_to_triton(monkeypatch, n, bn):
    """Wide and narrow contiguous tiles, launched directly: padding rows, an out-of-range id and empty
    experts, counters (counted once per row tile, not per narrow tile); N=2112 (wide) and N=2080
    (narrow) put the next expert's B rows in the last tile, which must not reach the output."""
    ids, a, sa, b, sb, out, cnt = _grouped_case(n, 1152, seed=n + bn)
    W.launch(G.CONTIGUOUS, a, sa, b, sb, ids, cnt, 4, out, bn=bn)
    cnt_ref = torch.zeros(2, dtype=torch.int32, device="cuda")
    ref = _triton(monkeypatch, G.m_grouped_fp8_gemm_nt_contiguous, a, sa, b, sb, ids, counters=cnt_ref)
    assert torch.equal(out, ref) and torch.equal(cnt, cnt_ref)
    assert cnt.tolist() == [184, 128]


@pytest.mark.parametrize("m,n,k,grid", [(128, 4096, 7168, (64, 64, 128, 1)), (256, 4096, 7168, (128, 64, 128, 1)),
                                        (128, 1024, 7168, (64, 64, 32, 4)), (4096, 7168, 2048, (128, 256, 896, 1)),
                                        (64, 7168, 2048, (64, 64, 112, 1)), (1, 4096, 7168, (64, 64, 64, 2))])
def test_dispatch_splits_as_the_plan_counts(monkeypatch, m, n, k, grid):
    """block_scaled.ws_splits and plan() take one grid (sm90_ws.grid): tile_shape's tile, its splits."""
    monkeypatch.setattr(G.A, "num_sms", lambda index: 132)
    a = torch.empty(m, k, dtype=torch.float8_e4m3fn)
    b = torch.empty(n, k, dtype=torch.float8_e4m3fn)
    assert W.grid(m, n, k, 132) == grid
    assert G.ws_splits(G.DENSE, a, b) == grid[3]


@pytest.mark.gpu_sm90
@pytest.mark.parametrize("m,n,k,bn,bm", [(128, 4096, 1664, 128, 64), (64, 7168, 2048, 64, 64),
                                         (256, 2000, 1664, 128, 128), (4096, 2048, 640, 256, 128),
                                         (1100, 2000, 1664, 256, 128)])
def test_sb_prefetch_is_bit_identical(monkeypatch, m, n, k, bn, bm):
    """The B-scale prefetch only asks the L2 for lines the consumers read anyway: every tile shape (64-row,
    128-row, wide with a second half past N) gives the Triton kernel's output bit for bit; guard
    columns stay poisoned."""
    a, sa, b, sb = _ops(m, n, k, "cuda", seed=m + n + k)
    buf = torch.full((m, n + 3), float("nan"), dtype=torch.bfloat16, device="cuda")
    out = buf[:, :n]
    W.launch(G.DENSE, a, sa, b, sb, sb, sb, 1, out, bn=bn, bm=bm, sb_prefetch=True, sb_stage=False)
    assert torch.equal(out, _triton(monkeypatch, G.fp8_gemm_nt, a, sa, b, sb))
    assert bool(torch.isnan(buf[:, n:]).all())


@pytest.mark.gpu_sm90
def test_sb_prefetch_grouped_and_masked_are_bit_identical(monkeypatch):
    """The producer's prefetch in the contiguous and masked walks (per-expert B-scale rows)."""
    monkeypatch.setattr(W, "SB_PREFETCH_ROWS", frozenset({W.HALF_BM, W.BM}))
    e, mmax, n, k = 5, 256, 2112, 640
    a, sa, b, sb = masked_operands(e, mmax, n, k, "fp32", "cuda", seed=7)
    masked = torch.tensor([0, 1, 200, mmax, 129], dtype=torch.int32, device="cuda")
    got = G.m_grouped_fp8_gemm_nt_masked(a, sa, b, sb, masked, expected_m=256)
    ref = _triton(monkeypatch, G.m_grouped_fp8_gemm_nt_masked, a, sa, b, sb, masked, expected_m=256)
    for i, mm in enumerate(masked.tolist()):
        assert torch.equal(got[i, :mm], ref[i, :mm])
    ids = torch.arange(4, dtype=torch.int32, device="cuda").repeat_interleave(256)
    a2, sa2, b2, sb2 = _ops(1024, 2048, 640, "cuda", e=4, seed=11)
    got = G.m_grouped_fp8_gemm_nt_contiguous(a2, sa2, b2, sb2, ids)
    assert torch.equal(got, _triton(monkeypatch, G.m_grouped_fp8_gemm_nt_contiguous, a2, sa2, b2, sb2, ids))


def test_sb_stage_k_boxes_a_tiles_scale_run_or_refuses():
    """sb_stage_k: a tile's K blocks (per split) and the 3 an aligned start may take in, rounded up to a
    power of two, at least 32 (128 bytes, so that both buffers are TMA destinations); 0 for wide
    tiles, non-contiguous scales or a box over SB_STAGE_MAX."""
    sb = torch.empty(32, 56)  # N=4096, K=7168
    assert W.sb_stage_k(sb, 7168, 64) == 64 and W.sb_stage_k(sb, 7168, 128) == 64
    assert W.sb_stage_k(sb, 7168, 64, splits=4) == 32  # 14 K blocks a split
    assert W.sb_stage_k(sb, 512, 128) == 32 and W.sb_stage_k(sb, 16384, 128, splits=2) == 128
    assert W.sb_stage_k(sb, 128 * 61, 128) == 64 and W.sb_stage_k(sb, 128 * 62, 128) == 128
    assert W.sb_stage_k(sb, 7168, W.WIDE_BN) == 0
    assert W.sb_stage_k(torch.empty(56, 32).t(), 7168, 128) == 0
    assert W.sb_stage_k(torch.empty(2, 254), 254 * 128, 128) == 0
    assert W.sb_stage_k(torch.empty(2, 253), 253 * 128, 128) == 256


def test_launch_stages_the_timed_dense_tiles_unsplit_in_their_ring(monkeypatch):
    """The shipped default (SB_STAGE_TILES): dense 64x64 and 128x64 tiles stage in an 8-slot ring when
    unsplit and sb_stage_k gives a box; split, contiguous, masked, 128x128 and 64x128 tiles keep their
    usual rings without staging."""
    assert W.sb_stage_default(0, W.HALF_BM, 64, 64) and W._ring(0, W.HALF_BM, 64, True) == 8
    assert W.sb_stage_default(0, W.BM, W.NARROW_BN, 32) and W._ring(0, W.BM, W.NARROW_BN, True) == 8
    assert not W.sb_stage_default(0, W.HALF_BM, 64, 64, splits=4)
    assert not W.sb_stage_default(0, W.HALF_BM, 64, 0)  # sb_stage_k refused (e.g. unaligned scales)
    for key in [(1, W.BM, W.NARROW_BN), (2, W.BM, W.NARROW_BN), (0, W.BM, W.BN), (0, W.HALF_BM, 128)]:
        assert not W.sb_stage_default(*key, 64)
    assert W._ring(0, W.HALF_BM, 64, False) == W.STAGES_HALF[64] and W._ring(0, W.BM, W.BN, True) == W.STAGES
    monkeypatch.setattr(W, "SB_STAGE_SPLIT", True)
    assert W.sb_stage_default(0, W.HALF_BM, 64, 64, splits=4)


@pytest.mark.gpu_sm90
@pytest.mark.parametrize("m,n,k,bn,bm", [(128, 4096, 1664, 128, 64), (64, 7168, 2048, 64, 64),
                                         (64, 2000, 7168, 64, 64), (256, 2000, 1664, 128, 128),
                                         (300, 2000, 896, 64, 128)])
def test_sb_stage_is_bit_identical(m, n, k, bn, bm):
    """B-scale rows staged in shared memory: the same scales in the same products, so every tile shape
    (64-row, 128-row, narrow; K runs of 13, 16, 56 and 7 blocks, whose boxes read past the row and, in
    the last row, past the tensor; with 13 and 7, odd rows start off a 16-byte boundary, so the box
    starts before them) gives the kernel's output without staging bit for bit (and that is
    the Triton kernel's, test_sb_prefetch_is_bit_identical and the dispatch tests); guard columns stay
    poisoned, and the result is within TOL of the float64 oracle."""
    a, sa, b, sb = _ops(m, n, k, "cuda", seed=m + n + k)
    outs = []
    for stage in (False, True):
        buf = torch.full((m, n + 3), float("nan"), dtype=torch.bfloat16, device="cuda")
        W.launch(G.DENSE, a, sa, b, sb, sb, sb, 1, buf[:, :n], bn=bn, bm=bm, sb_prefetch=False, sb_stage=stage)
        assert bool(torch.isnan(buf[:, n:]).all())
        outs.append(buf[:, :n])
    assert torch.equal(outs[1], outs[0])
    assert rel_l2(outs[1].double().cpu(), GR.gemm_nt_ref(a, sa, b, sb)) <= TOL
    with pytest.raises(ValueError, match="sb_stage needs a tile of at most 128 columns"):
        W.launch(G.DENSE, a, sa, b, sb, sb, sb, 1, outs[0], bn=W.WIDE_BN, bm=128, sb_stage=True)


@pytest.mark.gpu_sm90
def test_sb_stage_through_the_dispatch_is_bit_identical(monkeypatch):
    """Staging as the dispatch takes it (SB_STAGE_TILES: the shipped dense tiles in their 8-slot ring; here
    also every other tile of at most 128 columns, at its usual ring, and K-split grids, SB_STAGE_SPLIT):
    K splits (each split's run from its first K block), the contiguous walk (per-expert rows, counters)
    and the masked walk. Each call must stage (launch's sb_k, recorded) and equal the dispatch without
    staging bit for bit."""
    staged = []

    def unstaged(fn, *args, **kwargs):
        with monkeypatch.context() as mp:
            mp.setattr(W, "SB_STAGE_TILES", {})
            return fn(*args, **kwargs)

    every = {(mode, bm, bn): None for mode in (0, 1, 2) for bm in (W.HALF_BM, W.BM) for bn in (64, 128)}
    monkeypatch.setattr(W, "SB_STAGE_TILES", every | W.SB_STAGE_TILES)
    monkeypatch.setattr(W, "SB_STAGE_SPLIT", True)
    monkeypatch.setattr(G, "USE_NARROW", False)  # these calls are sm90_ws's whatever the narrow rule takes
    descriptors = W._descriptors
    monkeypatch.setattr(W, "_descriptors", lambda *args: staged.append(args[-1]) or descriptors(*args))
    for m, n, k in [(128, 1024, 7168), (128, 7168, 2048), (200, 4096, 3200)]:
        a, sa, b, sb = _ops(m, n, k, "cuda", seed=m + n)
        staged.clear()
        got = G.fp8_gemm_nt(a, sa, b, sb)
        assert staged and staged[-1] > 0, (m, n, k)
        assert torch.equal(got, unstaged(G.fp8_gemm_nt, a, sa, b, sb)), (m, n, k)
        assert rel_l2(got.double().cpu(), GR.gemm_nt_ref(a, sa, b, sb)) <= TOL
    e, mmax, n, k = 5, 256, 2112, 640
    a, sa, b, sb = masked_operands(e, mmax, n, k, "fp32", "cuda", seed=7)
    masked = torch.tensor([0, 1, 200, mmax, 129], dtype=torch.int32, device="cuda")
    staged.clear()
    got = G.m_grouped_fp8_gemm_nt_masked(a, sa, b, sb, masked, expected_m=256)
    assert staged and staged[-1] > 0
    ref = unstaged(G.m_grouped_fp8_gemm_nt_masked, a, sa, b, sb, masked, expected_m=256)
    for i, mm in enumerate(masked.tolist()):
        assert torch.equal(got[i, :mm], ref[i, :mm])
    ids = torch.arange(4, dtype=torch.int32, device="cuda").repeat_interleave(256)
    ids[300:310] = -1
    a2, sa2, b2, sb2 = _ops(1024, 2048, 640, "cuda", e=4, seed=11)
    cnt = torch.zeros(2, dtype=torch.int32, device="cuda")
    cnt_ref = torch.zeros(2, dtype=torch.int32, device="cuda")
    staged.clear()
    got = G.m_grouped_fp8_gemm_nt_contiguous(a2, sa2, b2, sb2, ids, counters=cnt)
    assert staged and staged[-1] > 0
    ref = unstaged(G.m_grouped_fp8_gemm_nt_contiguous, a2, sa2, b2, sb2, ids, counters=cnt_ref)
    assert torch.equal(got, ref) and torch.equal(cnt, cnt_ref)


def test_launch_refuses_a_pdl_mode_it_does_not_have():
    a, sa, b, sb = _ops(128, 1024, 256, "cpu")
    out = torch.empty(128, 1024, dtype=torch.bfloat16)
    for pdl in (-1, 3, "2"):
        with pytest.raises(ValueError, match="pdl must be 0"):
            W.launch(G.DENSE, a, sa, b, sb, sb, sb, 1, out, pdl=pdl)


def test_ws_pdl_follows_use_pdl(monkeypatch):
    assert G.ws_pdl() == G.WS_PDL == 2
    monkeypatch.setattr(G, "USE_PDL", False)
    assert G.ws_pdl() == 0


def _pdl_case(case, device="cuda"):
    """(buf, out, call): buf poisoned (NaN), out the view of it the kernel writes (buf itself, or all but its guard
    columns past N), call(out, pdl) the case's sm90_ws.launch."""
    if case == "masked":
        e, cap, n, k = 4, 256, 2112, 640
        a, sa, b, sb = masked_operands(e, cap, n, k, "fp32", device, seed=5)
        mm = torch.tensor([256, 0, 129, 1], dtype=torch.int32, device=device)
        out = torch.full((e, cap, n), float("nan"), dtype=torch.bfloat16, device=device)
        return out, out, lambda o, pdl: W.launch(G.MASKED, a, sa, b, sb, mm, mm, e, o, masked_rows=256, pdl=pdl)
    if case == "contiguous":
        ids, a, sa, b, sb, out, cnt = _grouped_case(2048, 1152, seed=3)

        def call(o, pdl):
            cnt.zero_()
            W.launch(G.CONTIGUOUS, a, sa, b, sb, ids, cnt, 4, o, bn=128, pdl=pdl)
        return out, out, call
    m, n, k, kw = {"128x64": (128, 7168, 2048, {"bn": 64}), "64x64": (64, 7168, 2048, {"bm": 64, "bn": 64}),
                   "split": (128, 1100, 1664, {"bm": 64, "bn": 64, "splits": 3})}[case]
    a, sa, b, sb = _ops(m, n, k, device, seed=m + n)
    if "splits" in kw:
        out = torch.full((kw["splits"], m, n), float("nan"), dtype=torch.float32, device=device)
        return out, out, lambda o, pdl: W.launch(G.DENSE, a, sa, b, sb, sb, sb, 1, o, pdl=pdl, **kw)
    buf = torch.full((m, n + 8), float("nan"), dtype=torch.bfloat16, device=device)
    return buf, buf[:, :n], lambda o, pdl: W.launch(G.DENSE, a, sa, b, sb, sb, sb, 1, o, pdl=pdl, **kw)


@pytest.mark.gpu_sm90
@pytest.mark.parametrize("case", ["128x64", "64x64", "split", "masked", "contiguous"])
def test_pdl_launches_give_the_plain_launchs_bits_and_replay_in_graphs(case):
    """sm90_ws launched as a programmatic dependent (pdl 1: it waits; 2: its producer also lets the next
    dependent launch after its last load) writes the plain launch's bits (guard columns and, masked, the
    rows past masked_m as they were), also captured in a CUDA graph (as such) and replayed."""
    buf, out, call = _pdl_case(case)
    call(out, 0)
    plain = buf.clone()
    for pdl in (1, 2):
        buf.fill_(float("nan"))
        call(out, pdl)
        torch.cuda.synchronize()
        assert torch.equal(buf.nan_to_num(7.0), plain.nan_to_num(7.0)), f"{case} pdl {pdl}"
        buf.fill_(float("nan"))
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            call(out, pdl)
        buf.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(buf.nan_to_num(7.0), plain.nan_to_num(7.0)), f"{case} pdl {pdl}, graph replay"


@pytest.mark.gpu_sm90
def test_dispatch_launches_sm90_ws_with_ws_pdl(monkeypatch):
    """Every sm90_ws launch of the dispatch takes ws_pdl(): WS_PDL, or 0 with USE_PDL off; same bits."""
    a, sa, b, sb = _ops(128, 7168, 2048, "cuda", seed=9)  # 128x64 tiles (the narrow kernel's 224 would not fit)
    pdls = spy_ws_pdls(monkeypatch)
    got = G.fp8_gemm_nt(a, sa, b, sb)
    monkeypatch.setattr(G, "USE_PDL", False)
    assert torch.equal(G.fp8_gemm_nt(a, sa, b, sb), got)
    assert pdls == [G.WS_PDL, 0]
