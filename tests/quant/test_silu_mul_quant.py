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


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("how", [None, "m_indices", "masked_m"])
@pytest.mark.parametrize("programs", [1, 3, 7])
def test_persistent_grid_equals_a_program_per_block(device, how, programs):
    """The persistent grid (`programs` row programs looping over the row blocks, some of them
    skipped) writes the bits a program per row block writes, and leaves skipped rows alone."""
    e, per, inter, block_m = 5, 24, 256, 4  # 30 row blocks
    rows = e * per
    g = torch.Generator().manual_seed(programs * 7 + len(how or ""))
    gate_up = (torch.randn(rows, 2 * inter, generator=g) * 3).to(torch.bfloat16)
    skip, keep = T.NO_SKIP, torch.ones(rows, dtype=torch.bool)
    if how == "m_indices":
        ids = torch.randint(0, e, (rows,), generator=g, dtype=torch.int32)
        ids[per:3 * per] = -1  # whole skipped blocks, and a partly skipped one
        ids[rows - 6:] = -1
        keep = ids >= 0
        skip = (1, ids.to(device), 1)
    elif how == "masked_m":
        masked = torch.tensor([per, 0, 9, per + 3, 1], dtype=torch.int32)
        keep = (torch.arange(per)[None, :] < masked.clamp(0, per)[:, None]).reshape(-1)
        skip = (2, masked.to(device), per)
    gate_up[~keep] = float("nan")
    gate_up = gate_up.to(device)
    outs = []
    for progs in (0, programs):
        q = poison_(torch.empty(rows, inter, dtype=torch.float8_e4m3fn, device=device))
        s = poison_(L.alloc_scales((), rows, inter // 128, "row", device))
        T._launch_tiles(gate_up, q, s, rows, inter // 128, 128, 1e-10, False, False, up_off=inter,
                        config=(block_m, 2, 4, 1, progs), skip=skip)
        outs.append((q.view(torch.uint8).cpu(), s.cpu()))
    (q0, s0), (q1, s1) = outs
    assert torch.equal(q0, q1)
    assert torch.equal(s0.view(torch.int32), s1.view(torch.int32))
    assert bool((q1[~keep] == 0x7B).all()) and bool(torch.isnan(s1[~keep]).all())
    assert not bool((q1[keep] == 0x7B).all(dim=1).any())  # every kept row written
