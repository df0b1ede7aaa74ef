"""bench/sb_prefetch.py's host side: measure() times neither, the prefetch and the staging, then both at each
deeper ring in turn, each rep; restores SB_PREFETCH_ROWS, SB_STAGE_ROWS and the ring depth; reports a variant
whose output differs or that cannot run instead of timing it. The timings come from the GPU."""

import torch

from bench import sb_prefetch as P
from rtp_fp8.gemm.triton import sm90_ws as W


def _sets():
    g = torch.Generator().manual_seed(3)
    return [(torch.randn(4, 8, generator=g), torch.empty(4, 8))]


def _copy(x, out):
    out.copy_(x)


def test_variants_take_turns_and_everything_is_restored(monkeypatch):
    seen = []

    def fake(call, sets):
        seen.append((bool(W.SB_PREFETCH_ROWS), bool(W.SB_STAGE_ROWS), W._stages(128)))
        return (1.5 if W.SB_PREFETCH_ROWS else 1.25 if W.SB_STAGE_ROWS else 2.0) / 1024
    monkeypatch.setattr(P, "rotated_ms", fake)
    shipped, staged, depth = W.SB_PREFETCH_ROWS, W.SB_STAGE_ROWS, W._stages(128)
    r = P.measure(_copy, _sets(), 1, reps=2, stages=(9,))
    assert seen == [(False, False, depth), (True, False, depth), (False, True, depth), (True, False, 9),
                    (False, True, 9)] * 2
    assert r["us"] == {"off": 2e3 / 1024, "on": 1.5e3 / 1024, "stage": 1.25e3 / 1024, "on s9": 1.5e3 / 1024,
                       "stage s9": 1.25e3 / 1024}
    assert r["reps_us"]["on s9"] == [1.5e3 / 1024] * 2 and r["failed"] == {}
    assert (W.SB_PREFETCH_ROWS, W.SB_STAGE_ROWS, W._stages(128)) == (shipped, staged, depth)


def test_a_differing_or_failing_variant_is_reported_not_timed(monkeypatch):
    seen = []
    monkeypatch.setattr(P, "rotated_ms", lambda call, sets: seen.append(bool(W.SB_PREFETCH_ROWS)) or 1e-3)

    def call(x, out):
        if W._stages(128) == 12:
            raise RuntimeError("out of shared memory")
        out.copy_(x + (1.0 if W.SB_PREFETCH_ROWS else 0.0))

    r = P.measure(call, _sets(), 1, reps=2, stages=(12,))
    assert r["failed"] == {"on": "differs from the output with neither",
                           "on s12": "cannot run: RuntimeError: out of shared memory",
                           "stage s12": "cannot run: RuntimeError: out of shared memory"}
    assert r["us"].keys() == {"off", "stage"} and seen == [False, False, False, False]


def test_cases_cover_decode_and_m4096():
    shapes = [c[1] for c in P.cases()]
    assert shapes[:6] == [[64, 4096, 7168], [64, 7168, 2048], [128, 4096, 7168], [128, 7168, 2048],
                          [256, 4096, 7168], [256, 7168, 2048]]
    assert [4096, 7168, 16384] in shapes and [8, 4096, 7168, 2048] in shapes
    assert [c[1] for c in P.cases(decode_only=True)] == shapes[:6]
    assert [c[1] for c in P.cases(large_only=True)] == shapes[6:]


def test_variants_cover_every_tile_height():
    with P.variant(False, None):
        assert W.SB_PREFETCH_ROWS == frozenset() and W.SB_STAGE_ROWS == frozenset()
    with P.variant(True, 7):
        assert W.SB_PREFETCH_ROWS == {W.HALF_BM, W.BM} and W._stages(256) == 7
    with P.variant(False, None, stage=True):
        assert W.SB_PREFETCH_ROWS == frozenset() and W.SB_STAGE_ROWS == {W.HALF_BM, W.BM}
    assert W.SB_PREFETCH_ROWS == {W.HALF_BM}  # the shipped default: 64-row tiles prefetch
    assert W.SB_STAGE_ROWS == frozenset()  # and none stages
