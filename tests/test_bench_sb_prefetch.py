"""bench/sb_prefetch.py's host side: measure() times neither, the prefetch, the staging and the shipped
defaults, then the prefetch and the staging at each
deeper ring in turn, each rep; restores SB_PREFETCH_ROWS, SB_STAGE_TILES and the ring depth; reports a variant
whose output differs or that cannot run instead of timing it. The timings come from the GPU."""

import torch

from bench import sb_prefetch as P
from rtp_fp8.gemm.triton import block_scaled as G
from rtp_fp8.gemm.triton import sm90_ws as W


def _sets():
    g = torch.Generator().manual_seed(3)
    return [(torch.randn(4, 8, generator=g), torch.empty(4, 8))]


def _copy(x, out):
    out.copy_(x)


def test_variants_take_turns_and_everything_is_restored(monkeypatch):
    seen = []

    shipped, staged, depth = W.SB_PREFETCH_ROWS, dict(W.SB_STAGE_TILES), W._stages(128)

    def fake(call, sets):
        now = (W.SB_PREFETCH_ROWS, W.SB_STAGE_TILES)
        seen.append(("shipped" if now == (shipped, staged) else len(W.SB_PREFETCH_ROWS), len(W.SB_STAGE_TILES),
                     W._stages(128)))
        return (1.5 if len(W.SB_PREFETCH_ROWS) == 2 else 1.25 if W.SB_STAGE_TILES else 2.0) / 1024
    monkeypatch.setattr(P, "rotated_ms", fake)
    r = P.measure(_copy, _sets(), 1, reps=2, stages=(9,))
    every = len(P.STAGE_TILES)
    assert seen == [(0, 0, depth), (2, 0, depth), (0, every, depth), ("shipped", len(staged), depth), (2, 0, 9),
                    (0, every, 9)] * 2
    assert r["us"] == {"off": 2e3 / 1024, "on": 1.5e3 / 1024, "stage": 1.25e3 / 1024, "shipped": 1.25e3 / 1024,
                       "on s9": 1.5e3 / 1024, "stage s9": 1.25e3 / 1024}
    assert r["reps_us"]["on s9"] == [1.5e3 / 1024] * 2 and r["failed"] == {}
    assert (W.SB_PREFETCH_ROWS, W.SB_STAGE_TILES, W._stages(128)) == (shipped, staged, depth)


def test_a_differing_or_failing_variant_is_reported_not_timed(monkeypatch):
    seen = []
    monkeypatch.setattr(P, "rotated_ms", lambda call, sets: seen.append(len(W.SB_PREFETCH_ROWS)) or 1e-3)

    def call(x, out):
        if W._stages(128) == 12:
            raise RuntimeError("out of shared memory")
        out.copy_(x + (1.0 if len(W.SB_PREFETCH_ROWS) == 2 else 0.0))

    r = P.measure(call, _sets(), 1, reps=2, stages=(12,))
    x = _sets()[0][0]
    d = P.rel_l2(x + 1.0, x)
    assert r["failed"] == {"on": f"differs from the output with neither (relative L2 {d:.1e})",
                           "on s12": "cannot run: RuntimeError: out of shared memory",
                           "stage s12": "cannot run: RuntimeError: out of shared memory"}
    assert r["us"].keys() == {"off", "stage", "shipped"} and seen == [0, 0, 1] * 2


def test_cases_cover_decode_and_m4096():
    shapes = [c[1] for c in P.cases()]
    assert shapes[:6] == [[64, 4096, 7168], [64, 7168, 2048], [128, 4096, 7168], [128, 7168, 2048],
                          [256, 4096, 7168], [256, 7168, 2048]]
    assert [4096, 7168, 16384] in shapes and [8, 4096, 7168, 2048] in shapes
    assert [c[1] for c in P.cases(decode_only=True)] == shapes[:6]
    assert [c[1] for c in P.cases(large_only=True)] == shapes[6:]


def test_variants_cover_every_tile():
    with P.variant(False, None):
        assert W.SB_PREFETCH_ROWS == frozenset() and W.SB_STAGE_TILES == {}
    with P.variant(True, 7):
        assert W.SB_PREFETCH_ROWS == {W.HALF_BM, W.BM} and W._stages(256) == 7 and W.SB_STAGE_TILES == {}
    with P.variant(False, None, stage=True):  # every tile stages, at the shipped table's ring where it has one
        assert W.SB_PREFETCH_ROWS == frozenset() and W.SB_STAGE_TILES.keys() == set(P.STAGE_TILES)
        assert W.SB_STAGE_TILES[(0, W.HALF_BM, 64)] == 8 and W.SB_STAGE_TILES[(1, W.BM, 128)] is None
        assert W.SB_STAGE_SPLIT
    with P.variant(False, 9, stage=True):
        assert set(W.SB_STAGE_TILES.values()) == {9} and W._stages(64) == 9
    with P.variant(None, None):
        assert W.SB_PREFETCH_ROWS == {W.HALF_BM}
    # the shipped defaults: 64-row tiles prefetch, dense 64x64 and 128x64 tiles stage in an 8-slot ring
    assert W.SB_PREFETCH_ROWS == {W.HALF_BM}
    assert W.SB_STAGE_TILES == {(0, W.HALF_BM, 64): 8, (0, W.BM, W.NARROW_BN): 8} and not W.SB_STAGE_SPLIT


def test_ws_split_variant_is_timed_within_its_bound_and_restored(monkeypatch):
    """"stage ws" comes last and runs with WS_SPLIT_BEFORE_SWAP on (restored after). Its output may differ
    from off's by reordered FP32 sums (relative L2 kept under rel_l2, timed); beyond WS_SPLIT_REL it
    is reported, not timed."""
    seen = []
    monkeypatch.setattr(P, "rotated_ms", lambda call, sets: seen.append(G.WS_SPLIT_BEFORE_SWAP) or 1e-3)

    def call(eps):
        def run(x, out):
            out.copy_(x * (1 + eps) if G.WS_SPLIT_BEFORE_SWAP else x)
        return run

    r = P.measure(call(1e-5), _sets(), 1, reps=2, ws_split=True)
    assert [label for label, *_ in P.variants((), ws_split=True)][-1] == "stage ws"
    assert seen == [False, False, False, False, True] * 2 and r["failed"] == {}
    assert r["us"]["stage ws"] == 1.0 and abs(r["rel_l2"]["stage ws"] - 1e-5) < 1e-6
    assert G.WS_SPLIT_BEFORE_SWAP is False
    r = P.measure(call(1e-2), _sets(), 1, reps=1, ws_split=True)
    d = P.rel_l2(_sets()[0][0] * (1 + 1e-2), _sets()[0][0])
    assert "stage ws" not in r["us"]
    assert r["failed"] == {"stage ws": f"differs from the output with neither (relative L2 {d:.1e})"}
