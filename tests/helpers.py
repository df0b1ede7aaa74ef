"""Shared test helpers: devices, poison, comparisons."""

import types

import pytest
import torch

DEVICES = [
    pytest.param("cpu", id="cpu"),
    pytest.param("cuda", id="cuda", marks=[pytest.mark.gpu]),
]


def poison_(t: torch.Tensor) -> torch.Tensor:
    """Fill with a value no kernel writes: NaN for floats, 0x7B7B... bytes otherwise."""
    if t.dtype.is_floating_point and t.element_size() > 1:
        t.fill_(float("nan"))
    else:
        t.view(torch.uint8).fill_(0x7B) if t.is_contiguous() and t.stride(-1) == 1 else t.fill_(0x7B)
    return t


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[t.element_size()])


def assert_bits_equal(got: torch.Tensor, want: torch.Tensor, what: str = ""):
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} != {want.dtype}"
    g, w = bits(got.contiguous().cpu()), bits(want.contiguous().cpu())
    bad = g != w
    assert not bad.any(), f"{what}: {int(bad.sum())} of {bad.numel()} differ; first at {bad.nonzero()[:3].tolist()}"


def assert_bf16_last_bit(got: torch.Tensor, ref: torch.Tensor):
    """got equals ref up to a flip of BF16's last bit (a regrouped FP32 sum rounded once more)."""
    diff = (got.float() - ref.float()).abs()
    assert (diff <= ref.float().abs() * 2**-7 + 1e-6).all(), float(diff.max())


def quantized_weights(w: torch.Tensor, fmt: str):
    """(b, sb) of BF16 weights [.., N, K] in a GEMM scale format: "fp32" (128x128 blocks),
    "fp32_rows" (the blocks' scales repeated per row) or "ue8m0" (packed, per row)."""
    from rtp_fp8.quant import block as B

    if fmt == "ue8m0":
        return B.quantize_weight_ue8m0_packed(w)
    b, sb = B.quantize_weight_blocks(w)
    if fmt == "fp32_rows":
        sb = sb.repeat_interleave(128, -2)[..., :w.shape[-2], :].contiguous()
    return b, sb


def dense_operands(m, n, k, seed, e=None, device="cuda"):
    """(a [M, K] with its 1x128 scales col_tma, b [N, K] (or [E, N, K]) with its 128x128 FP32 block scales):
    fresh random BF16 activations and weights (the weights scaled by 1/sqrt(K)), quantized."""
    from rtp_fp8.quant import block as B
    from rtp_fp8.quant import token_group as T

    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g).to(torch.bfloat16).to(device)
    w = (torch.randn(*((e,) if e else ()), n, k, generator=g) / k**0.5).to(torch.bfloat16).to(device)
    return (*T.per_token_group_quant(x, 128, scale_layout="col_tma"), *B.quantize_weight_blocks(w))


def masked_operands(e, mmax, n, k, fmt, device, seed):
    """(a [E, Mmax, K], its scales in the per-expert layout the masked executor hands over, b, sb in
    fmt as quantized_weights): fresh random BF16 activations and weights, quantized."""
    from rtp_fp8.quant import layout as L
    from rtp_fp8.quant import token_group as T

    g = torch.Generator().manual_seed(seed)
    x = torch.randn(e * mmax, k, generator=g).to(torch.bfloat16).to(device)
    layout = "ue8m0" if fmt == "ue8m0" else "col_tma"
    a, sa_flat = T.per_token_group_quant(x, 128, scale_layout=layout)
    sa = L.alloc_scales((e,), mmax, k // 128, layout, device)
    for i in range(e):
        sa[i].copy_(sa_flat[i * mmax:(i + 1) * mmax])
    w = (torch.randn(e, n, k, generator=g) / k**0.5).to(torch.bfloat16).to(device)
    return (a.view(e, mmax, k), sa, *quantized_weights(w, fmt))


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def _pybind(name, sig, impl=None):
    """A stand-in for a pybind11 function: no Python signature, the signature on __doc__'s first line."""

    class F:
        __doc__ = f"{name}({sig}) -> None\n\nDeepGEMM function."

        def __call__(self, *a, **kw):
            return impl(*a, **kw) if impl else None

    return F()


def fake_deep_gemm(version="2.6.1", drop=(), legacy_masked=False, theo_args=1, no_cast_kw=()):
    """A stand-in deep_gemm (CPU CI, version/argument variants). Defaults follow 2.6.1, whose
    get_theoretical_mk_alignment_for_contiguous_layout takes one argument (expected_m per group)."""
    m = types.ModuleType("deep_gemm")
    m.__version__ = version
    m.calls = []
    state = {"align": 128, "pdl": False}

    def rec(name):
        return lambda *a, **kw: m.calls.append((name, a, kw))

    gemm_sig = "a: tuple, b: tuple, d: torch.Tensor, c: Optional[torch.Tensor] = None, " \
               "recipe: Optional[tuple[int, int, int]] = None, compiled_dims: str = 'nk', " \
               "disable_ue8m0_cast: bool = False"
    for name, extra in (("fp8_gemm_nt", ""), ("m_grouped_fp8_gemm_nt_contiguous", "grouped_layout: torch.Tensor, "),
                        ("fp8_m_grouped_gemm_nt_masked" if legacy_masked else "m_grouped_fp8_gemm_nt_masked",
                         "masked_m: torch.Tensor, expected_m: int, ")):
        sig = gemm_sig.replace("d: torch.Tensor, ", "d: torch.Tensor, " + extra)
        if name in no_cast_kw:
            sig = sig.replace(", disable_ue8m0_cast: bool = False", "")
        setattr(m, name, _pybind(name, sig, rec(name)))
    m.get_mk_alignment_for_contiguous_layout = lambda: state["align"]
    m.set_mk_alignment_for_contiguous_layout = lambda v: state.__setitem__("align", v)
    m.get_pdl = lambda: state["pdl"]
    m.set_pdl = lambda v: state.__setitem__("pdl", v)
    m.transform_sf_into_required_layout = rec("transform_sf_into_required_layout")
    if theo_args == 2:
        m.get_theoretical_mk_alignment_for_contiguous_layout = _pybind(
            "get_theoretical_mk_alignment_for_contiguous_layout", "expected_m: int, num_groups: int",
            lambda e, g: 64 if e // g < 64 else 128)
    elif theo_args == 1:
        m.get_theoretical_mk_alignment_for_contiguous_layout = _pybind(
            "get_theoretical_mk_alignment_for_contiguous_layout", "expected_m: Optional[int] = None",
            lambda e: 64 if e < 64 else 128)
    m.get_paged_mqa_logits_metadata = rec("get_paged_mqa_logits_metadata")
    m.fp8_paged_mqa_logits = rec("fp8_paged_mqa_logits")
    m.fp8_mqa_logits = rec("fp8_mqa_logits")
    for n in drop:
        delattr(m, n)
    m.state = state
    return m


def real_deep_gemm():
    """The real deep_gemm's capabilities (GPU tests), or a skip naming what is missing."""
    from rtp_fp8.gemm import deepgemm as D

    if not torch.cuda.is_available():
        pytest.skip("the real DeepGEMM needs a CUDA GPU (none visible)")
    caps = D.capabilities()
    if not caps.available:
        pytest.skip(f"the real DeepGEMM is not usable here: {caps.reason} (./dev gpu-test builds it from "
                    "the pinned archive when one is at hand)")
    return caps


# ----------------------------------------------------------------------------- expert parallelism
# One case of tests/moe/test_dist.py and test_dist_multigpu.py: W ranks own EP_E experts each.
EP_H, EP_I, EP_E, EP_TOPK, EP_T = 128, 128, 2, 2, 6


def ep_weights(world, device):
    g = torch.Generator().manual_seed(1234)
    n = world * EP_E
    w_gate = (torch.randn(n, EP_I, EP_H, generator=g) * 0.05).to(device, torch.bfloat16)
    w_up = (torch.randn(n, EP_I, EP_H, generator=g) * 0.05).to(device, torch.bfloat16)
    w_down = (torch.randn(n, EP_H, EP_I, generator=g) * 0.05).to(device, torch.bfloat16)
    return w_gate, w_up, w_down


def ep_inputs(rank, world, device, case):
    g = torch.Generator().manual_seed(100 + rank)
    x = torch.randn(EP_T, EP_H, generator=g).to(device, torch.bfloat16)
    ids = torch.stack([torch.randperm(world * EP_E, generator=g)[:EP_TOPK] for _ in range(EP_T)])
    ids = ids.to(device, torch.int32)
    if case == "overflow":  # every token to rank 0's experts: more rows than its slot block holds
        ids = torch.stack([torch.randperm(EP_E, generator=g)[:EP_TOPK] for _ in range(EP_T)]).to(device, torch.int32)
    if case == "invalid" and rank == world - 1:
        ids[0, 0], ids[3, 1] = -1, world * EP_E + 3
    w = torch.softmax(torch.randn(EP_T, EP_TOPK, generator=g), dim=-1).to(device)
    return x, ids, w


def ep_check_rank(rank, world, mode, case, device, capacity=None):
    """Rank `rank`'s EPMoE output against a single-process FP8 MoE over all experts (same routing)
    and the BF16 MoE; its counters against what it saw."""
    from rtp_fp8.arch import Arch
    from rtp_fp8.moe import dist as D
    from rtp_fp8.moe import executors as X

    arch = Arch(9, 0) if device == "cpu" else None
    w_gate, w_up, w_down = ep_weights(world, device)
    sl = slice(rank * EP_E, (rank + 1) * EP_E)
    local = X.QuantizedExperts.from_bf16(w_gate[sl], w_up[sl], w_down[sl], arch)
    ep = D.EPMoE(local, max_tokens=EP_T, topk=EP_TOPK, mode=mode, capacity=capacity)
    x, ids, w = ep_inputs(rank, world, device, case)
    y = ep(x, ids, w)

    # the single-process FP8 MoE over all experts, same routing (invalid ids skipped and counted)
    full = X.ContiguousExecutor(X.QuantizedExperts.from_bf16(w_gate, w_up, w_down, arch), EP_T, EP_TOPK)
    want = full(x, ids, w)
    ref = X.moe_reference(x, ids.long().clamp(-1, world * EP_E), w, w_gate, w_up, w_down)
    counters = ep.read_counters()
    n_invalid = int(((ids < 0) | (ids >= world * EP_E)).sum())
    assert counters["invalid_ids"] == n_invalid, (rank, counters)
    assert full.read_counters()["invalid_ids"] == n_invalid
    if case == "overflow":
        owner = torch.where((ids >= 0) & (ids < world * EP_E), ids.long() // EP_E, -1)
        need = (owner[:, :, None] == torch.arange(world, device=device)).any(1)
        slot = need.int().cumsum(0) - 1
        lost = need & (slot >= capacity)
        assert counters["overflow"] == int(lost.sum()), (rank, counters)
        kept = ~lost.any(1)  # tokens whose every destination had room are whole
        assert rel_l2(y[kept].float(), want[kept].float()) < 1e-2
        return
    assert counters["overflow"] == 0
    # bf16 rounding of each rank's partial sum is the only difference from the single-process FP8 MoE
    assert rel_l2(y.float(), want.float()) < 1e-2, (rank, rel_l2(y.float(), want.float()))
    assert rel_l2(y.float(), ref.float()) < 0.08  # FP8 noise against the BF16 MoE




def spy_ws_pdls(monkeypatch) -> list:
    """The pdl argument of every sm90_ws.launch the dispatch (block_scaled) makes from now on, in order (the
    launch itself runs as before); a launch without the argument is a KeyError."""
    from rtp_fp8.gemm.triton import block_scaled as G

    pdls, launch = [], G.sm90_ws.launch

    def spy(*args, **kwargs):
        pdls.append(kwargs["pdl"])
        return launch(*args, **kwargs)

    monkeypatch.setattr(G.sm90_ws, "launch", spy)
    return pdls
