"""Split-K in the dense TMA GEMM (small grids on big GPUs): the policy, and the split path
forced on any shape against the float64 oracle and the unsplit kernel. Outputs are poisoned
with NaN first; the split result is deterministic (partials added in a fixed order)."""

import pytest
import torch

from helpers import DEVICES, assert_bf16_last_bit, rel_l2
from rtp_fp8.gemm import reference as GR
from rtp_fp8.gemm.triton import block_scaled as G
from rtp_fp8.quant import block as B
from rtp_fp8.quant import token_group as T


def test_policy():
    d, c = G.DENSE, G.CONTIGUOUS
    assert G.split_k(d, tiles=64, nk=56, sms=132) == 2  # M=128 N=4096 K=7168 with 64x128 tiles
    assert G.split_k(d, tiles=32, nk=56, sms=132) == 3  # capped by 16 K blocks per split
    assert G.split_k(d, tiles=16, nk=128, sms=132) == 4  # capped by SPLIT_K_MAX
    assert G.split_k(d, tiles=100, nk=56, sms=132) == 1  # the grid already fills half the GPU
    assert G.split_k(d, tiles=8, nk=16, sms=132) == 1  # too little K to split
    assert G.split_k(c, tiles=8, nk=128, sms=132) == 1  # grouped GEMMs never split
    assert G.split_k(d, tiles=8, nk=128, sms=None) == 1  # no GPU (the interpreter): only when forced


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("splits", [2, 3, 4])
@pytest.mark.parametrize("m,n,k", [(128, 256, 1024), (7, 200, 384), (64, 128, 256)])
def test_forced_split_matches_the_oracle_and_the_unsplit_kernel(monkeypatch, device, splits, m, n, k):
    g = torch.Generator().manual_seed(m + n + k + splits)
    x = torch.randn(m, k, generator=g).to(device, torch.bfloat16)
    w = (torch.randn(n, k, generator=g) / k**0.5).to(device, torch.bfloat16)
    a, sa = T.per_token_group_quant(x, 128, scale_layout="col_tma")
    b, sb = B.quantize_weight_blocks(w)
    monkeypatch.setattr(G, "USE_WS", False)
    whole = G.fp8_gemm_nt(a, sa, b, sb, out=torch.full((m, n), float("nan"), dtype=torch.bfloat16, device=device))
    monkeypatch.setattr(G, "FORCE_SPLIT_K", splits)
    outs = [G.fp8_gemm_nt(a, sa, b, sb, out=torch.full((m, n), float("nan"), dtype=torch.bfloat16, device=device))
            for _ in range(2)]
    assert torch.isfinite(outs[0]).all()
    assert torch.equal(outs[0], outs[1])  # deterministic
    assert rel_l2(outs[0].cpu(), GR.gemm_nt_ref(a, sa, b, sb).cpu()) < 5e-3
    # only the regrouping of FP32 partials differs from the unsplit kernel: BF16 last-bit flips at most
    assert_bf16_last_bit(outs[0], whole)
