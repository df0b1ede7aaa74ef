"""Contiguous MoE executor end to end, for FP32 (SM90) and packed UE8M0 (SM120) scales:
vs an FP8-emulating oracle (the same quantized operands, float math: relative L2 <= 5e-3,
bf16 rounding) and vs the BF16 MoE oracle (relative L2 <= 0.08: FP8 activations twice and
FP8 weights, measured ~0.064)."""

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


def _fp8_emulated(ex, x, ids, w):
    pow2 = ex.arch.scale_format == "ue8m0"
    w13, w2 = GR.dequant_b(*ex.w13).float(), GR.dequant_b(*ex.w2).float()
    qx, sx = R.per_token_group_quant_ref(x.cpu(), 128, pow2=pow2)
    xdq = R.group_dequant_ref(qx, sx, 128)
    out = torch.zeros(x.shape)
    ids, w = ids.cpu(), w.cpu()
    for e in range(E):
        rows, slot = (ids == e).nonzero(as_tuple=True)
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
    ex = X.ContiguousExecutor(wg, wu, wd, max_tokens=24, topk=TOPK, arch=arch, alignment=64)
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


def test_executor_bad_input():
    wg, wu, wd = _weights("cpu")
    with pytest.raises(ValueError, match="w_down must be"):
        X.ContiguousExecutor(wg, wu, wd[:, :128], 8, TOPK, A.Arch(9, 0))
    ex = X.ContiguousExecutor(wg, wu, wd, 8, TOPK, A.Arch(9, 0))
    x = torch.randn(9, H, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="more than max_tokens=8"):
        ex(x, torch.zeros(9, TOPK, dtype=torch.int32), torch.ones(9, TOPK))
    with pytest.raises(ValueError, match="topk_ids must be"):
        ex(x[:4], torch.zeros(4, 3, dtype=torch.int32), torch.ones(4, 3))
