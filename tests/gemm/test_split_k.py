"""Split-K in the dense TMA GEMM (small grids on big GPUs): the policy, and the split path
forced on any shape against the float64 oracle and the unsplit kernel. Outputs are poisoned
with NaN first; the split result is deterministic (partials added in a fixed order). The split
reduction's programmatic dependent launch: where it applies (CPU), and on SM90+ GPUs replayed in a
CUDA graph on new operands, bit-identical to plain launches for the swapped, sm90_ws (on the
H200) and TMA kernels' splits."""

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
    monkeypatch.setattr(G, "USE_NARROW", False)  # on SM90 it takes 1-128 rows, unsplit
    whole = G.fp8_gemm_nt(a, sa, b, sb, out=torch.full((m, n), float("nan"), dtype=torch.bfloat16, device=device))
    monkeypatch.setattr(G, "FORCE_SPLIT_K", splits)
    outs = [G.fp8_gemm_nt(a, sa, b, sb, out=torch.full((m, n), float("nan"), dtype=torch.bfloat16, device=device))
            for _ in range(2)]
    assert torch.isfinite(outs[0]).all()
    assert torch.equal(outs[0], outs[1])  # deterministic
    assert rel_l2(outs[0].cpu(), GR.gemm_nt_ref(a, sa, b, sb).cpu()) < 5e-3
    # only the regrouping of FP32 partials differs from the unsplit kernel: BF16 last-bit flips at most
    assert_bf16_last_bit(outs[0], whole)


def test_pdl_only_where_a_gpu_can_run_it(monkeypatch):
    """Programmatic dependent launch of the split reduction: on SM90+ GPUs with USE_PDL, never
    under the interpreter, on older GPUs or when the caller's kernel has no split."""
    from rtp_fp8 import arch as A

    dev = torch.device("cuda", 0)
    monkeypatch.setattr(G.triton_env, "interpreting", lambda: False)
    monkeypatch.setattr(G.A, "detect", lambda device: A.Arch(9, 0))
    assert G._pdl_args(dev) == {"PDL": True, "launch_pdl": True} or not G.HAS_GDC
    assert G._pdl_args(dev, on=False) == {}
    monkeypatch.setattr(G.A, "detect", lambda device: A.Arch(8, 0))
    assert G._pdl_args(dev) == {}
    monkeypatch.setattr(G.A, "detect", lambda device: A.Arch(12, 0))
    monkeypatch.setattr(G, "USE_PDL", False)
    assert G._pdl_args(dev) == {}


@pytest.mark.gpu
@pytest.mark.parametrize("m,n,k,flags", [
    (64, 4096, 7168, {"FORCE_SPLIT_K": 4, "USE_NARROW": False}),  # the swapped kernel
    (128, 4096, 7168, {"USE_NARROW": False}),  # on the H200 sm90_ws 128x64 tiles, 2 splits; elsewhere its own
    (128, 1024, 7168, {"USE_WS": False, "USE_SWAP": False, "FORCE_SPLIT_K": 3}),  # the TMA kernel
])
def test_pdl_split_reduction_replayed_in_a_cuda_graph(monkeypatch, m, n, k, flags):
    """The reduction launched dependent on the GEMM, captured in a CUDA graph and replayed on new
    operands (the stale partials of the previous replay must never show): bit-identical to plain
    launches run eagerly."""
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("programmatic dependent launch needs SM90 or newer")
    assert G._pdl_args(torch.device("cuda")) or not G.HAS_GDC  # the dependent launch is on
    for name, value in flags.items():
        monkeypatch.setattr(G, name, value)
    gen = torch.Generator().manual_seed(m + n)

    def operands():
        x = torch.randn(m, k, generator=gen).to("cuda", torch.bfloat16)
        w = (torch.randn(n, k, generator=gen) / k**0.5).to("cuda", torch.bfloat16)
        return (*T.per_token_group_quant(x, 128, scale_layout="col_tma"), *B.quantize_weight_blocks(w))

    a, sa, b, sb = operands()
    out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
    G.fp8_gemm_nt(a, sa, b, sb, out=out)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        G.fp8_gemm_nt(a, sa, b, sb, out=out)
    for _ in range(3):
        new = operands()
        for buf, val in zip((a, sa, b, sb), new):
            buf.copy_(val)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        with monkeypatch.context() as mp:
            mp.setattr(G, "USE_PDL", False)
            ref = G.fp8_gemm_nt(*new)
        assert torch.equal(out, ref)
        assert rel_l2(out.cpu(), GR.gemm_nt_ref(*new).cpu()) < 5e-3
