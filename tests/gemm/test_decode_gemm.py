"""The decode-path GEMM kernels (issue #28): the swapped kernel (block_scaled._fp8_gemm_swap_kernel:
dense M <= SWAP_MAX_ROWS and masked calls expecting that few rows per expert, K split on small
dense grids), the persistent TMA kernel's masked mode (_fp8_gemm_tma_kernel, MODE 2: masked calls
above SWAP_MAX_ROWS where sm90_ws does not take them; bit-identical to the pointer kernel) and the
SM90 warp-specialized kernel's masked mode (sm90_ws, MODE 2).

Every output is poisoned with NaN first and carries guard columns; inputs are fresh random
numbers. Against the float64 oracle: relative L2 <= 5e-3 (FP32 accumulation of exact FP8
products, BF16 rounding). Against the kernels they replace (USE_SWAP / USE_WS off): the swapped
kernel computes each 128-K step's product as B @ A^T instead of A @ B^T and promotes it with the
same scale_a x scale_b, so the two agree to the last BF16 bit or one flip of it (asserted as
|diff| <= 2^-7 |ref|); sm90_ws's masked mode runs the same tiles and promotion order as the
Triton kernel and must be bit-identical. Rows past masked_m are unspecified by the contract;
these kernels leave them untouched (the swapped kernel and pointer stores) or write at most the
rest of a 64-row half (the TMA store), which is asserted.
"""

import pytest
import torch

from helpers import DEVICES, assert_bf16_last_bit, masked_operands, quantized_weights, rel_l2
from rtp_fp8 import arch as A
from rtp_fp8.gemm import reference as GR
from rtp_fp8.gemm.triton import block_scaled as G
from rtp_fp8.quant import token_group as T

TOL = 5e-3
GUARD = 3  # columns past N in every output buffer, which must stay NaN


def _weights(e, n, k, fmt, device, g):
    w = (torch.randn(*((e,) if e else ()), n, k, generator=g) / k**0.5).to(torch.bfloat16).to(device)
    return quantized_weights(w, fmt)


def _dense(m, n, k, fmt, device, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g).to(torch.bfloat16).to(device)
    a, sa = T.per_token_group_quant(x, 128, scale_layout="ue8m0" if fmt == "ue8m0" else "col_tma")
    return (a, sa, *_weights(None, n, k, fmt, device, g))



def _out(shape, device, guard=GUARD):
    """(poisoned buffer, out = its first N columns); guard 8 keeps rows 16-byte aligned (TMA store)."""
    buf = torch.full((*shape[:-1], shape[-1] + guard), float("nan"), dtype=torch.bfloat16, device=device)
    return buf, buf[..., :shape[-1]]


def _spy(monkeypatch, name):
    calls = []
    fn = getattr(G, name)

    def spy(*args, **kwargs):
        ran = fn(*args, **kwargs)
        calls.append(ran)
        return ran

    monkeypatch.setattr(G, name, spy)
    return calls


def test_swap_config():
    # one wave (at most a program per SM): SWAP_STAGES slots; more programs, masked grids included:
    # SWAP_STAGES_WAVES, so that two fit an SM
    st, sw = G.SWAP_STAGES, G.SWAP_STAGES_WAVES
    assert G.swap_config(1, 4096, 7168, 1, 132) == (128, 16, st, 4)  # 32 programs -> 4 K splits
    assert G.swap_config(64, 7168, 2048, 64, 132) == (64, 64, st, 1)  # 56 programs -> 112 of 64 rows
    assert G.swap_config(33, 4096, 512, 33, 132) == (128, 64, st, 1)  # 32 programs, 4 K blocks: no split
    assert G.swap_config(16, 32768, 7168, 16, 132) == (128, 16, sw, 1)  # 256 programs fill the GPU
    assert G.swap_config(16, 4096, 7168, None, 132) == (128, 16, sw, 1)  # masked: one expert per grid row
    assert G.swap_config(16, 4096, 7168, 16, None) == (128, 16, st, 1)  # no GPU (the interpreter)
    assert (st, sw) == (6, 4)


@pytest.mark.parametrize("arch", [A.Arch(9, 0), A.Arch(10, 0), A.Arch(12, 0)], ids=str)
def test_swap_stages_from_the_block_shared_memory(arch):
    """SWAP_STAGES slots of (BLOCK_N + BLOCK_T) x 128 bytes where the block's shared memory holds
    them beside RING_RESERVE (SM90, SM100: 227 KiB), fewer on SM120 (99 KiB);
    test_shared_memory_fit.py compiles both."""
    smem = arch.smem_per_block
    for rows, n, k, m, bn, bt, want in [(64, 4096, 7168, 64, 128, 64, G.SWAP_STAGES),
                                        (1, 4096, 7168, 1, 128, 16, G.SWAP_STAGES),
                                        (64, 7168, 2048, 64, 64, 64, G.SWAP_STAGES),
                                        (64, 7168, 2048, None, 128, 64, G.SWAP_STAGES_WAVES)]:
        stages = G.swap_config(rows, n, k, m, 132, smem)[2]
        fit = (smem - G.RING_RESERVE) // ((bn + bt) * 128)
        assert stages == min(want, fit) and 2 <= stages
    assert G.swap_config(64, 4096, 7168, 64, 132, A.Arch(12, 0).smem_per_block)[2] == 3
    assert G.swap_config(64, 4096, 7168, 64, 132, A.Arch(9, 0).smem_per_block)[2] == G.SWAP_STAGES == 6
    assert G.swap_config(64, 4096, 7168, 64, 132, 1024)[2] == 2  # never fewer than two slots


def test_ring_stages():
    """The depth a Triton kernel's ring gets: as asked where the block holds it beside RING_RESERVE,
    else as many slots as fit, never fewer than two; no limit off the GPU."""
    sm90, sm120 = A.Arch(9, 0).smem_per_block, A.Arch(12, 0).smem_per_block
    assert G.ring_stages(6, 24576, sm90) == 6 and G.ring_stages(6, 24576, None) == 6
    assert G.ring_stages(6, 24576, sm120) == (sm120 - G.RING_RESERVE) // 24576 == 3
    assert G.ring_stages(4, 32768, sm120) == 2 and G.ring_stages(4, 65536, sm120) == 2


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt", ["fp32", "ue8m0", "fp32_rows"])
@pytest.mark.parametrize("m,n,k,splits", [(1, 256, 384, None), (5, 200, 640, 3), (16, 384, 256, None),
                                          (33, 136, 384, 2), (64, 256, 1024, 4)])
def test_dense_swapped_kernel(monkeypatch, device, fmt, m, n, k, splits):
    """Dense M <= SWAP_MAX_ROWS runs the swapped kernel (forced splits included; the CUDA narrow
    kernel, which takes 1-64 rows before it on SM90, off) and matches the oracle and, to the last
    bit, the unswapped kernel."""
    a, sa, b, sb = _dense(m, n, k, fmt, device, seed=m * 7 + n + k)
    monkeypatch.setattr(G, "USE_NARROW", False)
    monkeypatch.setattr(G, "FORCE_SPLIT_K", splits)
    ran = _spy(monkeypatch, "_launch_swap")
    buf, out = _out((m, n), device)
    G.fp8_gemm_nt(a, sa, b, sb, out=out)
    again = G.fp8_gemm_nt(a, sa, b, sb)
    assert ran[0] is True and torch.equal(out, again)  # deterministic, splits included
    assert torch.isnan(buf[:, n:]).all() and not torch.isnan(out).any()
    assert rel_l2(out.cpu(), GR.gemm_nt_ref(a, sa, b, sb).cpu()) <= TOL
    monkeypatch.setattr(G, "USE_SWAP", False)
    monkeypatch.setattr(G, "FORCE_SPLIT_K", None)
    assert_bf16_last_bit(out, G.fp8_gemm_nt(a, sa, b, sb))


def test_dense_takes_the_swapped_kernel_only_for_few_rows(monkeypatch):
    ran = _spy(monkeypatch, "_launch_swap")
    for m in (G.SWAP_MAX_ROWS, G.SWAP_MAX_ROWS + 1):
        a, sa, b, sb = _dense(m, 128, 256, "fp32", "cpu", seed=m)
        G.fp8_gemm_nt(a, sa, b, sb)
    assert ran == [True, False]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt", ["fp32", "ue8m0"])
@pytest.mark.parametrize("expected_m", [16, 64])
def test_masked_swapped_kernel(monkeypatch, device, fmt, expected_m):
    """masked_m per expert: empty, one row, a ragged count, more rows than expected_m (the token
    loop takes several steps), all Mmax rows, and out-of-range entries (clamped and counted).
    Rows past masked_m stay NaN; the rest match the oracle and the pointer kernel."""
    e, mmax, n, k = 7, 80, 264, 384
    a, sa, b, sb = masked_operands(e, mmax, n, k, fmt, device, seed=expected_m)
    masked = torch.tensor([0, 1, 17, 70, mmax, -3, mmax + 9], dtype=torch.int32, device=device)
    rows = masked.clamp(0, mmax).tolist()
    ran = _spy(monkeypatch, "_launch_swap")
    buf, out = _out((e, mmax, n), device)
    cnt = torch.zeros(2, dtype=torch.int32, device=device)
    G.m_grouped_fp8_gemm_nt_masked(a, sa, b, sb, masked, expected_m=expected_m, out=out, counters=cnt)
    assert ran == [True] and cnt.tolist() == [1, 1]
    assert torch.isnan(buf[..., n:]).all()
    monkeypatch.setattr(G, "USE_SWAP", False)
    monkeypatch.setattr(G, "USE_TMA", False)
    ref = G.m_grouped_fp8_gemm_nt_masked(a, sa, b, sb, masked, expected_m=expected_m)
    oracle = GR.grouped_masked_ref(a, sa, b, sb, masked)
    for i, mm in enumerate(rows):
        assert torch.isnan(out[i, mm:]).all()
        if mm:
            assert not torch.isnan(out[i, :mm]).any()
            assert_bf16_last_bit(out[i, :mm], ref[i, :mm])
            assert rel_l2(out[i, :mm].cpu(), oracle[i, :mm]) <= TOL


# ----------------------------------------------------------------------------- the TMA kernel's masked mode


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt", ["fp32", "ue8m0", "fp32_rows"])
@pytest.mark.parametrize("progs", [None, 3], ids=["grid", "3-programs"])
def test_masked_tma_kernel(monkeypatch, device, fmt, progs):
    """expected_m above SWAP_MAX_ROWS where sm90_ws does not run (every GPU but SM90, and SM90
    operands its plan refuses): the persistent TMA kernel's masked mode. masked_m per expert: empty,
    one row, a whole tile, a ragged count, all Mmax rows (the last expert's, so its last tile reads
    past A's end: TMA's zero fill), and out-of-range entries (clamped and counted). progs 3: three
    persistent programs walk every expert's work items, the empty ones past masked_m included.
    Rows past masked_m and the guard columns stay NaN; the rest match the oracle and, bit for bit,
    the pointer kernel (the same tiles and promotion order)."""
    e, mmax, n, k = 7, 160, 264, 384
    a, sa, b, sb = masked_operands(e, mmax, n, k, fmt, device, seed=11)
    masked = torch.tensor([0, 1, 64, 100, -3, mmax + 9, mmax], dtype=torch.int32, device=device)
    rows = masked.clamp(0, mmax).tolist()
    monkeypatch.setattr(G, "USE_WS", False)
    if progs is not None:
        monkeypatch.setattr(G, "_gpu_limits", lambda dev: (progs, None))
    ran = _spy(monkeypatch, "_launch_tma")
    buf, out = _out((e, mmax, n), device)
    cnt = torch.zeros(2, dtype=torch.int32, device=device)
    G.m_grouped_fp8_gemm_nt_masked(a, sa, b, sb, masked, expected_m=128, out=out, counters=cnt)
    assert ran == [True] and cnt.tolist() == [1, 1]
    assert torch.isnan(buf[..., n:]).all()
    monkeypatch.setattr(G, "USE_TMA", False)
    ref = G.m_grouped_fp8_gemm_nt_masked(a, sa, b, sb, masked, expected_m=128)
    assert ran == [True, False]
    oracle = GR.grouped_masked_ref(a, sa, b, sb, masked)
    for i, mm in enumerate(rows):
        assert torch.isnan(out[i, mm:]).all()
        assert torch.equal(out[i, :mm], ref[i, :mm])
        if mm:
            assert rel_l2(out[i, :mm].cpu(), oracle[i, :mm]) <= TOL


def test_masked_tma_kernel_declines_experts_not_mmax_rows_apart(monkeypatch):
    """A [E, Mmax, K] cut from a taller buffer cannot be one [E * Mmax, K] TMA view: the pointer
    kernel runs it, with the same result."""
    e, mmax, n, k = 3, 96, 128, 256
    a, sa, b, sb = masked_operands(e, mmax, n, k, "fp32", "cpu", seed=12)
    masked = torch.tensor([96, 5, 70], dtype=torch.int32)
    tall = torch.empty(e, mmax + 16, k, dtype=a.dtype)
    tall[:, :mmax] = a
    ran = _spy(monkeypatch, "_launch_tma")
    want = G.m_grouped_fp8_gemm_nt_masked(a, sa, b, sb, masked, expected_m=96)
    got = G.m_grouped_fp8_gemm_nt_masked(tall[:, :mmax], sa, b, sb, masked, expected_m=96)
    assert ran == [True, False]
    for i, mm in enumerate(masked.tolist()):
        assert torch.equal(got[i, :mm], want[i, :mm])


# ----------------------------------------------------------------------------- sm90_ws masked mode

W = G.sm90_ws
needs_gluon = pytest.mark.skipif(W is None, reason="needs Triton with Gluon (triton.experimental.gluon)")


@needs_gluon
def test_ws_plan_for_masked_calls():
    e, mmax, n, k = 8, 512, 4096, 256
    a, sa, b, sb = masked_operands(e, mmax, n, k, "fp32", "cpu", seed=1)
    out = torch.empty(e, mmax, n, dtype=torch.bfloat16)

    def plan(rows, out=out, sms=132):
        return W.plan(a, sa, b, sb, out, packed_a=False, sb_div=128, arch=A.Arch(9, 0), num_sms=sms,
                      masked_rows=rows)

    assert plan(256) is None  # 8 x 2 x 32 tiles
    assert plan(128, sms=400) == "256 tiles of 128x128 for 400 SMs"
    wide = torch.empty(e, mmax + 1, n, dtype=torch.bfloat16)[:, :mmax]
    assert "one after another" in plan(256, out=wide)
    assert G.ws_refusal(G.MASKED, a, sa, b, sb, out, expected_m=G.SWAP_MAX_ROWS) in (
        "the Triton interpreter runs the Triton kernels", "not a CUDA tensor",
        f"expected_m {G.SWAP_MAX_ROWS} <= {G.SWAP_MAX_ROWS} rows: the swapped kernel")


def _triton_masked(monkeypatch, *args, **kwargs):
    """The pointer kernel's masked result (the swapped and the TMA kernels off)."""
    with monkeypatch.context() as mp:
        mp.setattr(G, "USE_WS", False)
        mp.setattr(G, "USE_SWAP", False)
        mp.setattr(G, "USE_TMA", False)
        return G.m_grouped_fp8_gemm_nt_masked(*args, **kwargs)


@needs_gluon
@pytest.mark.gpu_sm90
@pytest.mark.parametrize("mmax,epilogue", [(384, "tma"), (384, "pointer"), (200, "pointer")])
@pytest.mark.parametrize("bn", [64, 128, 256])
def test_ws_masked_is_bit_identical_to_triton(monkeypatch, mmax, epilogue, bn):
    """Uneven experts (empty, 1 row, one tile exactly, a ragged tile, all Mmax rows, a clamped
    entry) walked by the persistent scheduler over more tiles than programs; Mmax=200 (not whole
    64-row halves) keeps pointer stores. Launched directly, then through the dispatch."""
    e, n, k = 9, 2048 if bn == 256 else 2112, 640
    a, sa, b, sb = masked_operands(e, mmax, n, k, "fp32", "cuda", seed=mmax + bn)
    masked = torch.tensor([0, 1, 128, 200, mmax, 77, mmax + 5, 129, 64], dtype=torch.int32, device="cuda")
    rows = masked.clamp(0, mmax).tolist()
    buf, out = _out((e, mmax, n), "cuda", guard=8 if epilogue == "tma" else GUARD)
    if epilogue == "pointer" and mmax % 64 == 0:
        W.launch(G.MASKED, a, sa, b, sb, masked, masked, e, out, bn=bn, masked_rows=256, epi_tma=False, nprog=37)
    else:
        W.launch(G.MASKED, a, sa, b, sb, masked, masked, e, out, bn=bn, masked_rows=256, nprog=37)
    ref = _triton_masked(monkeypatch, a, sa, b, sb, masked, expected_m=256)
    oracle = GR.grouped_masked_ref(a, sa, b, sb, masked)
    tma_store = epilogue == "tma"
    for i, mm in enumerate(rows):
        assert torch.equal(out[i, :mm], ref[i, :mm])
        if mm:
            assert rel_l2(out[i, :mm].cpu(), oracle[i, :mm]) <= TOL
        untouched = -(-mm // 64) * 64 if tma_store else mm  # a TMA store writes whole 64-row halves
        assert torch.isnan(out[i, untouched:]).all()
    assert torch.isnan(buf[..., n:]).all()
    # the dispatch: expected_m above SWAP_MAX_ROWS with enough tiles takes sm90_ws
    calls = []
    launch = W.launch
    monkeypatch.setattr(G.sm90_ws, "launch", lambda *args, **kw: calls.append(args[0]) or launch(*args, **kw))
    cnt = torch.zeros(2, dtype=torch.int32, device="cuda")
    buf2, out2 = _out((e, mmax, n), "cuda")
    G.m_grouped_fp8_gemm_nt_masked(a, sa, b, sb, masked, expected_m=256, out=out2, counters=cnt)
    assert calls == [G.MASKED] and cnt.tolist() == [0, 1]
    for i, mm in enumerate(rows):
        assert torch.equal(out2[i, :mm], ref[i, :mm])
