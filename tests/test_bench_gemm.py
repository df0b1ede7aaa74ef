"""bench/gemm.py's DeepGEMM comparison (_beside): DeepGEMM's output is compared with ours before any
timing; the timings alternate (DeepGEMM, DeepGEMM as a programmatic dependent, ours) for the rounds
asked; each kernel's time is the median of its timings; a PDL launch DeepGEMM refuses is reported, not
retried, and the ratio is then to the plain launch; a bad --pairs is refused by name. Timings come from
the GPU."""

import pytest
import torch

from bench import gemm as M


def _sets():
    g = torch.Generator().manual_seed(11)
    return [(torch.randn(4, 8, generator=g), torch.empty(4, 8))]


def _patch(monkeypatch, times, pdl_fails=False):
    order, state = [], {"pdl": False}

    class Pdl:
        def __enter__(self):
            if pdl_fails:
                raise RuntimeError("DeepGEMM built without PDL")
            state["pdl"] = True

        def __exit__(self, *exc):
            state["pdl"] = False

    def rotated_ms(call, sets):
        label = call(*sets[0])
        label = "dg_pdl" if label == "dg" and state["pdl"] else label
        order.append(label)
        return times[label].pop(0)

    monkeypatch.setattr(M, "rotated_ms", rotated_ms)
    monkeypatch.setattr(M.D, "pdl_launches", Pdl)
    return order


def _dg(x, out):
    out.copy_(x * 2)
    return "dg"


def _ours(x, out):
    out.copy_(x * 2)
    return "ours"


def test_the_timings_alternate_and_each_time_is_a_median(monkeypatch):
    order = _patch(monkeypatch, {"dg": [2.0, 4.0, 3.0], "dg_pdl": [5.0, 1.5, 9.0], "ours": [2.5, 3.5, 1.0]})
    sets = _sets()
    sets[0][1].copy_(sets[0][0] * 2)  # what ours wrote
    r = M._beside({"ms": 3.0, "tflops": 0.0}, 6e9, _dg, _ours, sets, 1, pairs=3)
    assert order == ["dg", "dg_pdl", "ours"] * 3
    assert r["ms_each"] == {"ours": [3.0, 2.5, 3.5, 1.0], "dg": [2.0, 4.0, 3.0], "dg_pdl": [5.0, 1.5, 9.0]}
    assert r["ms"] == 2.75 and r["tflops"] == pytest.approx(6e9 / 2.75e-3 / 1e12)
    assert r["dg_tflops"] == pytest.approx(6e9 / 3e-3 / 1e12) and r["dg_pdl_tflops"] == pytest.approx(6e9 / 5e-3 / 1e12)
    assert r["ours_over_dg"] == pytest.approx(3.0 / 2.75) and r["same"] == "bit"


def test_outputs_are_compared_before_timing_and_a_refused_pdl_launch_is_reported(monkeypatch):
    order = _patch(monkeypatch, {"dg": [2.0, 2.0], "ours": [1.0, 1.0]}, pdl_fails=True)
    sets = _sets()
    sets[0][1].copy_(sets[0][0])  # ours wrote x, DeepGEMM writes 2x
    r = M._beside({"ms": 1.0, "tflops": 0.0}, 2e9, _dg, _ours, sets, 1, pairs=2)
    assert order == ["dg", "ours", "dg", "ours"]
    assert r["same"] == f"{M.rel_l2(sets[0][0], sets[0][0] * 2):.1e}"
    assert r["dg_pdl_tflops"] == "not run: DeepGEMM built without PDL"
    assert r["ours_over_dg"] == pytest.approx(2.0)


def test_pairs_is_refused_by_name(monkeypatch):
    monkeypatch.setattr("sys.argv", ["gemm", "--pairs", "0"])
    monkeypatch.setattr(M, "fp8_gemm_tflops", lambda: pytest.fail("ran before the argument was checked"))
    with pytest.raises(SystemExit, match="--pairs must be at least 1, got 0"):
        M.main()
