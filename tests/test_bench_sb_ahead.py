"""bench/sb_ahead.py's host side: measure() times SB_AHEAD off and on in turn, each rep, restores
the shipped flag, and reports a variant whose output differs instead of timing it; wide() names the
shapes whose dispatch runs 128x256 tiles. The timings come from the GPU."""

import pytest
import torch

from bench import sb_ahead as S
from rtp_fp8.gemm.triton import sm90_ws as W


@pytest.fixture
def timed(monkeypatch):
    """rotated_ms patched where sb_ahead uses it: 2.0 ms with SB_AHEAD off, 1.6 on; the flags seen."""
    seen = []

    def fake(call, sets):
        seen.append(W.SB_AHEAD)
        return 1.6e-3 if W.SB_AHEAD else 2.0e-3
    monkeypatch.setattr(S, "rotated_ms", fake)
    return seen


def _sets():
    g = torch.Generator().manual_seed(5)
    return [(torch.randn(8, 8, generator=g), torch.empty(8, 8))]


def test_off_and_on_take_turns_and_the_flag_is_restored(timed):
    shipped = W.SB_AHEAD

    def call(x, out):
        out.copy_(x * 2)

    r = S.measure(call, _sets(), 1, reps=3)
    assert timed == [False, True] * 3
    assert r["off_reps_us"] == [2.0] * 3 and r["on_reps_us"] == [1.6] * 3
    assert (r["off_us"], r["on_us"]) == (2.0, 1.6) and r["speedup"] == pytest.approx(1.25)
    assert W.SB_AHEAD == shipped


def test_an_output_that_differs_is_reported_not_timed(timed):
    def call(x, out):
        out.copy_(x * 2)
        if W.SB_AHEAD:
            out[3, 4] += 1

    assert S.measure(call, _sets(), 1, reps=2) == {"on": "differs from the output with SB_AHEAD off"}
    assert timed == [False]


def test_wide_names_the_shapes_that_take_128x256_tiles():
    cases = list(S.cases())
    assert [c[1] for c in cases] == [[4096, 2112, 7168], [4096, 24576, 1536], [4096, 32768, 512],
                                     [4096, 7168, 16384], [4096, 4096, 7168], [4096, 7168, 2048],
                                     [8, 4096, 4096, 7168], [8, 4096, 7168, 2048], [32, 512, 4096, 7168]]
    assert all(S.wide(kind, shape, 132) for kind, shape, *_ in cases)  # (4096, 2112, ...) by the column split
    assert not S.wide("dense", [4096, 1000, 7168], 132)  # no whole wide tiles fill the GPU
    assert not S.wide("contiguous", [2, 256, 2048, 7168], 132)  # 4 x 8 wide tiles
