"""The fused MoE activation quantizer equals silu(g) * u in fp32, rounded to bf16, then quantized.

On the GPU both sides use the CUDA math library's expf and IEEE division: bit-exact. Under
the interpreter the fused kernel's exp is numpy's and torch's CPU silu has its own exp, so a
last-bit difference in silu can move a bf16 activation by one ulp: there at most 1 in 10^4
fp8 codes may differ, by one step, and scales agree to 1%.
"""

import pytest
import torch

from helpers import DEVICES, poison_
from rtp_fp8.quant import layout as L
from rtp_fp8.quant import token_group as T


def _reference(gate_up, group, layout):
    i = gate_up.shape[1] // 2
    act = (torch.nn.functional.silu(gate_up[:, :i].float()) * gate_up[:, i:].float()).to(torch.bfloat16)
    return T.per_token_group_quant(act, group, scale_layout=layout, backend="triton")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", ["row", "col_tma", "ue8m0"])
@pytest.mark.parametrize("rows,inter", [(1, 256), (37, 512), (300, 2048)])
def test_fused_equals_composition(device, layout, rows, inter):
    g = torch.Generator().manual_seed(rows + inter)
    gate_up = (torch.randn(rows, 2 * inter, generator=g) * 3).to(torch.bfloat16).to(device)
    q = poison_(torch.empty(rows, inter, dtype=torch.float8_e4m3fn, device=device))
    s = poison_(L.alloc_scales((), rows, inter // 128, layout, device))
    T.silu_mul_quant_into(gate_up, q, s, 128, layout)
    q_ref, s_ref = _reference(gate_up, 128, layout)
    qb, rb = q.view(torch.uint8).cpu().int(), q_ref.view(torch.uint8).cpu().int()
    if device == "cuda":
        assert torch.equal(qb, rb)
        assert torch.equal(s.cpu().view(torch.int32), s_ref.cpu().view(torch.int32))
    else:
        differ = qb != rb
        assert int(differ.sum()) <= max(1, qb.numel() // 10_000), f"{int(differ.sum())} codes differ"
        assert bool(((qb - rb).abs()[differ] <= 1).all())
        if layout == "ue8m0":
            assert (s.cpu() != s_ref.cpu()).sum() <= 1
        else:
            torch.testing.assert_close(s.cpu(), s_ref.cpu(), rtol=1e-2, atol=0)


def test_fused_bad_input():
    gu = torch.randn(4, 512).to(torch.bfloat16)
    q = torch.empty(4, 256, dtype=torch.float8_e4m3fn)
    s = L.alloc_scales((), 4, 2, "row", "cpu")
    with pytest.raises(ValueError, match="gate_up must be a 2-D bfloat16"):
        T.silu_mul_quant_into(gu.float(), q, s)
    with pytest.raises(ValueError, match="gate_up must have an even"):
        T.silu_mul_quant_into(gu[:, :511], q, s)
    with pytest.raises(ValueError, match="q must be float8_e4m3fn of shape"):
        T.silu_mul_quant_into(gu, torch.empty(4, 512, dtype=torch.float8_e4m3fn), s)
    with pytest.raises(ValueError, match="group_size must be a power of two"):
        T.silu_mul_quant_into(gu, q, s, group_size=96)
    with pytest.raises(ValueError, match="scales"):
        T.silu_mul_quant_into(gu, q, L.alloc_scales((), 4, 1, "row", "cpu"))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", ["row", "col_tma", "ue8m0"])
@pytest.mark.parametrize("how", ["m_indices", "masked_m"])
def test_skipped_rows_are_neither_read_nor_written(device, layout, how):
    """Rows no GEMM reads (contiguous padding ids -1; masked rows past masked_m, with a negative
    and an oversized entry) keep their poison in q and the scales, and their gate_up input may be
    NaN; the other rows equal the unskipped kernel's bit for bit."""
    e, per, inter = 4, 40, 256
    rows = e * per
    g = torch.Generator().manual_seed(len(how) + len(layout))
    gate_up = (torch.randn(rows, 2 * inter, generator=g) * 3).to(torch.bfloat16)
    if how == "m_indices":
        ids = torch.randint(-1, e, (rows,), generator=g, dtype=torch.int32)
        keep = ids >= 0
        skip = {"m_indices": ids.to(device)}
    else:
        masked = torch.tensor([0, 17, per + 5, -2], dtype=torch.int32)
        keep = torch.arange(per)[None, :] < masked.clamp(0, per)[:, None]
        keep = keep.reshape(-1)
        skip = {"masked_m": masked.to(device)}
    gate_up[~keep] = float("nan")  # never read
    gate_up = gate_up.to(device)
    q = poison_(torch.empty(rows, inter, dtype=torch.float8_e4m3fn, device=device))
    s = poison_(L.alloc_scales((), rows, inter // 128, layout, device))
    T.silu_mul_quant_into(gate_up, q, s, 128, layout, **skip)
    q_all = poison_(torch.empty_like(q))
    s_all = poison_(L.alloc_scales((), rows, inter // 128, layout, device))
    T.silu_mul_quant_into(gate_up, q_all, s_all, 128, layout)
    qb, qa = q.view(torch.uint8).cpu(), q_all.view(torch.uint8).cpu()
    assert torch.equal(qb[keep], qa[keep])
    assert bool((qb[~keep] == 0x7B).all())
    sv, sa = s.cpu(), s_all.cpu()
    if layout != "ue8m0":  # one scale per (row, group): skipped rows keep the poison
        assert torch.equal(sv[keep].view(torch.int32), sa[keep].view(torch.int32))
        assert bool(torch.isnan(sv[~keep]).all())
    else:  # packed words per row
        poison = poison_(L.alloc_scales((), rows, inter // 128, layout, device)).cpu()
        assert torch.equal(sv[:rows][keep], sa[:rows][keep])
        assert torch.equal(sv[:rows][~keep], poison[:rows][~keep])


def test_skip_bad_input():
    gu = torch.randn(8, 512).to(torch.bfloat16)
    q = torch.empty(8, 256, dtype=torch.float8_e4m3fn)
    s = L.alloc_scales((), 8, 2, "row", "cpu")
    ids = torch.zeros(8, dtype=torch.int32)
    with pytest.raises(ValueError, match="not both"):
        T.silu_mul_quant_into(gu, q, s, m_indices=ids, masked_m=ids[:2])
    with pytest.raises(ValueError, match="m_indices must be a contiguous 1-D int32"):
        T.silu_mul_quant_into(gu, q, s, m_indices=ids.long())
    with pytest.raises(ValueError, match="one id per gate_up row"):
        T.silu_mul_quant_into(gu, q, s, m_indices=ids[:7])
    with pytest.raises(ValueError, match="masked_m has 3 experts"):
        T.silu_mul_quant_into(gu, q, s, masked_m=ids[:3])
    with pytest.raises(ValueError, match="masked_m must be a contiguous"):
        T.silu_mul_quant_into(gu, q, s, masked_m=ids[::2])
