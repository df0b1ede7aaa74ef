"""bench/decode_pdl.py's host side: measure() times its modes (DEP_MODE 0, 1, 2; the quantization's
PDL_TRIGGER off and on) in turn, each rep, restores the shipped flags, and reports a mode whose output
differs instead of timing it. The timings come from the GPU."""

import torch

from bench import decode_pdl as P
from rtp_fp8.gemm.triton import block_scaled as G
from rtp_fp8.quant import token_group as QT


def _sets():
    g = torch.Generator().manual_seed(9)
    return [(torch.randn(4, 8, generator=g), torch.empty(4, 8))]


def test_modes_take_turns_and_the_mode_is_restored(monkeypatch):
    seen = []

    def fake(call, sets):
        seen.append((G.DEP_MODE, QT.PDL_TRIGGER))
        return (3.0 - 0.5 * G.DEP_MODE - 0.25 * QT.PDL_TRIGGER) / 1024
    monkeypatch.setattr(P, "rotated_ms", fake)
    shipped = G.DEP_MODE, QT.PDL_TRIGGER
    r = P.measure(lambda x, out: out.copy_(x + 1), _sets(), 1, reps=2)
    assert seen == [(0, False), (1, False), (2, False), (1, True), (2, True)] * 2
    assert r["chain_us"] == {m: t * 1e3 / 1024 for m, t in {"d0": 3.0, "d1": 2.5, "d2": 2.0, "d1t": 2.25,
                                                             "d2t": 1.75}.items()}
    assert r["chain_reps_us"]["d2t"] == [1.75e3 / 1024] * 2
    assert (G.DEP_MODE, QT.PDL_TRIGGER) == shipped


def test_a_mode_whose_output_differs_is_reported_not_timed(monkeypatch):
    seen = []
    monkeypatch.setattr(P, "rotated_ms", lambda call, sets: seen.append(G.DEP_MODE) or 1e-3)

    def call(x, out):
        out.copy_(x)
        if G.DEP_MODE == 2:
            out[1, 2] = 0.0

    assert P.measure(call, _sets(), 1, reps=2) == {"error": "mode d2's output differs from plain launches'"}
    assert seen == [0, 1]


def test_a_mode_that_writes_nothing_is_reported(monkeypatch):
    monkeypatch.setattr(P, "rotated_ms", lambda call, sets: 1e-3)

    def call(x, out):
        if not QT.PDL_TRIGGER:
            out.copy_(x)

    assert "mode d1t" in P.measure(call, _sets(), 1, reps=1)["error"]


def test_shapes_are_the_decode_targets():
    assert P.SHAPES == [(1, 4096, 7168), (1, 7168, 2048), (16, 4096, 7168), (16, 7168, 2048), (64, 4096, 7168),
                        (64, 7168, 2048)]
