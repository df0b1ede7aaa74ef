"""bench/decode_sweep.py's masked check, host side: _tma_mismatch compares what a masked call writes
below masked_m through the TMA kernel and through the pointer kernel (each over a NaN-poisoned out)
and names the experts that differ, so that a timed variant which computes something else is
reported instead of timed; _checked_time, which every depth and tile sweep times a variant through,
poisons the output first and reports a variant whose output differs from the reference, or that
cannot run; _ws_ring sets the ring depth a launch takes, staged tiles included. Run here under the
interpreter on CPU tensors; the timings come from the GPU."""

import torch

from bench import decode_sweep as S
from helpers import masked_operands
from rtp_fp8.gemm.triton import block_scaled as G


def _set(e=3, mmax=80, n=128, k=256):
    mm = torch.tensor([80, 0, 33], dtype=torch.int32)
    return *masked_operands(e, mmax, n, k, "fp32", "cpu", seed=3), mm, torch.empty(e, mmax, n, dtype=torch.bfloat16)


def _call(a, sa, b, sb, mm, out):
    G.m_grouped_fp8_gemm_nt_masked(a, sa, b, sb, mm, expected_m=80, out=out)


def test_the_tma_kernel_writes_what_the_pointer_kernel_writes():
    assert S._tma_mismatch(_call, [_set()]) == ""


def test_a_variant_that_writes_other_rows_is_named():
    def off_by_one(a, sa, b, sb, mm, out):
        _call(a, sa, b, sb, mm, out)
        if G.USE_TMA:
            out[2, 32] += 1  # the last row expert 2 owns

    assert S._tma_mismatch(off_by_one, [_set()]) == "differs from the pointer kernel in experts [2]"


def _ring_fake(monkeypatch):
    """decode_sweep._time patched where _checked_time uses it: one call over set 0, 5 us."""
    monkeypatch.setattr(S, "_time", lambda call, sets=None: call(*sets[0]) or 5.0)


def test_checked_time_times_a_variant_that_writes_the_reference(monkeypatch):
    _ring_fake(monkeypatch)
    x = torch.randn(4, 6, generator=torch.Generator().manual_seed(2))
    sets = [(x, torch.empty(4, 6))]
    out = sets[0][1]

    def call(x, out):
        out.copy_(x * 3)

    ref = S.output_of(call, sets[0], out)
    assert torch.equal(ref, x * 3)
    assert S._checked_time(call, out, ref, sets, "the kernel as shipped") == 5.0

    def other(x, out):
        out.copy_(x * 3)
        out[1, 2] = 0

    assert S._checked_time(other, out, ref, sets, "the kernel as shipped") == "differs from the kernel as shipped"
    # the output is poisoned first: a variant that writes nothing cannot pass on what the reference left
    out.copy_(ref)
    assert S._checked_time(lambda x, out: None, out, ref, sets) == "differs from the Triton split"


def test_checked_time_reports_a_variant_that_cannot_run(monkeypatch):
    monkeypatch.setattr(S, "_time", lambda call, sets=None: "OutOfResources: shared memory")
    out = torch.zeros(2, 2)
    assert S._checked_time(lambda: None, out, out.clone()) == "OutOfResources: shared memory"


def test_ring_sets_every_dense_tiles_depth_staged_or_not():
    """_ws_ring reaches the ring a launch takes (sm90_ws._ring), for unstaged and staged tiles alike, and
    restores both tables."""
    W = S.W
    half, narrow, wide = (W.HALF_BM, 64), (W.BM, W.NARROW_BN), (W.BM, W.WIDE_BN)
    before = (dict(W.STAGES_HALF), dict(W.SB_STAGE_TILES), W.STAGES_NARROW, W.STAGES_WIDE)
    for (bm, bn), depth in [(half, 11), (narrow, 10), (wide, 2), ((W.HALF_BM, 128), 5), ((W.BM, W.BN), 4)]:
        with S._ws_ring(bm, bn, depth):
            assert W._ring(0, bm, bn, staged=False) == depth
            assert W._ring(0, bm, bn, staged=True) == depth
    assert (dict(W.STAGES_HALF), dict(W.SB_STAGE_TILES), W.STAGES_NARROW, W.STAGES_WIDE) == before


def test_grid_sweep_checks_unsplit_variants_and_records_split_error(monkeypatch):
    """_grid_shape times every width x split x ring depth of the swapped kernel through _checked_time (an
    unsplit variant must write the unsplit kernel's bits, else it is reported, not timed) or, split,
    records its relative L2 to them; here on CPU operands with the timer faked (the interpreter runs the
    Triton kernels) and a dense call that miswrites one value in 32-row programs and rounds split sums
    differently."""
    from bench import gemm as BG

    def cpu_inputs(m, n, k):
        x = torch.randn(m, k, dtype=torch.bfloat16, generator=torch.Generator().manual_seed(m + n + k))
        w = torch.randn(n, k, dtype=torch.bfloat16, generator=torch.Generator().manual_seed(n)) / k**0.5
        a, sa = BG.T.per_token_group_quant(x, 128, scale_layout="col_tma")
        b, sb = BG.B.quantize_weight_blocks(w)
        return a, sa, b, sb, torch.empty(m, n, dtype=torch.bfloat16)

    def call(a, sa, b, sb, out):
        BG.dense_call(a, sa, b, sb, out)
        if G.SWAP_BLOCK_N == 32 and G.FORCE_SPLIT_K == 1:
            out[3, 5] += 1
        if G.FORCE_SPLIT_K == 2:
            out.mul_(1 + 2**-7)

    monkeypatch.setattr(S, "dense_inputs", cpu_inputs)
    monkeypatch.setattr(S, "dense_call", call)
    monkeypatch.setattr(S, "operand_sets", lambda make: [make()])
    monkeypatch.setattr(S, "_time", lambda call, sets=None: call(*sets[0]) or 5.0)
    monkeypatch.setattr(S, "GRID_WIDTHS", (32, 64))
    monkeypatch.setattr(S, "GRID_STAGES", (4,))
    r = S._grid_shape(16, 128, 2048, None)
    assert r["shipped"] == 5.0 and r["swap 64/s4/k1"] == 5.0 and r["swap 64/s4/k2"] == 5.0
    assert r["swap 32/s4/k1"] == "differs from the unsplit swapped kernel"
    assert 2**-8 < r["swap 64/s4/k2 rel_l2"] < 2**-6
    assert "swap 64/s4/k4" not in r  # 16 K blocks cannot keep SWAP_MIN_BLOCKS per split 4 ways
    assert r["best"] in ("swap 64/s4/k1", "swap 64/s4/k2", "swap 32/s4/k2")
