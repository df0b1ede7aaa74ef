"""bench/ncu_probe.py's host side: --ws-stages adds sm90_ws at the dispatch's tile with each ring depth,
patched inside the call (the profiled launch must read it, and the shipped depth must be back after),
each variant writing its own NaN-poisoned output; --cluster and --narrow add the CUDA kernels. The
profiles come from the GPU."""

import pytest
import torch

from bench import ncu_probe as P
from rtp_fp8.gemm.triton import sm90_ws as W


def test_ring_depth_variants_patch_the_depth_inside_their_call(monkeypatch):
    monkeypatch.setattr(P.A, "num_sms", lambda index=0: 132)
    seen = []

    def dispatch(a, sa, b, sb, out=None):
        seen.append(W.STAGES_HALF[64])
        out.fill_(1.0)

    monkeypatch.setattr(P.G, "fp8_gemm_nt", dispatch)
    shipped = W.STAGES_HALF[64]
    # (128, 4096, K) runs 64x64 tiles on 132 SMs (sm90_ws.tile_shape)
    assert W.tile_shape(128, 4096, 132) == (64, 64)
    a, b = torch.empty(128, 128), torch.empty(4096, 128)
    out = torch.empty(128, 4096)
    variants = P._variants(a, None, b, None, out, [10, 12], None)
    assert [label for label, *_ in variants] == ["ours", "ours s10", "ours s12"]
    assert variants[0][2] is out
    assert all(torch.isnan(o).all() for *_, o in variants)  # poisoned before any call
    assert len({id(o) for *_, o in variants}) == 3
    for _, call, _ in variants:
        call()
    assert seen == [shipped, 10, 12] and W.STAGES_HALF[64] == shipped
    assert all(bool((o == 1).all()) for *_, o in variants)


def test_cluster_variants_call_the_cuda_kernel_with_and_without_multicast(monkeypatch):
    seen = []

    def kernel(a, sa, b, sb, out, group_m, clusters, multicast):
        seen.append((group_m, clusters, multicast))
        out.fill_(2.0)

    monkeypatch.setattr(P._ext, "fp8_gemm_sm90", kernel)
    a, b, out = torch.empty(256, 128), torch.empty(512, 128), torch.empty(256, 512)
    variants = P._variants(a, None, b, None, out, [], None, cluster=True)
    assert [label for label, *_ in variants] == ["ours", "cluster", "cluster nomc"]
    assert all(torch.isnan(o).all() for *_, o in variants)
    for _, call, _ in variants[1:]:
        call()
    assert seen == [(8, 0, True), (8, 0, False)]
    assert bool(torch.isnan(out).all()) and all(bool((o == 2).all()) for *_, o in variants[1:])


def test_narrow_variants_call_the_cuda_kernel_per_tile_and_ring(monkeypatch):
    seen = []

    def kernel(a, sa, b, sb, out, block_n, stages):
        seen.append((block_n, stages))
        out.fill_(3.0)

    monkeypatch.setattr(P._ext, "fp8_gemm_sm90_narrow", kernel)
    a, b, out = torch.empty(64, 128), torch.empty(512, 128), torch.empty(64, 512)
    variants = P._variants(a, None, b, None, out, [], None, narrow=[(32, 16), (64, 13)])
    assert [label for label, *_ in variants] == ["ours", "narrow 64x32 s16", "narrow 64x64 s13"]
    assert all(torch.isnan(o).all() for *_, o in variants)
    for _, call, _ in variants[1:]:
        call()
    assert seen == [(32, 16), (64, 13)] and all(bool((o == 3).all()) for *_, o in variants[1:])
    assert P._narrow("32,16") == (32, 16)
    assert P._narrow("112,9") == (112, 9) and P._narrow("56,8") == (56, 8)
    for bad in ("48,8", "32,1", "32,17", "32"):
        with pytest.raises(P.argparse.ArgumentTypeError, match="--narrow"):
            P._narrow(bad)
