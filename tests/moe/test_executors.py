"""MoE executors end to end, contiguous and masked, for FP32 (SM90) and packed UE8M0 (SM120)
scales: vs an FP8-emulating oracle (the same quantized operands, float math: relative L2
<= 5e-3, bf16 rounding) and vs the BF16 MoE oracle (relative L2 <= 0.08: FP8 activations
twice and FP8 weights, measured ~0.064). Plus the strategy, counters, early free and bad
input; CUDA-graph capture/replay on the GPU."""

import logging

import pytest
import torch

from helpers import DEVICES, rel_l2
from rtp_fp8 import arch as A
from rtp_fp8.gemm import reference as GR
from rtp_fp8.moe import ep_kernels as K
from rtp_fp8.moe import executors as X
from rtp_fp8.quant import reference as R

E, H, INTER, TOPK = 4, 256, 256, 2


def _weights(device, seed=0):
    g = torch.Generator().manual_seed(seed)
    wg = (torch.randn(E, INTER, H, generator=g) / H**0.5).to(torch.bfloat16).to(device)
    wu = (torch.randn(E, INTER, H, generator=g) / H**0.5).to(torch.bfloat16).to(device)
    wd = (torch.randn(E, H, INTER, generator=g) / INTER**0.5).to(torch.bfloat16).to(device)
    return wg, wu, wd


def _fp8_emulated(ex, x, ids, w, e_off=0):
    pow2 = ex.arch.scale_format == "ue8m0"
    q = ex.experts
    w13, w2 = GR.dequant_b(q.w13, q.w13_scales).float(), GR.dequant_b(q.w2, q.w2_scales).float()
    qx, sx = R.per_token_group_quant_ref(x.cpu(), 128, pow2=pow2)
    xdq = R.group_dequant_ref(qx, sx, 128)
    out = torch.zeros(x.shape)
    ids, w = ids.cpu(), w.cpu()
    for e in range(ex.e):
        rows, slot = (ids == e + e_off).nonzero(as_tuple=True)
        if rows.numel() == 0:
            continue
        gu = (xdq[rows] @ w13[e].t()).to(torch.bfloat16).float()
        act = (torch.nn.functional.silu(gu[:, :INTER]) * gu[:, INTER:]).to(torch.bfloat16)
        qa, sa = R.per_token_group_quant_ref(act, 128, pow2=pow2)
        y = (R.group_dequant_ref(qa, sa, 128) @ w2[e].t()).to(torch.bfloat16).float()
        out.index_add_(0, rows, y * w[rows, slot, None])
    return out


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("arch", [A.Arch(9, 0), A.Arch(12, 0)], ids=str)
def test_contiguous_executor_matches_bf16_reference(device, arch):
    wg, wu, wd = _weights(device)
    ex = X.ContiguousExecutor(X.QuantizedExperts.from_bf16(wg, wu, wd, arch), max_tokens=24, topk=TOPK, alignment=64)
    assert ex.cap == K.workspace_rows(24 * TOPK, E, 64) == 320  # from shapes only: ceil((48 + 4 * 63) / 64) * 64
    g = torch.Generator().manual_seed(3)
    for t in (24, 5):  # the same workspace serves smaller batches
        x = torch.randn(t, H, generator=g).to(torch.bfloat16).to(device)
        logits = torch.randn(t, E, generator=g)
        w, ids = torch.softmax(logits, -1).topk(TOPK, dim=-1)
        ids = ids.to(torch.int32)
        ids[0, 1] = -1  # an invalid route is skipped and counted
        y = ex(x, ids.to(device), w.to(device))
        ref = X.moe_reference(x, ids.to(device), w.to(device), wg, wu, wd)
        assert not torch.isnan(y).any()
        assert rel_l2(y.cpu(), _fp8_emulated(ex, x, ids, w)) <= 5e-3
        assert rel_l2(y.cpu(), ref.cpu()) <= 0.08
    assert ex.counters.cpu().tolist() == [2, 0]
    assert ex.read_counters() == {"invalid_ids": 2, "overflow": 0}


def _route(t, n_global, device, seed):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(t, n_global, generator=g)
    w, ids = torch.softmax(logits, -1).topk(TOPK, dim=-1)
    return ids.to(torch.int32).to(device), w.to(device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("arch", [A.Arch(9, 0), A.Arch(12, 0)], ids=str)
@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "deterministic"])
def test_masked_executor_with_ep_offset(device, arch, deterministic):
    """This rank owns experts [4, 8) of 8: other ranks' ids are skipped, not counted."""
    wg, wu, wd = _weights(device)
    experts = X.QuantizedExperts.from_bf16(wg, wu, wd, arch)
    ex = X.MaskedExecutor(experts, max_tokens=6, topk=TOPK, expert_offset=4, num_global_experts=8,
                          deterministic=deterministic)
    g = torch.Generator().manual_seed(4)
    x = torch.randn(6, H, generator=g).to(torch.bfloat16).to(device)
    ids, w = _route(6, 8, device, seed=5)
    y = ex(x, ids, w)
    ref = X.moe_reference(x, ids, w, wg, wu, wd, expert_offset=4)
    # 2e-2, not 5e-3: with 5 routed tokens, the few bf16 gate_up roundings where the GPU's
    # accumulation order differs from the oracle's flip fp8 roundings of the requantized
    # activation (one flip moves an element by 6-12%); measured 1.2e-2 on the H200, 1.6e-3 on CPU.
    assert rel_l2(y.cpu(), _fp8_emulated(ex, x, ids, w, e_off=4)) <= 2e-2
    assert rel_l2(y.cpu(), ref.cpu()) <= 0.08
    assert ex.read_counters() == {"invalid_ids": 0, "overflow": 0}


@pytest.mark.parametrize("device", DEVICES)
def test_masked_overflow_is_counted_and_logged(device, caplog):
    wg, wu, wd = _weights(device)
    ex = X.MaskedExecutor(X.QuantizedExperts.from_bf16(wg, wu, wd, A.Arch(9, 0)), max_tokens=5, topk=TOPK, max_m=2,
                          deterministic=True)
    x = torch.randn(5, H, generator=torch.Generator().manual_seed(105)).to(torch.bfloat16).to(device)
    ids = torch.tensor([[1, 2]] * 5, dtype=torch.int32, device=device)  # 5 tokens on experts 1 and 2, room for 2
    ids[4, 1] = 77  # invalid
    w = torch.full((5, TOPK), 0.5, device=device)
    with caplog.at_level(logging.WARNING, logger="rtp_fp8.moe.executors"):
        y = ex(x, ids, w)
        if device == "cuda":  # eager polling reads the previous call's copy: a second call reports the first
            torch.cuda.synchronize()
            ex(x, ids, w)
    per_call = {"invalid_ids": 1, "overflow": 5}  # expert 1: 5 rows, 3 dropped; expert 2: 4 rows, 2 dropped
    calls = 2 if device == "cuda" else 1
    assert ex.read_counters() == {k: v * calls for k, v in per_call.items()}
    assert "dropped routes: 1 invalid expert ids, 5 overflowed rows" in caplog.text
    ref = X.moe_reference(x[:2], ids[:2], w[:2], wg, wu, wd)  # in token order, the first two keep both routes
    assert rel_l2(y[:2].cpu(), ref.cpu()) <= 0.08
    assert torch.equal(y[2:].cpu(), torch.zeros(3, H, dtype=torch.bfloat16))  # every route of tokens 2..4 dropped


def test_strategy_picks_logs_once_and_obeys_the_switch(monkeypatch, caplog):
    monkeypatch.delenv(X.EXECUTOR_ENV, raising=False)
    monkeypatch.setattr(X, "_logged", set())
    with caplog.at_level(logging.INFO, logger="rtp_fp8.moe.executors"):
        assert X.choose(A.Arch(9, 0), 16).executor == "masked"
        assert X.choose(A.Arch(9, 0), 16).executor == "masked"
        assert X.choose(A.Arch(9, 0), 4096, graph=True).executor == "contiguous"
        c = X.choose(A.Arch(12, 0), 2, graph=True)
    assert (c.executor, c.gemm_backend) == ("masked", "triton")
    assert caplog.text.count("sm90 eager: masked executor") == 1
    assert "sm120: DeepGEMM bypassed: DeepGEMM has no kernels for sm120" in caplog.text
    assert "sm90: DeepGEMM bypassed: the MoE executors run the Triton grouped GEMMs" in caplog.text
    monkeypatch.setenv(X.EXECUTOR_ENV, "contiguous")  # rollback switch, CUDA graphs kept
    with caplog.at_level(logging.INFO, logger="rtp_fp8.moe.executors"):
        c = X.choose(A.Arch(12, 0), 2, graph=True)
    assert c.executor == "contiguous" and c.reason == f"forced by {X.EXECUTOR_ENV}"
    assert f"forced by {X.EXECUTOR_ENV}: contiguous instead of masked for 2 tokens" in caplog.text
    assert X.choose(A.Arch(9, 0), 4096, executor="masked").executor == "masked"
    monkeypatch.setenv(X.EXECUTOR_ENV, "fast")
    with pytest.raises(ValueError, match=r"executor \(RTP_FP8_MOE_EXECUTOR\) must be one of"):
        X.choose(A.Arch(9, 0), 8)


def test_fp8moe_dispatches_by_batch_size():
    wg, wu, wd = _weights("cpu")
    moe = X.FP8MoE(X.QuantizedExperts.from_bf16(wg, wu, wd, A.Arch(9, 0)), max_tokens=8, topk=TOPK,
                   masked_max_tokens=2)
    for t, kind in ((2, "masked"), (5, "contiguous")):
        # seeded: drawn from the global generator the error depended on the tests run before
        # (0.052-0.072 over 60 seeds, once 0.0801 in a fresh-clone CI run)
        x = torch.randn(t, H, generator=torch.Generator().manual_seed(100 + t)).to(torch.bfloat16)
        ids, w = _route(t, E, "cpu", seed=t)
        y = moe(x, ids, w)
        assert rel_l2(y, X.moe_reference(x, ids, w, wg, wu, wd)) <= 0.08
        assert kind in moe._executors
    moe_forced = X.FP8MoE(moe.experts, max_tokens=8, topk=TOPK, masked_max_tokens=2, executor="masked")
    with pytest.raises(ValueError, match="more than the masked executor's max_tokens=2"):
        moe_forced(torch.randn(5, H).to(torch.bfloat16), *_route(5, E, "cpu", seed=1))


def test_consume_input_frees_the_activation_in_eager_mode():
    wg, wu, wd = _weights("cpu")
    ex = X.ContiguousExecutor(X.QuantizedExperts.from_bf16(wg, wu, wd, A.Arch(9, 0)), max_tokens=4, topk=TOPK)
    x = torch.randn(4, H).to(torch.bfloat16)
    keep = x.clone()
    ids, w = _route(4, E, "cpu", seed=9)
    y = ex(x, ids, w, consume_input=True)
    assert x.untyped_storage().size() == 0
    assert torch.equal(y, ex(keep, ids, w))


def test_executor_bad_input():
    wg, wu, wd = _weights("cpu")
    with pytest.raises(ValueError, match="w_down must be"):
        X.QuantizedExperts.from_bf16(wg, wu, wd[:, :128], A.Arch(9, 0))
    q = X.QuantizedExperts.from_bf16(wg, wu, wd, A.Arch(9, 0))
    with pytest.raises(ValueError, match="w2_scales must be 3-D with 4 experts"):
        X.QuantizedExperts(q.w13, q.w13_scales, q.w2, q.w2_scales[:3], q.arch)
    with pytest.raises(ValueError, match="w2 must be"):
        X.QuantizedExperts(q.w13, q.w13_scales, q.w2[:3], q.w2_scales[:3], q.arch)
    with pytest.raises(ValueError, match="w13_scales must be torch.int32 for sm120"):
        X.QuantizedExperts(q.w13, q.w13_scales, q.w2, q.w2_scales, A.Arch(12, 0))
    with pytest.raises(ValueError, match=r"w2_scales must have shape \(4, 2, 2\) \(128x128 blocks\) or "
                       r"\(4, 256, 2\) \(per row\) for N=256, K=256"):
        X.QuantizedExperts(q.w13, q.w13_scales, q.w2, q.w2_scales[:, :, :1], q.arch)
    u = X.QuantizedExperts.from_bf16(wg, wu, wd, A.Arch(12, 0))
    with pytest.raises(ValueError,
                       match=r"w13_scales must have shape \(4, 512, 1\) \(packed UE8M0 per row\) for N=512, K=256"):
        X.QuantizedExperts(u.w13, u.w13_scales[:, :128], u.w2, u.w2_scales, u.arch)
    with pytest.raises(ValueError, match="w2_scales is on meta, w2 on cpu"):
        X.QuantizedExperts(q.w13, q.w13_scales, q.w2, q.w2_scales.to("meta"), q.arch)
    with pytest.raises(ValueError, match="multiples of the quant group 512"):
        X.ContiguousExecutor(q, 8, TOPK, group=512)
    with pytest.raises(ValueError, match="alignment must be a power of two"):
        X.ContiguousExecutor(q, 8, TOPK, alignment=96)
    ex = X.ContiguousExecutor(q, 8, TOPK)
    x = torch.randn(9, H, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="more than max_tokens=8"):
        ex(x, torch.zeros(9, TOPK, dtype=torch.int32), torch.ones(9, TOPK))
    with pytest.raises(ValueError, match="topk_ids must be"):
        ex(x[:4], torch.zeros(4, 3, dtype=torch.int32), torch.ones(4, 3))
    with pytest.raises(ValueError, match="topk_ids must be an int32 or int64 tensor"):
        ex(x[:4], torch.zeros(4, TOPK), torch.ones(4, TOPK))
    with pytest.raises(ValueError, match=r"x must be \[tokens, H=256\]"):
        ex(x[:4, :128], torch.zeros(4, TOPK, dtype=torch.int32), torch.ones(4, TOPK))
    with pytest.raises(ValueError, match="topk_weights must be"):
        ex(x[:4], torch.zeros(4, TOPK, dtype=torch.int32), torch.ones(4, 1))


def _hostile(real, unspecified_rows, poisoned):
    """A grouped GEMM that meets only the backend contract: after the real kernel, the rows the
    contract leaves unspecified (past masked_m; -1 padding rows) are overwritten with garbage, as
    DeepGEMM may leave them (it writes whole row tiles past masked_m and never writes -1 rows)."""
    def gemm(*args, out=None, **kw):
        out = real(*args, out=out, **kw)
        rows = unspecified_rows(args).to(out.device)
        out[rows] = float("nan")
        poisoned.append(int(rows.sum()))
        return out

    return gemm


def _past_masked_m(args):
    masked_m, e, mmax = args[4].cpu(), args[0].shape[0], args[0].shape[1]
    return torch.arange(mmax)[None, :].expand(e, mmax) >= masked_m[:, None]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["contiguous", "masked"])
def test_executors_never_read_rows_the_gemm_contract_leaves_unspecified(device, kind, monkeypatch):
    """Run once with the Triton GEMMs, once with GEMMs that write NaN into every unspecified row:
    the executor's output is bit-identical, so no later step (SiLU*mul+quant, the down GEMM, the
    gather) depends on those rows."""
    wg, wu, wd = _weights(device, seed=5)
    experts = X.QuantizedExperts.from_bf16(wg, wu, wd, A.Arch(9, 0))
    make = (lambda: X.ContiguousExecutor(experts, max_tokens=16, topk=TOPK, alignment=32)) if kind == "contiguous" \
        else (lambda: X.MaskedExecutor(experts, max_tokens=16, topk=TOPK))
    g = torch.Generator().manual_seed(11)
    x = torch.randn(13, H, generator=g).to(torch.bfloat16).to(device)
    w, ids = torch.softmax(torch.randn(13, E, generator=g), -1).topk(TOPK, dim=-1)
    w, ids = w.to(device), ids.to(torch.int32).to(device)
    honest = make()(x, ids, w)
    assert not torch.isnan(honest).any()
    poisoned = []
    if kind == "contiguous":
        real = X.G.m_grouped_fp8_gemm_nt_contiguous
        monkeypatch.setattr(X.G, "m_grouped_fp8_gemm_nt_contiguous",
                            _hostile(real, lambda args: (args[4] == -1).cpu(), poisoned))
    else:
        real = X.G.m_grouped_fp8_gemm_nt_masked
        monkeypatch.setattr(X.G, "m_grouped_fp8_gemm_nt_masked", _hostile(real, _past_masked_m, poisoned))
    hostile = make()(x, ids, w)
    assert len(poisoned) == 2 and min(poisoned) > 0  # both GEMMs ran, each with unspecified rows to poison
    assert torch.equal(hostile.view(torch.int16), honest.view(torch.int16))
