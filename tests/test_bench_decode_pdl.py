"""bench/decode_pdl.py's host side: measure() times DEP_MODE 0, 1 and 2 in turn, each rep, restores
the shipped mode, and reports a mode whose output differs instead of timing it. The timings come from
the GPU."""

import torch

from bench import decode_pdl as P
from rtp_fp8.gemm.triton import block_scaled as G


def _sets():
    g = torch.Generator().manual_seed(9)
    return [(torch.randn(4, 8, generator=g), torch.empty(4, 8))]


def test_modes_take_turns_and_the_mode_is_restored(monkeypatch):
    seen = []

    def fake(call, sets):
        seen.append(G.DEP_MODE)
        return (3.0 - 0.5 * G.DEP_MODE) * 1e-3
    monkeypatch.setattr(P, "rotated_ms", fake)
    shipped = G.DEP_MODE
    r = P.measure(lambda x, out: out.copy_(x + 1), _sets(), 1, reps=2)
    assert seen == [0, 1, 2] * 2
    assert r["chain_us"] == {0: 3.0, 1: 2.5, 2: 2.0}
    assert r["chain_reps_us"] == {0: [3.0, 3.0], 1: [2.5, 2.5], 2: [2.0, 2.0]}
    assert G.DEP_MODE == shipped


def test_a_mode_whose_output_differs_is_reported_not_timed(monkeypatch):
    seen = []
    monkeypatch.setattr(P, "rotated_ms", lambda call, sets: seen.append(G.DEP_MODE) or 1e-3)

    def call(x, out):
        out.copy_(x)
        if G.DEP_MODE == 2:
            out[1, 2] = 0.0

    assert P.measure(call, _sets(), 1, reps=2) == {"error": "DEP_MODE 2's output differs from DEP_MODE 0's"}
    assert seen == [0, 1]


def test_a_mode_that_writes_nothing_is_reported(monkeypatch):
    monkeypatch.setattr(P, "rotated_ms", lambda call, sets: 1e-3)

    def call(x, out):
        if G.DEP_MODE != 1:
            out.copy_(x)

    assert "DEP_MODE 1" in P.measure(call, _sets(), 1, reps=1)["error"]


def test_shapes_are_the_decode_targets():
    assert P.SHAPES == [(1, 4096, 7168), (1, 7168, 2048), (16, 4096, 7168), (16, 7168, 2048), (64, 4096, 7168),
                        (64, 7168, 2048)]
