"""MoE executors under CUDA graphs (H200): capture once, replay with inputs and routing
written in place (uniform; every token on one local expert; all -1); each replay equals an
eager call of the same executor, and the device counters grow by exactly the dropped routes.
Shapes: large batch (T=128, E=128, contiguous; scales direct and through the row map) and decode
(T in {1, 2}, 256 experts over EP=4, this rank owning [64, 128), masked)."""

import pytest
import torch

from helpers import rel_l2
from rtp_fp8 import arch as A
from rtp_fp8.moe import ep_kernels as K
from rtp_fp8.moe import executors as X

pytestmark = pytest.mark.gpu

H, INTER, TOPK = 512, 256, 8


def _experts(e, seed=0):
    g = torch.Generator().manual_seed(seed)
    wg = (torch.randn(e, INTER, H, generator=g) / H**0.5).to(torch.bfloat16)
    wu = (torch.randn(e, INTER, H, generator=g) / H**0.5).to(torch.bfloat16)
    wd = (torch.randn(e, H, INTER, generator=g) / INTER**0.5).to(torch.bfloat16)
    return X.QuantizedExperts.from_bf16(wg.cuda(), wu.cuda(), wd.cuda(), A.detect())


def _routing(kind, t, n_global, e_off, g):
    if kind == "all_minus1":
        ids = torch.full((t, TOPK), -1, dtype=torch.int32)
    elif kind == "uniform":
        ids = torch.stack([torch.randperm(n_global, generator=g)[:TOPK] for _ in range(t)]).to(torch.int32)
    else:  # one_expert: every token's first route on local expert 3, its others distinct and elsewhere
        hot = e_off + 3
        rest = torch.stack([torch.randperm(n_global - 1, generator=g)[:TOPK - 1] for _ in range(t)])
        rest = rest + (rest >= hot).long()
        ids = torch.cat([torch.full((t, 1), hot), rest], dim=1).to(torch.int32)
    w = torch.softmax(torch.randn(t, TOPK, generator=g), -1)
    return ids, w


@pytest.mark.parametrize("deterministic", [True, False], ids=["deterministic", "atomic"])
@pytest.mark.parametrize(
    "name,t,n_global,e_local,e_off,executor",
    [("large", 128, 128, 128, 0, "contiguous"), ("large_row_map", 128, 128, 128, 0, "contiguous"),
     ("decode1", 1, 256, 64, 64, "masked"),
     ("decode2", 2, 256, 64, 64, "masked")],
)
def test_replay_equals_eager(name, t, n_global, e_local, e_off, executor, deterministic, monkeypatch):
    if name.endswith("_row_map"):  # column-major scales written by the second launch from the row map
        monkeypatch.setattr(K, "ROW_MAP_ROUTES", 0)
    experts = _experts(e_local)
    cls = X.ContiguousExecutor if executor == "contiguous" else X.MaskedExecutor
    ex = cls(experts, max_tokens=t, topk=TOPK, expert_offset=e_off, num_global_experts=n_global,
             deterministic=deterministic)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(t, H, generator=g).to(torch.bfloat16).cuda()
    ids0, w0 = _routing("uniform", t, n_global, e_off, g)
    ids, w = ids0.cuda(), w0.cuda()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm-up (compiles the kernels) outside the capture
        ex(x, ids, w)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y_static = ex(x, ids, w)
    for kind in ("uniform", "one_expert", "all_minus1", "uniform"):
        nid, nw = _routing(kind, t, n_global, e_off, g)
        x.copy_(torch.randn(t, H, generator=g).to(torch.bfloat16))
        ids.copy_(nid)
        w.copy_(nw)
        before = ex.read_counters()
        graph.replay()
        torch.cuda.synchronize()
        replayed = y_static.clone()
        after_replay = ex.read_counters()
        eager = ex(x, ids, w)
        after_eager = ex.read_counters()
        if deterministic:
            assert torch.equal(replayed, eager), f"{name}/{kind}: replay != eager"
        else:  # rows within an expert may land in another order; per-row math is the same
            assert rel_l2(replayed, eager) <= 1e-6, f"{name}/{kind}"
        invalid = t * TOPK if kind == "all_minus1" else 0
        assert after_replay["invalid_ids"] - before["invalid_ids"] == invalid
        assert after_eager["invalid_ids"] - after_replay["invalid_ids"] == invalid
        assert after_eager["overflow"] == before["overflow"] == 0
        if kind == "all_minus1":
            assert torch.equal(replayed, torch.zeros_like(replayed))
        else:
            assert replayed.abs().sum() > 0 and not torch.isnan(replayed).any()
