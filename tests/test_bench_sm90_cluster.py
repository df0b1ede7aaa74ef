"""bench/sm90_cluster.py's host side: the reference is the Triton kernel unsplit (block_scaled's flags
patched for it and restored), every variant is compared with it and timed each rep in turn, a cluster
variant that differs stops the run, the sm90_ws and dispatch variants run with USE_CLUSTER off and on, and
extension_env (shared with bench/sm90_narrow.py) names the bench and DeepGEMM. Timings come
from the GPU."""

import pytest
import torch

from bench import sm90_cluster as C
from rtp_fp8.gemm.triton import block_scaled as G


def _sets():
    g = torch.Generator().manual_seed(5)
    return [(torch.randn(4, 8, generator=g), torch.empty(4, 8))]


def _flags():
    return (G.USE_WS, G.USE_SWAP, G.FORCE_SPLIT_K, G.USE_CLUSTER)


def test_reference_comparisons_and_turns(monkeypatch):
    before, seen = _flags(), []

    def ref_call(x, out):  # the 'dispatch' slot: the Triton kernel when the flags say so
        out.copy_(x if not G.USE_WS and G.FORCE_SPLIT_K == 1 and not G.USE_SWAP else x + 1)

    todo = [("sm90_ws", lambda x, out: out.copy_(x)), ("dispatch", ref_call),
            ("cluster g8", lambda x, out: out.copy_(x)), ("deepgemm", lambda x, out: out.copy_(x * 2))]
    monkeypatch.setattr(C, "rotated_ms", lambda call, sets: seen.append(call) or 1e-3)
    r = C.measure(_sets(), 1, todo, reps=2)
    x = _sets()[0][0]
    assert r["same"] == {"sm90_ws": "bit", "dispatch": f"{C.rel_l2(x + 1, x):.1e}", "cluster g8": "bit",
                         "deepgemm": f"{C.rel_l2(x * 2, x):.1e}"}
    assert seen == [call for _, call in todo] * 2 and r["us"] == {label: 1.0 for label, _ in todo}
    assert r["reps_us"]["cluster g8"] == [1.0, 1.0] and _flags() == before


def test_only_times_the_named_variants_and_still_checks_them_against_the_reference(monkeypatch):
    seen = []

    def ref_call(x, out):  # the 'dispatch' slot, not timed: it still gives the reference's bits
        out.copy_(x if not G.USE_WS and G.FORCE_SPLIT_K == 1 and not G.USE_SWAP else x + 1)

    todo = [("sm90_ws", lambda x, out: pytest.fail("ran a variant not asked for")), ("dispatch", ref_call),
            ("cluster g4", lambda x, out: out.copy_(x)), ("deepgemm", lambda x, out: out.copy_(x * 2))]
    monkeypatch.setattr(C, "rotated_ms", lambda call, sets: seen.append(call) or 2e-3)
    r = C.measure(_sets(), 1, todo, reps=2, only=["cluster", "deepgemm"])
    assert list(r["us"]) == ["cluster g4", "deepgemm"] and r["us"]["cluster g4"] == 2.0
    assert seen == [todo[2][1], todo[3][1]] * 2 and r["same"]["cluster g4"] == "bit"
    todo[2] = ("cluster g4", lambda x, out: out.copy_(x - 1))
    with pytest.raises(AssertionError, match="cluster g4 differs from the Triton kernel"):
        C.measure(_sets(), 1, todo, reps=1, only=["cluster"])


def test_a_cluster_variant_that_differs_stops_the_run(monkeypatch):
    monkeypatch.setattr(C, "rotated_ms", lambda call, sets: pytest.fail("timed a wrong kernel"))
    todo = [("sm90_ws", lambda x, out: out.copy_(x)), ("dispatch", lambda x, out: out.copy_(x)),
            ("cluster g16", lambda x, out: out.copy_(x + 1))]
    with pytest.raises(AssertionError, match="cluster g16 differs from the Triton kernel"):
        C.measure(_sets(), 1, todo, reps=1)


def test_the_sm90_ws_and_dispatch_variants_turn_the_cluster_kernel_off_and_on(monkeypatch):
    seen, shipped = [], G.USE_CLUSTER
    monkeypatch.setattr(C, "dense_call", lambda *ops: seen.append(G.USE_CLUSTER))
    monkeypatch.setattr(C, "grouped_call", lambda *ops: seen.append(("grouped", G.USE_CLUSTER)))
    dense = dict(C.variants("dense", [8, 16], None))
    assert list(dense) == ["sm90_ws", "dispatch", "cluster g8", "cluster g16"]
    dense["sm90_ws"]()
    dense["dispatch"]()
    grouped = dict(C.variants("contiguous", [8], None))
    assert list(grouped) == ["sm90_ws", "dispatch", "cluster g8"]
    grouped["sm90_ws"]()
    grouped["dispatch"]()
    assert seen == [False, True, ("grouped", False), ("grouped", True)] and G.USE_CLUSTER is shipped


def test_clusters_caps_make_one_variant_each(monkeypatch):
    seen = []
    monkeypatch.setattr(C._ext, "fp8_gemm_sm90", lambda *args: seen.append(args[-3:]))
    dense = dict(C.variants("dense", [8], None, caps=(0, 66)))
    assert list(dense) == ["sm90_ws", "dispatch", "cluster g8", "cluster g8 c66"]
    dense["cluster g8"](0, 1, 2, 3, 4)
    dense["cluster g8 c66"](0, 1, 2, 3, 4)
    assert seen == [(8, 0, True), (8, 66, True)]


def test_multicast_off_makes_a_nomc_variant_each(monkeypatch):
    seen = []
    monkeypatch.setattr(C._ext, "fp8_gemm_sm90_contiguous", lambda *args: seen.append(args[-3:]))
    grouped = dict(C.variants("contiguous", [8], None, caps=(0, 60), multicast=(True, False)))
    assert list(grouped) == ["sm90_ws", "dispatch", "cluster g8", "cluster g8 nomc", "cluster g8 c60",
                             "cluster g8 c60 nomc"]
    for label in list(grouped)[2:]:
        grouped[label](*range(7))
    assert seen == [(8, 0, True), (8, 0, False), (8, 60, True), (8, 60, False)]


def test_the_narrow_bench_checks_its_variants_against_its_first(monkeypatch):
    """bench/sm90_narrow.py: the reference is its first variant (the dispatch) run as the Triton kernel
    unsplit, and a narrow variant that differs stops the run."""
    monkeypatch.setattr(C, "rotated_ms", lambda call, sets: 1e-3)
    ref_call = lambda x, out: out.copy_(x if not G.USE_WS and G.FORCE_SPLIT_K == 1 else x + 1)  # noqa: E731
    todo = [("dispatch", ref_call), ("narrow 64x32 s6", lambda x, out: out.copy_(x))]
    assert C.measure(_sets(), 1, todo, reps=1, exact="narrow", ref=0)["same"]["narrow 64x32 s6"] == "bit"
    todo.append(("narrow 64x64 s8 mc", lambda x, out: out.copy_(x - 1)))
    with pytest.raises(AssertionError, match="narrow 64x64 s8 mc differs from the Triton kernel"):
        C.measure(_sets(), 1, todo, reps=1, exact="narrow", ref=0)


def test_extension_env_names_the_bench_without_the_extension_and_deepgemm_when_skipped(monkeypatch):
    monkeypatch.setattr(C._ext, "available", lambda: False)
    monkeypatch.setattr(C._ext, "unavailable_reason", lambda: "_C.so not built")
    with pytest.raises(SystemExit, match=r"^sm90_narrow: the extension is not built \(_C.so not built\)$"):
        C.extension_env("sm90_narrow", no_deepgemm=True)
    monkeypatch.setattr(C._ext, "available", lambda: True)
    monkeypatch.setattr(C, "environment", lambda: {"gpu": "stand-in"})  # environment() reads the GPU
    monkeypatch.setattr(C, "_deepgemm", lambda: pytest.fail("looked for DeepGEMM under --no-deepgemm"))
    dg, env = C.extension_env("sm90_cluster", no_deepgemm=True)
    assert dg is None and env == {"gpu": "stand-in", "deep_gemm": "absent: --no-deepgemm"}
    monkeypatch.setattr(C, "_deepgemm", lambda: (None, "not importable"))
    assert C.extension_env("sm90_cluster", no_deepgemm=False)[1]["deep_gemm"] == "absent: not importable"


def test_the_narrow_bench_reads_its_weight_shapes():
    from bench import sm90_narrow as N

    assert N.nk_pair("7168x2048") == (7168, 2048) and N.nk_pair("7168X16384") == (7168, 16384)
    for bad in ("7168", "7168x0", "axb", "1x2x3", "-1x128"):
        with pytest.raises(N.argparse.ArgumentTypeError, match="NxK|needs N, K >= 1"):
            N.nk_pair(bad)

