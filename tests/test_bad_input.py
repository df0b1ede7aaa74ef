"""Bad and edge input through every public entry point, as a table: each case is an input class x
entry point with its expected outcome, either an error naming the argument (ValueError/TypeError
matching the regex, raised before anything launches) or a result checked against the oracle.
Plus hypothesis property tests where inputs have a space worth searching.

    PYTHONPATH=.:tests python3 -c "import test_bad_input as t; t.print_table()"   # docs/bad_input.md

CLI cases (smoke, ./dev) live beside their tools (tests/smoke/test_smoke_gate.py,
tests/tools/test_dev_cli.py) and are listed in the docs table too.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import assert_bits_equal, poison_, rel_l2
from rtp_fp8 import arch as A
from rtp_fp8.gemm import backends as BK
from rtp_fp8.gemm import reference as GR
from rtp_fp8.gemm.triton import block_scaled as G
from rtp_fp8.loader import online_fp8 as LD
from rtp_fp8.moe import ep_kernels as K
from rtp_fp8.moe import executors as X
from rtp_fp8.quant import block as B
from rtp_fp8.quant import layout as L
from rtp_fp8.quant import reference as R
from rtp_fp8.quant import token_group as T
from rtp_fp8.quant import ue8m0


def _x(m=4, k=256, seed=0, dtype=torch.bfloat16):
    return torch.randn(m, k, generator=torch.Generator().manual_seed(seed)).to(dtype)


def _w(n=256, k=256, seed=1):
    return (torch.randn(n, k, generator=torch.Generator().manual_seed(seed)) / 16).to(torch.bfloat16)


def _gemm_operands(m=8, n=256, k=256, e=None):
    a, sa = T.per_token_group_quant(_x(m * (e or 1), k), 128, scale_layout="col_tma")
    b, sb = B.quantize_weight_blocks(torch.stack([_w(n, k, s) for s in range(e)]) if e else _w(n, k))
    return a, sa, b, sb


def _meta(shape, dtype=torch.bfloat16):
    return torch.empty(shape, dtype=dtype, device="meta")


# ----------------------------------------------------------------------------- oracle checks


def _zero_group_matches_oracle():
    x = _x(3, 256)
    x[1, :128] = 0  # an all-zero group: scale eps / 448, values 0
    q, s = T.per_token_group_quant(x, 128)
    qr, sr = R.per_token_group_quant_ref(x, 128)
    assert_bits_equal(q, qr)
    assert_bits_equal(s, sr)
    assert float(s[1, 0]) > 0


def _empty_rows():
    q, s = T.per_token_group_quant(_x(0, 256), 128, scale_layout="ue8m0")
    assert q.shape == (0, 256) and s.shape == (0, 1)


def _ue8m0_reused_buffer_padding_zeroed():
    x = _x(5, 512)  # 5 rows: rows 5..7 of each column are padding words
    q = torch.empty(5, 512, dtype=torch.float8_e4m3fn)
    scales = L.alloc_scales((), 5, 4, "ue8m0", "cpu")
    storage = torch.as_strided(scales, (8,), (1,))
    storage.fill_(0x7B7B7B7B)  # a reused buffer's stale words
    T.per_token_group_quant_into(x, q, scales, 128, "ue8m0")
    assert storage[5:].tolist() == [0, 0, 0]
    _, sr = R.per_token_group_quant_ref(x, 128, pow2=True)
    assert_bits_equal(scales, L.to_layout(sr, "ue8m0"))


def _masked_m_out_of_range_counted(dev="cpu"):
    e, mmax, n, k = 3, 32, 256, 256
    a, sa, b, sb = (t.to(dev) for t in _gemm_operands(mmax, n, k, e=e))
    a3 = a.view(e, mmax, k)
    sa3 = L.alloc_scales((e,), mmax, k // 128, "col_tma", dev)
    for i in range(e):
        sa3[i].copy_(sa[i * mmax:(i + 1) * mmax])
    masked = torch.tensor([mmax + 40, -3, 7], dtype=torch.int32, device=dev)
    counters = torch.zeros(2, dtype=torch.int32, device=dev)
    out = G.m_grouped_fp8_gemm_nt_masked(a3, sa3, b, sb, masked, counters=counters,
                                         out=poison_(torch.empty(e, mmax, n, dtype=torch.bfloat16, device=dev)))
    a3, sa3, b, sb, out = (t.cpu() for t in (a3, sa3, b, sb, out))
    assert counters.tolist() == [1, 1]  # one negative, one above Mmax
    assert rel_l2(out[0], GR.gemm_nt_ref(a3[0], sa3[0], b[0], sb[0])) <= 5e-3  # clamped to Mmax rows
    assert rel_l2(out[2, :7], GR.gemm_nt_ref(a3[2, :7], sa3[2, :7], b[2], sb[2])) <= 5e-3


def _int64_ids_never_wrap(dev="cpu"):
    ids = torch.tensor([[2**32 + 1, 0], [-(2**32) + 1, 1], [2**40, 2**31]], dtype=torch.int64, device=dev)
    counts, starts, mi, counters = K.ep_layout(ids, 4, K.workspace_rows(6, 4, 16), 16)
    assert counts.tolist() == [1, 1, 0, 0]  # 2^32 + 1 is not expert 1, -2^32 + 1 is not expert 1
    assert counters.tolist() == [4, 0]
    lay = K.ep_masked_layout(ids, 4, 8)
    assert lay[0].tolist() == [1, 1, 0, 0] and lay[3].tolist() == [4, 0]


def _spent_cursor_overflows_counted(dev="cpu"):
    t, h = 6, 128
    ids = torch.tensor([[0], [0], [1], [1], [1], [0]], dtype=torch.int32, device=dev)
    x = torch.randn(t, h).to(torch.bfloat16).to(dev)
    xs = torch.rand(t, 1).to(dev)
    cap = K.workspace_rows(t, 2, 16)
    lay = K.ep_layout(ids, 2, cap, 16)
    out = poison_(torch.empty(cap, h, dtype=torch.bfloat16, device=dev))
    os_ = torch.zeros(cap, 1, device=dev)
    K.ep_scatter(x, xs, ids, lay[1], out, os_, lay[3], ends=lay.ends, cursor=lay.cursor)
    snapshot = out.clone()
    oidx = K.ep_scatter(x, xs, ids, lay[1], out, os_, lay[3], ends=lay.ends, cursor=lay.cursor)  # spent cursor
    assert (oidx == -1).all() and lay[3].tolist() == [0, t]  # every second-time route counted as overflow
    assert torch.equal(out.view(torch.int16), snapshot.view(torch.int16))  # padding rows untouched


def _gather_out_of_range_index_counted(dev="cpu"):
    y = torch.randn(5, 128).to(torch.bfloat16)
    w = torch.rand(3, 2)
    oidx = torch.tensor([[0, 4], [5, -1], [2**30, 3]], dtype=torch.int32)  # 5 and 2^30: past y's rows
    counters = torch.zeros(2, dtype=torch.int32, device=dev)
    got = K.ep_gather(y.to(dev), w.to(dev), oidx.to(dev), counters=counters).cpu()
    want = torch.zeros(3, 128)
    for t_, (i0, i1) in enumerate(oidx.tolist()):
        for kk, i in enumerate((i0, i1)):
            if 0 <= i < 5:
                want[t_] += w[t_, kk] * y[i].float()
    assert_bits_equal(got, want.to(torch.bfloat16))
    assert counters.tolist() == [2, 0]


def _replicate_kept_high_precision():
    tensors = {"a.w": _w(256, 256), "router": _w(8, 256, 3), "norm": torch.rand(256).to(torch.bfloat16)}
    out = LD.quantize_checkpoint(tensors, {"a.w": "column", "router": "replicate", "norm": "replicate"},
                                 A.Arch(10, 0), tp=2, rank=1)
    assert isinstance(out["a.w"], LD.Fp8Weight) and out["a.w"].q.shape == (128, 256)
    assert torch.equal(out["router"], tensors["router"]) and torch.equal(out["norm"], tensors["norm"])


def _k_not_multiple_of_128_gemm():
    a, sa, b, sb = _gemm_operands(7, 256, 256)
    a, b = a[:, :200].contiguous(), b[:, :200].contiguous()
    out = G.fp8_gemm_nt(a, sa, b, sb)
    assert rel_l2(out, GR.gemm_nt_ref(a, sa, b, sb)) <= 5e-3


@dataclasses.dataclass
class Case:
    entry: str
    input_class: str
    call: object
    expect: object  # a regex (error expected) or None (call checks the oracle itself)


ERR = (ValueError, TypeError)


class _Lazy:
    """Operands built on first use, not at import (collection on a GPU host launches nothing)."""

    def __getattr__(self, name):
        v = {
            "x": lambda: _x(),
            "gemm": lambda: _gemm_operands(),
            "experts": lambda: X.QuantizedExperts.from_bf16(
                *(torch.randn(2, 128, 128).to(torch.bfloat16) for _ in range(3)), A.Arch(9, 0)),
        }[name]()
        setattr(self, name, v)
        return v


F = _Lazy()
IDS = torch.tensor([[0, 1], [1, 2]], dtype=torch.int32)
STARTS = torch.tensor([0, 16, 32], dtype=torch.int32)
XQ, XS = torch.randn(2, 128).to(torch.bfloat16), torch.rand(2, 1)
OUT, OS = torch.empty(48, 128, dtype=torch.bfloat16), torch.empty(48, 1)
Y, W2, Z22 = torch.randn(4, 128).to(torch.bfloat16), torch.rand(2, 2), torch.zeros(2, 2, dtype=torch.int32)


def _cases() -> list[Case]:
    ids = IDS
    xs, xq, out, os_, y, w2 = XS, XQ, OUT, OS, Y, W2
    cnt = lambda: torch.zeros(2, dtype=torch.int32)  # noqa: E731
    return [
        # quantization: per_token_group_quant / _into, quantize_weight, ceil_pow2
        Case("per_token_group_quant", "not a tensor", lambda: T.per_token_group_quant([[1.0] * 128]),
             "x must be a torch.Tensor"),
        Case("per_token_group_quant", "meta tensor", lambda: T.per_token_group_quant(_meta((2, 128))),
             "x is a meta tensor"),
        Case("per_token_group_quant", "integer dtype", lambda: T.per_token_group_quant(F.x.to(torch.int32)),
             "x must be one of"),
        Case("per_token_group_quant", "group_size not a power of two", lambda: T.per_token_group_quant(F.x, 100),
             "group_size must be a power of two"),
        Case("per_token_group_quant", "group_size=True", lambda: T.per_token_group_quant(F.x, True),
             "group_size must be a power of two"),
        Case("per_token_group_quant", "K not a multiple of the group", lambda: T.per_token_group_quant(F.x[:, :200]),
             "K=200 is not divisible by group_size=128"),
        Case("per_token_group_quant", "strided last dim", lambda: T.per_token_group_quant(_x(4, 512)[:, ::2]),
             "x must be contiguous in its last dimension"),
        *(Case("per_token_group_quant", f"eps={e!r}", (lambda e=e: T.per_token_group_quant(F.x, eps=e)),
               "eps must be a finite positive number") for e in (float("nan"), float("inf"), 0.0, -1.0, True)),
        Case("per_token_group_quant", "unknown scale layout", lambda: T.per_token_group_quant(F.x, scale_layout="colm"),
             "scale_layout must be one of"),
        Case("per_token_group_quant", "out_dtype fp16", lambda: T.per_token_group_quant(F.x, out_dtype=torch.float16),
             "out_dtype must be"),
        Case("per_token_group_quant", "all-zero group (edge)", _zero_group_matches_oracle, None),
        Case("per_token_group_quant", "zero rows (edge)", _empty_rows, None),
        Case("per_token_group_quant_into", "q of another shape",
             lambda: T.per_token_group_quant_into(F.x, torch.empty(4, 128, dtype=torch.float8_e4m3fn),
                                                  torch.empty(4, 2), 128), "q must be a tensor of x's shape"),
        Case("per_token_group_quant_into", "scales in another layout",
             lambda: T.per_token_group_quant_into(F.x, torch.empty(4, 256, dtype=torch.float8_e4m3fn),
                                                  torch.empty(4, 2), 128, "col_tma"), "scales must have strides"),
        Case("per_token_group_quant_into", "reused UE8M0 buffer (padding words)", _ue8m0_reused_buffer_padding_zeroed,
             None),
        Case("quantize_weight_blocks", "meta tensor", lambda: B.quantize_weight_blocks(_meta((256, 256))),
             "w is a meta tensor"),
        Case("quantize_weight_blocks", "1-D weight", lambda: B.quantize_weight_blocks(torch.ones(256)),
             r"w must be \[\*batch, N, K\]"),
        Case("quantize_weight_blocks", "block=100", lambda: B.quantize_weight_blocks(_w(), 100),
             "block must be a positive power of two"),
        Case("quantize_weight_blocks", "eps=nan", lambda: B.quantize_weight_blocks(_w(), eps=float("nan")),
             "eps must be a finite positive number"),
        Case("ue8m0.ceil_pow2", "zero", lambda: ue8m0.ceil_pow2(torch.zeros(3)), "x must be finite and positive"),
        # GEMMs (every backend runs these checks; DeepGEMM's device gate last)
        Case("fp8_gemm_nt", "bf16 operand", lambda: G.fp8_gemm_nt(F.gemm[0].to(torch.bfloat16), *F.gemm[1:]),
             "a must be torch.float8_e4m3fn"),
        Case("fp8_gemm_nt", "meta operand", lambda: G.fp8_gemm_nt(_meta((8, 256), torch.float8_e4m3fn), *F.gemm[1:]),
             "a is a meta tensor"),
        Case("fp8_gemm_nt", "K mismatch",
             lambda: G.fp8_gemm_nt(*F.gemm[:2], F.gemm[2][:, :128].contiguous(), F.gemm[3][:, :1]),
             "b has K=128, a has K=256"),
        Case("fp8_gemm_nt", "scales not a tensor", lambda: G.fp8_gemm_nt(F.gemm[0], 1.0, *F.gemm[2:]), "sa must be"),
        Case("fp8_gemm_nt", "out of the wrong shape",
             lambda: G.fp8_gemm_nt(*F.gemm, out=torch.empty(8, 128, dtype=torch.bfloat16)),
             "out must be bfloat16 of shape"),
        Case("fp8_gemm_nt", "K=200 (not a multiple of 128, edge)", _k_not_multiple_of_128_gemm, None),
        Case("m_grouped_fp8_gemm_nt_contiguous", "alignment=True",
             lambda: G.m_grouped_fp8_gemm_nt_contiguous(*F.gemm[:2], F.gemm[2][None], F.gemm[3][None],
                                                        torch.zeros(8, dtype=torch.int32), alignment=True),
             "alignment must be"),
        Case("m_grouped_fp8_gemm_nt_masked", "masked_m above Mmax / negative (device-side)",
             _masked_m_out_of_range_counted, None),
        Case("backends.Backend('deepgemm')", "CPU tensors",
             lambda: BK.Backend("deepgemm", A.Arch(9, 0)).gemm_nt(*F.gemm), "a: DeepGEMM runs on CUDA tensors"),
        Case("backends.select", "unknown backend override", lambda: BK.select(A.Arch(9, 0), 256, 256, "cutlass"),
             "must be one of"),
        # MoE EP kernels and executors
        Case("ep_layout", "alignment=True", lambda: K.ep_layout(ids, 3, 48, True), "alignment must be a power of two"),
        Case("ep_layout", "num_experts=0", lambda: K.ep_layout(ids, 0, 48, 16), r"num_experts must be in \[1, 1024\]"),
        Case("ep_layout", "num_experts=2.0", lambda: K.ep_layout(ids, 2.0, 48, 16), "num_experts must be an int"),
        Case("ep_layout", "float ids", lambda: K.ep_layout(ids.float(), 3, 48, 16), "topk_ids must be an int32"),
        Case("ep_layout", "meta ids", lambda: K.ep_layout(_meta((2, 2), torch.int32), 3, 48, 16),
             "topk_ids is a meta tensor"),
        Case("ep_layout", "int64 ids >= 2^32 (device-side)", _int64_ids_never_wrap, None),
        Case("ep_masked_layout", "max_m=0", lambda: K.ep_masked_layout(ids, 3, 0), "max_m must be an int >= 1"),
        Case("ep_masked_layout", "E * max_m past int32", lambda: K.ep_masked_layout(ids, 4, 2**30),
             "must stay below 2\\^31"),
        Case("ep_scatter", "starts shorter than the experts",
             lambda: K.ep_scatter(xq, xs, ids, STARTS[:2], out, os_, cnt(), num_experts=3),
             r"starts must have one entry per expert \(num_experts=3\), got 2"),
        Case("ep_scatter", "starts not a tensor",
             lambda: K.ep_scatter(xq, xs, ids, [0, 16, 32], out, os_, cnt()), "starts must be a 1-D int32 tensor"),
        Case("ep_scatter", "cursor of another length",
             lambda: K.ep_scatter(xq, xs, ids, STARTS, out, os_, cnt(), cursor=STARTS[:2]),
             "cursor must be contiguous int32 with one entry per expert"),
        Case("ep_scatter", "a spent cursor reused (device-side)", _spent_cursor_overflows_counted, None),
        Case("ep_gather", "index past expert_out's rows (device-side)", _gather_out_of_range_index_counted, None),
        Case("ep_gather", "out too small", lambda: K.ep_gather(y, w2, Z22,
                                                               out=torch.empty(1, 128, dtype=torch.bfloat16)),
             r"out must be a bfloat16 tensor of shape \[2, 128\]"),
        Case("ep_gather", "out fp32", lambda: K.ep_gather(y, w2, Z22,
                                                          out=torch.empty(2, 128)), "out must be a bfloat16"),
        Case("ep_gather", "int weights", lambda: K.ep_gather(y, w2.int(), Z22),
             "topk_weights must be a float tensor"),
        Case("ep_gather", "meta expert_out", lambda: K.ep_gather(_meta((4, 128)), w2, Z22),
             "expert_out is a meta tensor"),
        Case("FP8MoE", "executor='bogus'", lambda: X.FP8MoE(F.experts, 16, 2, executor="bogus"),
             "executor must be one of"),
        Case("ContiguousExecutor", "max_tokens=0", lambda: X.ContiguousExecutor(F.experts, 0, 2),
             "max_tokens must be an int >= 1"),
        Case("MaskedExecutor", "topk=True", lambda: X.MaskedExecutor(F.experts, 4, True), "topk must be an int >= 1"),
        # loader
        Case("loader.quantize_weight", "tp=0", lambda: LD.quantize_weight("w", _w(), A.Arch(9, 0), "column", 0, 0),
             r"tp must be >= 1 and rank in \[0, tp\), got tp=0"),
        Case("loader.quantize_weight", "rank >= tp", lambda: LD.quantize_weight("w", _w(), A.Arch(9, 0), "row", 2, 2),
             "got tp=2, rank=2"),
        Case("loader.quantize_weight", "split='replicate'",
             lambda: LD.quantize_weight("w", _w(), A.Arch(9, 0), "replicate"), "w: split 'replicate' keeps"),
        Case("loader.quantize_checkpoint", "unknown split in the plan",
             lambda: LD.quantize_checkpoint({"w": _w()}, {"w": "diagonal"}, A.Arch(9, 0)), "plan: splits must be"),
        Case("loader.quantize_checkpoint", "'replicate' 2-D and 1-D tensors (edge)", _replicate_kept_high_precision,
             None),
    ]


CASES = _cases()


@pytest.mark.parametrize("case", CASES, ids=[f"{c.entry}: {c.input_class}" for c in CASES])
def test_bad_input(case, monkeypatch):
    launched = []
    if case.expect is not None:  # an error must come before any kernel launch
        for name in ("_launch", "_launch_tma", "_launch_ws"):
            monkeypatch.setattr(G, name, lambda *a, **k: launched.append(1))
        with pytest.raises(ERR, match=case.expect):
            case.call()
        assert not launched
    else:
        case.call()


def print_table() -> None:
    print("| entry point | input | outcome |")
    print("|---|---|---|")
    for c in CASES:
        outcome = f"error: `{c.expect}`" if c.expect is not None else "result matches the oracle (checked)"
        print(f"| `{c.entry}` | {c.input_class} | {outcome.replace('|', '/')} |")


# ----------------------------------------------------------------------------- properties

PROPS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPS
@given(m=st.integers(0, 9), groups=st.integers(1, 3), layout=st.sampled_from(L.LAYOUTS),
       scale=st.sampled_from([1e-6, 1.0, 300.0]), seed=st.integers(0, 2**16))
def test_quant_matches_oracle_for_any_shape(m, groups, layout, scale, seed):
    x = (torch.randn(m, groups * 128, generator=torch.Generator().manual_seed(seed)) * scale).to(torch.bfloat16)
    q, s = T.per_token_group_quant(x, 128, scale_layout=layout)
    qr, sr = R.per_token_group_quant_ref(x, 128, pow2=layout == "ue8m0")
    assert_bits_equal(q, qr)
    assert_bits_equal(s, L.to_layout(sr, layout))


@PROPS
@given(t=st.integers(1, 12), topk=st.integers(1, 3), e=st.integers(1, 5), off=st.integers(0, 3),
       align=st.sampled_from([1, 16, 64]), seed=st.integers(0, 2**16))
def test_scatter_gather_route_every_valid_id_exactly_once(t, topk, e, off, align, seed):
    """Random ids (valid, other-rank, invalid, int64 past int32): every local route is scattered
    once and gathered with its weight; invalid ids are counted, other ranks' skipped."""
    g = torch.Generator().manual_seed(seed)
    ng = off + e + 2
    ids = torch.randint(-2, ng + 2, (t, topk), generator=g, dtype=torch.int64)
    ids[torch.rand(t, topk, generator=g) < 0.1] = 2**33
    x = torch.randn(t, 128, generator=g).to(torch.bfloat16)
    xs = torch.rand(t, 1, generator=g)
    cap = K.workspace_rows(t * topk, e, align)
    out, os_ = poison_(torch.empty(cap, 128, dtype=torch.bfloat16)), torch.zeros(cap, 1)
    lay, oidx = K.ep_dispatch(x, xs, ids, e, out, os_, align, expert_offset=off, num_global_experts=ng)
    local = (ids >= off) & (ids < off + e)
    invalid = (ids < 0) | (ids >= ng)
    assert lay[3].tolist() == [int(invalid.sum()), 0]
    assert lay[0].tolist() == [int((ids == off + i).sum()) for i in range(e)]
    assert bool(((oidx >= 0) == local).all())
    rows = oidx[local].long()
    assert rows.unique().numel() == rows.numel()  # no row written twice
    assert torch.equal(out[rows].view(torch.int16), x.repeat_interleave(topk, 0)[local.view(-1)].view(torch.int16))
    w = torch.rand(t, topk, generator=g)
    y = K.ep_gather(out, w, oidx)
    want = torch.zeros(t, 128)
    for i, k in local.nonzero().tolist():
        want[i] += w[i, k] * x[i].float()
    assert_bits_equal(y, want.to(torch.bfloat16))


@pytest.mark.gpu
@pytest.mark.parametrize("check", [_masked_m_out_of_range_counted, _int64_ids_never_wrap,
                                   _spent_cursor_overflows_counted, _gather_out_of_range_index_counted],
                         ids=lambda f: f.__name__.strip("_"))
def test_device_side_bounds_on_the_gpu(check):
    """The values only the device sees (ids, indices, masked_m) on the GPU kernels themselves."""
    check("cuda")
