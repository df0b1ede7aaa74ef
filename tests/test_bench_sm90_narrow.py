"""bench/sm90_narrow.py's host side: the variants it times (the dispatch three ways, the narrow kernel
per tile width, ring depth, multicast and launch mode, each call passing its own arguments to the
op) and --nk's parsing. Timings come from the GPU."""

import argparse

import pytest

from bench import sm90_narrow as N
from rtp_fp8.gemm.triton import block_scaled as G


def test_variants_label_and_pass_each_launch_mode(monkeypatch):
    seen = []
    monkeypatch.setattr(N._ext, "fp8_gemm_sm90_narrow_stages", lambda bn: {32: 16, 64: 13}[bn])
    monkeypatch.setattr(N._ext, "fp8_gemm_sm90_narrow", lambda *args: seen.append(args[5:]))
    todo = N.variants([32, 64], [6, 14], None, multicast=(False,), pdl=(0, 2))
    labels = [label for label, _ in todo]
    assert labels == ["dispatch", "dispatch no pdl", "dispatch ws pdl1", "dispatch ws plain", "without narrow",
                      "narrow 64x32 s6", "narrow 64x32 s6 pdl2",
                      "narrow 64x32 s14", "narrow 64x32 s14 pdl2", "narrow 64x64 s6", "narrow 64x64 s6 pdl2"]
    for _, call in todo[5:]:  # s14 is more than 64x64's 13 slots: not timed
        call("a", "sa", "b", "sb", "out")
    assert seen == [(32, 6, False, 0), (32, 6, False, 2), (32, 14, False, 0), (32, 14, False, 2),
                    (64, 6, False, 0), (64, 6, False, 2)]


def test_ws_pdl_variants_set_ws_pdl_for_the_call(monkeypatch):
    seen = []
    monkeypatch.setattr(N, "dense_call", lambda *ops: seen.append(G.WS_PDL))
    todo = dict(N.variants([], [], None))
    todo["dispatch ws pdl1"]()
    todo["dispatch ws plain"]()
    todo["dispatch"]()
    assert seen == [1, 0, G.WS_PDL] and G.WS_PDL == 2


def test_nk_pairs():
    assert N.nk_pair("7168x2048") == (7168, 2048) and N.nk_pair("4096X7168") == (4096, 7168)
    for bad in ("7168", "0x2048", "ax2"):
        with pytest.raises(argparse.ArgumentTypeError):
            N.nk_pair(bad)
