"""The DeepGEMM wrapper: capability probing by introspection, the version gate, explicit
disable_ue8m0_cast, the mk-alignment context (restore after injected failures, read-back
check, concurrent threads) and the version-dependent argument shapes.

Stand-in modules (helpers.fake_deep_gemm) cover CPU CI and the version/argument variants no
single real build can show; the gpu-marked tests at the end run the same surfaces against the
real library (built by `./dev gpu-test` from the archive pinned in deps/toolchains.toml)."""

import logging
import threading
import time

import pytest
import torch

from helpers import fake_deep_gemm as fake
from helpers import real_deep_gemm, rel_l2
from rtp_fp8 import arch as A
from rtp_fp8.gemm import deepgemm as D


def test_probe_full_module():
    caps = D.probe(fake())
    assert caps.available and caps.version == "2.6.1" and caps.masked_name == "m_grouped_fp8_gemm_nt_masked"
    assert caps.theoretical_alignment_args == 1 and caps.paged_mqa and caps.mqa_logits  # 2.6.1: one argument
    assert D.probe(fake(legacy_masked=True)).masked_name == "fp8_m_grouped_gemm_nt_masked"
    assert D.parameters(fake().fp8_gemm_nt)[-1] == "disable_ue8m0_cast"


@pytest.mark.parametrize(
    "mod,reason",
    [
        (None, "deep_gemm is not installed"),
        (fake("2.1.1"), "deep_gemm 2.1.1 is older than the minimum 2.2.0"),
        (fake("2.3.0", drop=("set_mk_alignment_for_contiguous_layout",)), "lacks set_mk_alignment_for_contiguous"),
        (fake(drop=("m_grouped_fp8_gemm_nt_masked",)), "lacks m_grouped_fp8_gemm_nt_masked"),
        (fake(no_cast_kw=("fp8_gemm_nt",)), "fp8_gemm_nt has no disable_ue8m0_cast parameter"),
    ],
    ids=["absent", "too-old", "no-set-alignment", "no-masked", "no-cast-flag"],
)
def test_missing_capability_is_not_selected(mod, reason):
    caps = D.probe(mod)
    assert not caps.available and reason in caps.reason
    ok, why = D.supports(A.Arch(9, 0), caps)
    assert not ok and reason in why
    with pytest.raises(RuntimeError, match="DeepGEMM backend unavailable"):
        D.fp8_gemm_nt(None, None, None, None, None, A.Arch(9, 0), caps=caps)


def test_reason_logged_once(monkeypatch, caplog):
    monkeypatch.setattr(D, "_import", lambda: fake("2.0.0"))
    D.capabilities.cache_clear()
    try:
        with caplog.at_level(logging.INFO, logger="rtp_fp8.gemm.deepgemm"):
            for _ in range(3):
                assert not D.capabilities().available
        assert caplog.text.count("DeepGEMM backend not selected: deep_gemm 2.0.0 is older") == 1
    finally:
        D.capabilities.cache_clear()


def test_sm120_not_served_by_mainline():
    ok, why = D.supports(A.Arch(12, 0), D.probe(fake()))
    assert not ok and "no kernels for sm120" in why


@pytest.mark.parametrize("arch,flag", [(A.Arch(9, 0), True), (A.Arch(10, 0), False), (A.Arch(12, 0), False)],
                         ids=str)
def test_disable_ue8m0_cast_passed_explicitly(arch, flag):
    m = fake()
    caps = D.probe(m)
    D.fp8_gemm_nt("a", "sa", "b", "sb", "out", arch, caps)
    D.m_grouped_fp8_gemm_nt_contiguous("a", "sa", "b", "sb", "mi", "out", arch, caps)
    D.m_grouped_fp8_gemm_nt_masked("a", "sa", "b", "sb", "mm", 7, "out", arch, caps)
    D.transform_sf("sf", 128, 512, (1, 128, 128), arch, caps=caps)
    assert [c[0] for c in m.calls] == ["fp8_gemm_nt", "m_grouped_fp8_gemm_nt_contiguous",
                                       "m_grouped_fp8_gemm_nt_masked", "transform_sf_into_required_layout"]
    assert all(c[2]["disable_ue8m0_cast"] is flag for c in m.calls)
    assert m.calls[1][1] == (("a", "sa"), ("b", "sb"), "out", "mi")  # grouped layout positional (renamed in 2.2)
    assert m.calls[2][1][-1] == 7


def test_mk_alignment_sets_and_restores():
    m = fake()
    caps = D.probe(m)
    with D.mk_alignment(64, caps) as v:
        assert v == 64 and m.get_mk_alignment_for_contiguous_layout() == 64
    assert m.state["align"] == 128


def test_mk_alignment_restores_after_body_raises():
    m = fake()
    caps = D.probe(m)
    with pytest.raises(KeyError):
        with D.mk_alignment(32, caps):
            raise KeyError("injected")
    assert m.state["align"] == 128


def test_pdl_launches_sets_and_restores_even_when_the_body_raises():
    m = fake()
    caps = D.probe(m)
    with D.pdl_launches(caps):
        assert m.get_pdl() is True
    assert m.state["pdl"] is False
    with pytest.raises(KeyError):
        with D.pdl_launches(caps):
            raise KeyError("injected")
    assert m.state["pdl"] is False


def test_pdl_launches_refuses_a_deepgemm_without_set_pdl():
    m = fake(drop=("set_pdl",))
    with pytest.raises(RuntimeError, match="has no set_pdl"):
        with D.pdl_launches(D.probe(m)):
            pytest.fail("the body ran")
    assert m.state["pdl"] is False


def test_mk_alignment_restores_after_set_raises_and_checks_read_back():
    m = fake()
    caps = D.probe(m)

    def bad_set(v):
        m.state["align"] = 96  # a partial write, then the failure
        raise RuntimeError("injected set failure")

    good_set = m.set_mk_alignment_for_contiguous_layout
    m.set_mk_alignment_for_contiguous_layout = lambda v: bad_set(v) if v != 128 else good_set(v)
    with pytest.raises(RuntimeError, match="injected set failure"):
        with D.mk_alignment(64, caps):
            pytest.fail("body must not run")
    assert m.state["align"] == 128
    m.set_mk_alignment_for_contiguous_layout = lambda v: good_set(v if v == 128 else v * 2)  # a silent clamp
    with pytest.raises(RuntimeError, match="read back 128 after setting 64"):
        with D.mk_alignment(64, caps):
            pytest.fail("body must not run")
    assert m.state["align"] == 128
    with pytest.raises(ValueError, match="value must be a positive int"):
        with D.mk_alignment(0, caps):
            pass


def _hammer_mk_alignment(caps, values, rounds, pause):
    """Threads setting different alignments at once: each body must see its own; -> the errors."""
    dg, errors = caps.module, []

    def worker(v):
        for _ in range(rounds):
            with D.mk_alignment(v, caps):
                time.sleep(pause)
                if dg.get_mk_alignment_for_contiguous_layout() != v:
                    errors.append(v)

    threads = [threading.Thread(target=worker, args=(v,)) for v in values]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


def test_mk_alignment_is_safe_under_concurrent_threads():
    m = fake()
    assert _hammer_mk_alignment(D.probe(m), (16, 32, 64, 256), 20, 0.0005) == [] and m.state["align"] == 128


def test_theoretical_alignment_follows_the_signature():
    assert D.theoretical_mk_alignment(256, 8, D.probe(fake(theo_args=2))) == 64
    assert D.theoretical_mk_alignment(256, 8, D.probe(fake(theo_args=1))) == 64  # per group: 32 rows
    assert D.theoretical_mk_alignment(4096, 8, D.probe(fake(theo_args=1))) == 128
    assert D.theoretical_mk_alignment(4096, 8, D.probe(fake(theo_args=0))) == 128  # the current alignment


def test_context_lens_and_kv_scale_shapes_by_version():
    lens = torch.tensor([5, 9], dtype=torch.int32)
    assert D.context_lens_for(lens, 1, "2.1.1").shape == (2,)
    assert D.context_lens_for(lens, 2, "2.3.0").tolist() == [[5, 5], [9, 9]]
    assert D.context_lens_for(lens[:, None], 1, "2.6.1").shape == (2, 1)
    with pytest.raises(ValueError, match="takes 1-D context_lens only"):
        D.context_lens_for(torch.ones(2, 2, dtype=torch.int32), 2, "2.1.1")
    with pytest.raises(ValueError, match="context_lens must be int32"):
        D.context_lens_for(lens.long(), 1, "2.6.1")
    s = torch.rand(7)
    assert D.kv_scale_for(s, "2.4.2").shape == (7, 1) and D.kv_scale_for(s[:, None], "2.5.0").shape == (7,)
    with pytest.raises(ValueError, match="kv_scale must be"):
        D.kv_scale_for(torch.rand(7, 2), "2.6.1")


def test_paged_mqa_calls_use_the_normalized_shapes():
    m = fake("2.4.2")
    caps = D.probe(m)
    lens = torch.tensor([5, 9], dtype=torch.int32)
    D.paged_mqa_logits_metadata(lens, 1, 64, 132, caps)
    q = torch.zeros(2, 1, 32, 128)
    D.fp8_paged_mqa_logits(q, "kv", "w", lens, "bt", "meta", 1024, caps)
    D.fp8_mqa_logits("q", "kv", torch.rand(7), "w", "ks", "ke", caps)
    (_, meta_args, _), (_, logit_args, logit_kw), (_, mqa_args, _) = m.calls
    assert meta_args[0].shape == (2, 1) and logit_args[3].shape == (2, 1) and logit_kw["clean_logits"] is False
    assert mqa_args[1][1].shape == (7, 1)  # 2.4.2: [N, 1]


def test_device_gate_names_both_archs(monkeypatch):
    """An Arch whose DeepGEMM kernels the GPU cannot run is never offered (DeepGEMM would assert in C++)."""
    caps = D.probe(fake())
    assert D.supports(A.Arch(9, 0), caps, device="cpu") == (False, "DeepGEMM runs on CUDA tensors, got a cpu tensor")
    monkeypatch.setattr(D.A, "detect", lambda device=None: A.Arch(9, 0))  # an SM90 GPU, seen through arch.py
    ok, why = D.supports(A.Arch(10, 0), caps, device="cuda:0")
    assert not ok and "DeepGEMM's sm100 kernels cannot run on this GPU (sm90)" in why
    assert D.supports(A.Arch(9, 0), caps, device="cuda:0") == (True, "")


# ----------------------------------------------------------------------------- the real library


@pytest.mark.gpu
def test_real_probe_accepts_the_library():
    caps = real_deep_gemm()
    dg = caps.module
    assert D.parse_version(caps.version) >= D.parse_version(D.MIN_VERSION)
    assert caps.masked_name in D.MASKED_NAMES
    for name in ("fp8_gemm_nt", "m_grouped_fp8_gemm_nt_contiguous", caps.masked_name):
        assert "disable_ue8m0_cast" in D.parameters(getattr(dg, name)), name  # read from pybind11's __doc__
    want = len(D.parameters(dg.get_theoretical_mk_alignment_for_contiguous_layout))
    assert caps.theoretical_alignment_args == min(want, 2)


@pytest.mark.gpu
def test_real_theoretical_alignment():
    caps = real_deep_gemm()
    fn = caps.module.get_theoretical_mk_alignment_for_contiguous_layout
    for expected_m, groups in ((256, 8), (4096, 32), (7, 1)):
        got = D.theoretical_mk_alignment(expected_m, groups, caps)
        per_group = -(-expected_m // groups)
        assert got == (fn(expected_m, groups) if caps.theoretical_alignment_args == 2 else fn(per_group))
        assert got % 16 == 0 and got >= 16


@pytest.mark.gpu
def test_real_mk_alignment_under_concurrent_threads():
    caps = real_deep_gemm()
    original = caps.module.get_mk_alignment_for_contiguous_layout()
    assert _hammer_mk_alignment(caps, (32, 64, 128, 256), 50, 0.0002) == []
    assert caps.module.get_mk_alignment_for_contiguous_layout() == original


@pytest.mark.gpu_sm90
def test_real_transform_sf_matches_our_layout():
    """DeepGEMM's own SM90 layout transform of row-major FP32 1x128 scales equals ours (col_tma), bit for bit."""
    caps = real_deep_gemm()
    from rtp_fp8.quant import layout as L

    for mn, k in ((7, 512), (300, 1024), (4096, 7168)):
        sf = torch.rand(mn, k // 128, device="cuda") + 0.01
        got = D.transform_sf(sf, mn, k, (1, 1, 128), A.Arch(9, 0), is_sfa=True, caps=caps)
        want = L.to_layout(sf, "col_tma")
        assert got.shape == want.shape and got.stride() == want.stride(), (got.stride(), want.stride())
        assert torch.equal(got, want)


@pytest.mark.gpu
def test_real_paged_mqa_metadata_takes_our_context_lens():
    """1-D context lengths (one per sequence) normalized to the 2-D form 2.6.1 asserts on."""
    caps = real_deep_gemm()
    lens = torch.randint(1, 4000, (5,), dtype=torch.int32, device="cuda")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    meta = D.paged_mqa_logits_metadata(lens, 2, 64, sms, caps)
    assert meta.shape == (sms + 1, 2) and meta.dtype == torch.int32


@pytest.mark.gpu_sm90
def test_real_ragged_mqa_logits_take_our_kv_scale():
    """fp8_mqa_logits with the KV scale as [N] or [N, 1] (normalized per version) vs a float reference:
    logits[i, j] = sum_h relu(q[i, h] . kv[j] * scale[j]) * w[i, h] for ks[i] <= j < ke[i]."""
    caps = real_deep_gemm()
    g = torch.Generator(device="cuda").manual_seed(0)
    s, skv, h, d = 64, 256, 32, 64
    q = torch.randn(s, h, d, device="cuda", generator=g).to(torch.float8_e4m3fn)
    kv_f = torch.randn(skv, d, device="cuda", generator=g)
    scale = kv_f.abs().amax(-1) / 448
    kv = (kv_f / scale[:, None]).to(torch.float8_e4m3fn)
    w = torch.rand(s, h, device="cuda", generator=g)
    ks = torch.zeros(s, dtype=torch.int32, device="cuda")
    ke = torch.arange(s, dtype=torch.int32, device="cuda") + (skv - s) + 1
    for sc in (scale, scale[:, None]):
        logits = D.fp8_mqa_logits(q, kv, sc, w, ks, ke, caps)
        ref = torch.einsum("shd,nd->shn", q.float(), kv.float() * scale[:, None]).relu()
        ref = (ref * w[:, :, None]).sum(1)
        j = torch.arange(skv, device="cuda")
        inside = (j[None, :] >= ks[:, None]) & (j[None, :] < ke[:, None])
        assert rel_l2(logits[inside], ref[inside]) <= 1e-2
