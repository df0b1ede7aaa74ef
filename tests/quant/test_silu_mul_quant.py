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
