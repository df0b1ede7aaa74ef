"""EP count/layout/scatter/gather kernels vs plain-torch oracles (exact where exact)."""

import pytest
import torch

from helpers import DEVICES
from rtp_fp8.moe import ep_kernels as K

E, TOPK, T, H = 8, 4, 37, 256


def _ids(device, seed, invalid=True):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, E, (T, TOPK), generator=g, dtype=torch.int32)
    if invalid:
        ids[0, 0], ids[3, 2], ids[5, 1], ids[9, 3] = -1, E, 1000, -7
    return ids.to(device)


def _oracle_layout(ids, align, cap):
    flat = ids.cpu().view(-1).long()
    valid = (flat >= 0) & (flat < E)
    counts = torch.bincount(flat[valid], minlength=E).int()
    aligned = (counts + align - 1) // align * align
    starts = torch.cumsum(aligned, 0) - aligned
    mi = torch.full((cap,), -1, dtype=torch.int32)
    for e in range(E):
        mi[starts[e]:starts[e] + counts[e]] = e
    return counts, starts.int(), mi, int((~valid).sum())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("align", [1, 64, 128])
def test_layout_and_scatter_exact(device, align):
    ids = _ids(device, seed=align)
    cap = K.workspace_rows(T * TOPK, E, align)
    counts, starts, mi, counters = K.ep_layout(ids, E, cap, align)
    oc, os_, om, inv = _oracle_layout(ids, align, cap)
    assert counts.cpu().tolist() == oc.tolist() and starts.cpu().tolist() == os_.tolist()
    assert torch.equal(mi.cpu(), om) and counters.cpu().tolist() == [inv, 0]

    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, 120, (T, H), generator=g, dtype=torch.uint8).view(torch.float8_e4m3fn).to(device)
    xs = (torch.rand(T, 2, generator=g) + 0.5).to(device)
    guard = 16
    buf = torch.full((cap + guard, H), 0x7B, dtype=torch.uint8, device=device).view(torch.float8_e4m3fn)
    sbuf = torch.full((cap + guard, 2), float("nan"), device=device)
    oidx = K.ep_scatter(x, xs, ids, starts, buf[:cap], sbuf[:cap], counters)
    oidx, ids_c = oidx.cpu(), ids.cpu()
    for e in range(E):
        got = sorted(oidx[ids_c == e].tolist())
        assert got == list(range(int(os_[e]), int(os_[e] + oc[e]))), f"expert {e} rows"
    assert bool((oidx[(ids_c < 0) | (ids_c >= E)] == -1).all())
    bufc, sbufc = buf.view(torch.uint8).cpu(), sbuf.cpu()
    xb = x.view(torch.uint8).cpu()
    for t in range(T):
        for k in range(TOPK):
            d = int(oidx[t, k])
            if d >= 0:
                assert torch.equal(bufc[d], xb[t]) and torch.equal(sbufc[d], xs[t].cpu())
    unused = om == -1
    assert bool((bufc[:cap][unused] == 0x7B).all()), "padding rows must not be written"
    assert bool((bufc[cap:] == 0x7B).all()) and bool(torch.isnan(sbufc[cap:]).all()), "guard rows written"
    assert counters.cpu().tolist() == [inv, 0]


@pytest.mark.parametrize("device", DEVICES)
def test_overflow_is_masked_and_counted(device):
    ids = _ids(device, seed=5, invalid=False)
    cap_full = K.workspace_rows(T * TOPK, E, 64)
    counts, starts, _, counters = K.ep_layout(ids, E, cap_full, 64)
    cap = 200  # inconsistent metadata: the layout needs more rows than the buffer has
    x = torch.zeros(T, H, dtype=torch.float8_e4m3fn, device=device).view(torch.uint8).fill_(5).view(
        torch.float8_e4m3fn)
    buf = torch.full((cap + 8, H), 0x7B, dtype=torch.uint8, device=device).view(torch.float8_e4m3fn)
    sbuf = torch.zeros(cap + 8, 1, device=device)
    oidx = K.ep_scatter(x, torch.ones(T, 1, device=device), ids, starts, buf[:cap], sbuf[:cap], counters)
    dropped = int(sum(((starts.cpu()[e] + torch.arange(int(counts[e]))) >= cap).sum() for e in range(E)))
    assert dropped > 0
    assert counters.cpu().tolist() == [0, dropped]
    assert int((oidx.cpu() == -1).sum()) == dropped and int(oidx.max()) < cap
    assert bool((buf.view(torch.uint8)[cap:].cpu() == 0x7B).all())


@pytest.mark.parametrize("device", DEVICES)
def test_gather_weighted_sum_exact(device):
    g = torch.Generator().manual_seed(2)
    cap = 300
    y = torch.randn(cap, H, generator=g).to(torch.bfloat16).to(device)
    w = torch.rand(T, TOPK, generator=g).to(device)
    oidx = torch.randint(0, cap, (T, TOPK), generator=g, dtype=torch.int32)
    oidx[2, 1] = -1
    out = K.ep_gather(y, w, oidx.to(device)).cpu()
    yc, wc = y.cpu().float(), w.cpu()
    ref = torch.zeros(T, H)
    for k in range(TOPK):
        valid = (oidx[:, k] >= 0).float()[:, None]
        ref = ref + (wc[:, k, None] * valid) * yc[oidx[:, k].clamp(min=0).long()]
    assert torch.equal(out, ref.to(torch.bfloat16))


def test_bad_input():
    ids = _ids("cpu", seed=0)
    with pytest.raises(ValueError, match="alignment must be a power of two"):
        K.ep_layout(ids, E, 64, 3)
    with pytest.raises(ValueError, match="topk_ids must be an int32 or int64 tensor"):
        K.ep_layout(ids.float(), E, 64, 64)
    with pytest.raises(ValueError, match=r"topk_ids must be \[tokens, topk\]"):
        K.ep_layout(ids.view(-1), E, 64, 64)
    with pytest.raises(ValueError, match="topk_weights must be"):
        K.ep_gather(torch.zeros(4, H, dtype=torch.bfloat16), torch.ones(T, 2), ids)
