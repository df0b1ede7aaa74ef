"""bench/order_probe.py's host side: the timings run in bench/gemm.py's order (ours, the Triton kernel,
DeepGEMM), then DeepGEMM and ours in turn; the two ratios are read from the right timings; an output
far from DeepGEMM's stops the probe before anything is timed; a bad --pairs is refused by name.
Timings come from the GPU."""

import pytest
import torch

from bench import order_probe as P
from rtp_fp8.gemm.triton import block_scaled as G


def _inputs(m, n, k):
    g = torch.Generator().manual_seed(m + n + k)
    return (torch.randn(m, k, generator=g), None, torch.randn(n, k, generator=g), None, torch.empty(m, n))


def _patch(monkeypatch, us, dg_out=lambda a, b: a @ b.T):
    """Each kernel copies a product into out; rotated_ms returns us[label] per call in turn."""
    order = []

    def ours(a, sa, b, sb, o):
        o.copy_(a @ b.T)
        order.append("triton" if not G.USE_CLUSTER and not G.USE_WS else "ours")

    monkeypatch.setattr(P, "operand_sets", lambda make: [make()])
    monkeypatch.setattr(P, "dense_inputs", _inputs)
    monkeypatch.setattr(P, "dense_call", ours)

    def deepgemm(a, sa, b, sb, o, arch, dg):
        o.copy_(dg_out(a, b))
        order.append("deepgemm")

    monkeypatch.setattr(P.D, "fp8_gemm_nt", deepgemm)
    monkeypatch.setattr(P, "_nvml", lambda: (1755, 690.0))
    timed = []

    def rotated_ms(call, sets):
        before = len(order)
        call(*sets[0])
        label = order[before]
        timed.append(label)
        return us[label].pop(0) / 1e3

    monkeypatch.setattr(P, "rotated_ms", rotated_ms)
    return timed


def test_orders_and_ratios(monkeypatch):
    us = {"ours": [100.0, 97.0, 99.0, 98.0], "triton": [160.0], "deepgemm": [90.0, 96.0, 95.0, 94.0]}
    timed = _patch(monkeypatch, us)
    r = P.probe((8, 16, 128), dg=object(), pairs=3)
    assert timed == ["ours", "triton", "deepgemm"] + ["deepgemm", "ours"] * 3
    assert r["ours_over_dg_gemm_py_order"] == pytest.approx(90.0 / 100.0)
    assert r["ours_over_dg_alternating"] == pytest.approx(95.0 / 98.0)  # medians of (96, 95, 94), (97, 99, 98)
    assert r["same"] == "bit" and r["alternating"][0] == {"label": "deepgemm", "us": 96.0, "sm_mhz": 1755,
                                                          "watts": 690.0}


def test_a_wrong_output_stops_the_probe_before_timing(monkeypatch):
    timed = _patch(monkeypatch, {}, dg_out=lambda a, b: a @ b.T + 1)
    with pytest.raises(AssertionError, match=r"\(8, 16, 128\): the dispatch's output is .* from DeepGEMM's"):
        P.probe((8, 16, 128), dg=object(), pairs=1)
    assert timed == []


def test_a_split_k_rounding_is_within_the_stated_tolerance(monkeypatch):
    _patch(monkeypatch, {"ours": [1.0, 1.0], "triton": [1.0], "deepgemm": [1.0, 1.0]},
           dg_out=lambda a, b: (a @ b.T) * (1 + 1e-6))
    r = P.probe((8, 16, 128), dg=object(), pairs=1)
    assert isinstance(r["same"], float) and 0 < r["same"] < 1e-4


def test_pairs_is_refused_by_name(monkeypatch):
    monkeypatch.setattr("sys.argv", ["order_probe", "--pairs", "0"])
    with pytest.raises(SystemExit, match="--pairs must be at least 1, got 0"):
        P.main()
