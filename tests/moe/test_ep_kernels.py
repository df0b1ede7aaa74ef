"""EP count/layout/scatter/gather kernels vs plain-torch oracles (exact where exact)."""

import pytest
import torch

from helpers import DEVICES
from rtp_fp8.moe import ep_kernels as K

E, TOPK, T, H = 8, 4, 37, 256


@pytest.fixture(params=["small", "large"])
def layout_path(request, monkeypatch):
    """Both masked-layout paths: one launch for small batches, count + plan launches above SMALL_ROUTES."""
    if request.param == "large":
        monkeypatch.setattr(K, "SMALL_ROUTES", 0)
    return request.param


@pytest.fixture(params=["direct", "row_map"])
def scale_path(request, monkeypatch):
    """Both ways column-major scale rows reach out_scales: written in place, and (above
    ROW_MAP_ROUTES) by a second launch that reads each destination row's token from the
    scatter's row map."""
    if request.param == "row_map":
        monkeypatch.setattr(K, "ROW_MAP_ROUTES", 0)
    return request.param


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
@pytest.mark.parametrize("align,h", [(1, H), (64, H), (128, H), (128, 8192 + 256)])  # rows longer than one chunk
def test_layout_and_scatter_exact(device, align, h):
    ids = _ids(device, seed=align)
    cap = K.workspace_rows(T * TOPK, E, align)
    counts, starts, mi, counters = K.ep_layout(ids, E, cap, align)
    oc, os_, om, inv = _oracle_layout(ids, align, cap)
    assert counts.cpu().tolist() == oc.tolist() and starts.cpu().tolist() == os_.tolist()
    assert torch.equal(mi.cpu(), om) and counters.cpu().tolist() == [inv, 0]

    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, 120, (T, h), generator=g, dtype=torch.uint8).view(torch.float8_e4m3fn).to(device)
    xs = (torch.rand(T, 2, generator=g) + 0.5).to(device)
    guard = 16
    buf = torch.full((cap + guard, h), 0x7B, dtype=torch.uint8, device=device).view(torch.float8_e4m3fn)
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


def _in_token_order(ids, starts, e_off=0):
    """The deterministic layout: each expert's rows in (token, k) order."""
    flat = ids.cpu().view(-1).tolist()
    nxt = {e: int(starts[e]) for e in range(len(starts))}
    out = []
    for g in flat:
        e = g - e_off
        if 0 <= e < len(starts):
            out.append(nxt[e])
            nxt[e] += 1
        else:
            out.append(-1)
    return torch.tensor(out, dtype=torch.int32).view(ids.shape)


@pytest.mark.parametrize("device", DEVICES)
def test_deterministic_scatter_keeps_token_order(device):
    # more pairs than one 128-pair block, so block prefixes matter
    g = torch.Generator().manual_seed(11)
    t, topk = 150, 4
    ids = torch.randint(-1, E + 2, (t, topk), generator=g, dtype=torch.int32).to(device)
    cap = K.workspace_rows(t * topk, E, 64)
    counts, starts, mi, counters = K.ep_layout(ids, E, cap, 64)
    x = torch.randint(0, 120, (t, H), generator=g, dtype=torch.uint8).view(torch.float8_e4m3fn).to(device)
    xs = torch.rand(t, 2, generator=g).to(device)
    buf = torch.full((cap, H), 0x7B, dtype=torch.uint8, device=device).view(torch.float8_e4m3fn)
    sbuf = torch.full((cap, 2), float("nan"), device=device)
    oidx = K.ep_scatter(x, xs, ids, starts, buf, sbuf, counters, deterministic=True)
    assert torch.equal(oidx.cpu(), _in_token_order(ids, starts.cpu()))
    again = K.ep_scatter(x, xs, ids, starts, buf.clone(), sbuf.clone(), counters, deterministic=True)
    assert torch.equal(again, oidx)
    ic = ids.cpu()
    assert counters.cpu().tolist() == [int(((ic < 0) | (ic >= E)).sum()), 0]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "deterministic"])
def test_masked_layout_with_ep_offset_and_overflow(device, deterministic, layout_path):
    """256 global experts over EP=4: this rank owns [64, 128); others' ids are skipped, not counted;
    ids outside [0, 256) are counted; an expert over max_m drops the excess, counted exactly."""
    g = torch.Generator().manual_seed(12)
    t, topk, e_loc, e_off, ng, max_m = 40, 8, 64, 64, 256, 3
    ids = torch.randint(0, ng, (t, topk), generator=g, dtype=torch.int32)
    ids[:6, 0] = 70  # six tokens on one local expert: 3 over max_m
    ids[6, 1], ids[7, 2], ids[8, 3] = -1, 256, 9999
    ids = ids.to(device)
    counts, starts, masked_m, counters = K.ep_masked_layout(ids, e_loc, max_m, expert_offset=e_off,
                                                            num_global_experts=ng)
    ic = ids.cpu()
    loc = ic - e_off
    local = (loc >= 0) & (loc < e_loc)
    want_counts = torch.bincount(loc[local].long(), minlength=e_loc)
    assert counts.cpu().tolist() == want_counts.tolist()
    assert masked_m.cpu().tolist() == want_counts.clamp(max=max_m).tolist()
    assert starts.cpu().tolist() == [e * max_m for e in range(e_loc)]
    assert counters.cpu().tolist() == [3, 0]

    cap = e_loc * max_m
    x = torch.randint(0, 120, (t, H), generator=g, dtype=torch.uint8).view(torch.float8_e4m3fn).to(device)
    xs = torch.rand(t, 2, generator=g).to(device)
    buf = torch.full((cap + 4, H), 0x7B, dtype=torch.uint8, device=device).view(torch.float8_e4m3fn)
    sbuf = torch.full((cap + 4, 2), float("nan"), device=device)
    oidx = K.ep_scatter(x, xs, ids, starts, buf[:cap], sbuf[:cap], counters, ends=starts + max_m,
                        expert_offset=e_off, deterministic=deterministic).cpu()
    dropped = int((want_counts - max_m).clamp(min=0).sum())
    assert dropped >= 3 and counters.cpu().tolist() == [3, dropped]
    for e in range(e_loc):
        rows = sorted(oidx[local & (loc == e)].tolist())
        kept = [r for r in rows if r >= 0]
        assert kept == list(range(e * max_m, e * max_m + min(int(want_counts[e]), max_m)))
    if deterministic:  # the first max_m tokens in order keep their rows
        want = _in_token_order(ids, starts.cpu(), e_off)
        want[(want >= 0) & ~(want < ((loc.clamp(0, e_loc - 1)) + 1) * max_m)] = -1
        assert torch.equal(oidx, want)
    assert bool((buf.view(torch.uint8)[cap:].cpu() == 0x7B).all()) and bool(torch.isnan(sbuf[cap:].cpu()).all())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.int32, torch.float32], ids=["ue8m0", "fp32"])
def test_scatter_moves_column_major_scales(device, dtype, scale_path):
    """Scale rows are addressed by strides: packed UE8M0 int32 or FP32, MN-major with a
    TMA-aligned input stride; out_scales is a view of a taller column-major buffer whose
    rows past the capacity (guards, in every column) must stay untouched."""
    g = torch.Generator().manual_seed(13)
    t, topk, sk, guard = 9, 2, 3, 5
    ids = torch.randint(0, E, (t, topk), generator=g, dtype=torch.int32).to(device)
    ids[4, 1] = -1
    cap = K.workspace_rows(t * topk, E, 4)
    _, starts, _, counters = K.ep_layout(ids, E, cap, 4)
    x = torch.randint(0, 120, (t, H), generator=g, dtype=torch.uint8).view(torch.float8_e4m3fn).to(device)
    xs = torch.empty_strided((t, sk), (1, 12), dtype=dtype, device=device)  # stride align(9, 4) = 12
    src = torch.randint(0, 2**31 - 1, (t, sk), generator=g, dtype=torch.int32)
    xs.copy_(src if dtype == torch.int32 else src.float() / 2**20)
    full = torch.empty_strided((cap + guard, sk), (1, cap + guard), dtype=dtype, device=device)
    full.fill_(0x7B7B7B7B if dtype == torch.int32 else float("nan"))
    buf = torch.empty(cap, H, dtype=torch.float8_e4m3fn, device=device)
    oidx = K.ep_scatter(x, xs, ids, starts, buf, full[:cap], counters).cpu()
    osc, xsc, fc = full[:cap].cpu(), xs.cpu(), full.cpu()
    for tt in range(t):
        for k in range(topk):
            d = int(oidx[tt, k])
            assert (d >= 0) == (int(ids[tt, k]) >= 0)
            if d >= 0:
                assert torch.equal(osc[d], xsc[tt]) and torch.equal(buf[d].view(torch.uint8).cpu(),
                                                                    x[tt].view(torch.uint8).cpu())
    guards = fc[cap:]
    assert bool((guards == 0x7B7B7B7B).all()) if dtype == torch.int32 else bool(torch.isnan(guards).all())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.int32, torch.float32], ids=["ue8m0", "fp32"])
@pytest.mark.parametrize("src_major", ["row", "col"])
def test_scales_by_row_map(device, dtype, src_major):
    """The second launch of the row-map path: out_scales[r] = x_scales[map[r]] exactly; a map
    entry outside [0, T) (-1, T, large, negative large) gives a zero row and reads nothing;
    guard rows below the capacity in every column stay untouched."""
    g = torch.Generator().manual_seed(21)
    t, sk, cap, guard = 11, 5, 300, 4  # cap > one block of SCALE_ROWS rows
    src = torch.randint(1, 2**31 - 1, (t, sk), generator=g, dtype=torch.int32)
    src = src if dtype == torch.int32 else src.float() / 2**20
    xs = src.to(device) if src_major == "row" else src.t().contiguous().t().to(device)
    rmap = torch.randint(0, t, (cap,), generator=g, dtype=torch.int32)
    rmap[[0, 7, 150, 299]] = torch.tensor([-1, t, 2**30, -2**31], dtype=torch.int32)
    full = torch.empty_strided((cap + guard, sk), (1, cap + guard), dtype=dtype, device=device)
    full.fill_(0x7B7B7B7B if dtype == torch.int32 else float("nan"))
    K._scales_by_row(rmap.to(device), xs, full[:cap])
    fc = full.cpu()
    ok = (rmap >= 0) & (rmap < t)
    assert torch.equal(fc[:cap][ok], src[rmap[ok].long()])
    assert bool((fc[:cap][~ok] == 0).all())
    guards = fc[cap:]
    assert bool((guards == 0x7B7B7B7B).all()) if dtype == torch.int32 else bool(torch.isnan(guards).all())


def test_scatter_and_layout_bad_input():
    ids = _ids("cpu", seed=0)
    x = torch.zeros(T, H, dtype=torch.float8_e4m3fn)
    _, starts, _, counters = K.ep_layout(ids, E, 512, 64)
    buf = torch.empty(512, H, dtype=torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="out_scales must be"):
        K.ep_scatter(x, torch.ones(T, 2), ids, starts, buf, torch.ones(512, 2, dtype=torch.int32), counters)
    with pytest.raises(ValueError, match="x_scales must be"):
        K.ep_scatter(x, torch.ones(T + 1, 2), ids, starts, buf, torch.ones(512, 2), counters)
    with pytest.raises(ValueError, match="out must be"):
        K.ep_scatter(x, torch.ones(T, 2), ids, starts, buf[:, :128], torch.ones(512, 2), counters)
    with pytest.raises(ValueError, match="expert_offset=60"):
        K.ep_layout(ids, E, 64, 64, expert_offset=60, num_global_experts=64)
    with pytest.raises(ValueError, match="max_m must be"):
        K.ep_masked_layout(ids, E, 0)
    with pytest.raises(ValueError, match="alignment must be a power of two in"):
        K.ep_layout(ids, E, 64, 512)
    with pytest.raises(ValueError, match="counters must be"):
        K.ep_layout(ids, E, 64, 64, counters=torch.zeros(3, dtype=torch.int32))
    with pytest.raises(ValueError, match="counters must be a contiguous"):
        K.ep_layout(ids, E, 64, 64, counters=torch.zeros(4, dtype=torch.int32)[::2])
    for bad in (None, torch.zeros(4, dtype=torch.int32)[::2]):  # the overflow count must reach the caller
        with pytest.raises(ValueError, match="counters must be a contiguous"):
            K.ep_scatter(x, torch.ones(T, 2), ids, starts, buf, torch.ones(512, 2), bad)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("num_experts,hist_limit", [(8, 64), (8, 0), (100, 64)])
def test_counts_both_count_paths(device, num_experts, hist_limit, monkeypatch):
    """Per-expert counts and the invalid-id counter are exact whether the count kernel sums
    each block in registers (num_experts <= HIST_EXPERTS) or issues one atomic per id."""
    monkeypatch.setattr(K, "HIST_EXPERTS", hist_limit)
    g = torch.Generator().manual_seed(11)
    ng = num_experts + 16  # ids of another rank's experts: skipped, not counted as invalid
    ids = torch.randint(-3, ng + 3, (301, 6), generator=g, dtype=torch.int32)
    flat = ids.view(-1).long()
    want = torch.bincount(flat[(flat >= 0) & (flat < num_experts)], minlength=num_experts).int()
    invalid = int(((flat < 0) | (flat >= ng)).sum())
    counters = torch.zeros(2, dtype=torch.int32, device=device)
    counts, _, _, counters = K.ep_layout(ids.to(device), num_experts, 4096, 1, num_global_experts=ng,
                                         counters=counters)
    assert torch.equal(counts.cpu(), want)
    assert counters.cpu().tolist() == [invalid, 0]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("align", [1, 64, 128])
@pytest.mark.parametrize("dtype", [torch.float32, torch.int32], ids=["fp32", "ue8m0"])
def test_dispatch_equals_layout_then_scatter(device, align, dtype, scale_path):
    """ep_dispatch (row_map: the plan folded into the scatter and the by-row scale launch) gives
    the oracle's counts, starts, m_indices (into a given buffer with guards), counters, output
    rows and moved bytes and scales; padding rows, guard rows and guard columns stay untouched."""
    g = torch.Generator().manual_seed(31 + align)
    ids = _ids(device, seed=align)
    cap, sk, guard = K.workspace_rows(T * TOPK, E, align), 3, 6
    oc, os_, om, inv = _oracle_layout(ids, align, cap)
    x = torch.randint(0, 120, (T, H), generator=g, dtype=torch.uint8).view(torch.float8_e4m3fn).to(device)
    src = torch.randint(1, 2**31 - 1, (T, sk), generator=g, dtype=torch.int32)
    src = src if dtype == torch.int32 else src.float() / 2**20
    xs = torch.empty_strided((T, sk), (1, 40), dtype=dtype, device=device)  # column-major, stride align(37, 4)
    xs.copy_(src)
    poison = 0x7B7B7B7B if dtype == torch.int32 else float("nan")
    full_s = torch.empty_strided((cap + guard, sk + 1), (1, cap + guard), dtype=dtype, device=device).fill_(poison)
    buf = torch.full((cap + guard, H), 0x7B, dtype=torch.uint8, device=device).view(torch.float8_e4m3fn)
    mi_buf = torch.full((cap + guard, ), 12345, dtype=torch.int32, device=device)
    lay, oidx = K.ep_dispatch(x, xs, ids, E, buf[:cap], full_s[:cap, :sk], align, m_indices=mi_buf[:cap])
    counts, starts, mi, counters = lay
    assert counts.cpu().tolist() == oc.tolist() and starts.cpu().tolist() == os_.tolist()
    assert mi.data_ptr() == mi_buf.data_ptr() and torch.equal(mi_buf[:cap].cpu(), om)
    assert bool((mi_buf[cap:] == 12345).all()) and counters.cpu().tolist() == [inv, 0]
    oidx, ids_c = oidx.cpu(), ids.cpu()
    for e in range(E):
        assert sorted(oidx[ids_c == e].tolist()) == list(range(int(os_[e]), int(os_[e] + oc[e]))), f"expert {e}"
    assert bool((oidx[(ids_c < 0) | (ids_c >= E)] == -1).all())
    bufc, fs, xb = buf.view(torch.uint8).cpu(), full_s.cpu(), x.view(torch.uint8).cpu()
    for t in range(T):
        for k in range(TOPK):
            d = int(oidx[t, k])
            if d >= 0:
                assert torch.equal(bufc[d], xb[t]) and torch.equal(fs[d, :sk], src[t])
    assert bool((bufc[:cap][om == -1] == 0x7B).all()) and bool((bufc[cap:] == 0x7B).all())
    rest = torch.cat([fs[cap:].flatten(), fs[:, sk]])  # guard rows, and the guard column past the view
    assert bool((rest == poison).all()) if dtype == torch.int32 else bool(torch.isnan(rest).all())


@pytest.mark.parametrize("device", DEVICES)
def test_dispatch_overflow_and_bad_input(device, scale_path):
    """A capacity below what the layout needs: the rows past it are dropped and counted exactly,
    m_indices stays within its length, nothing is written past the buffers."""
    ids = _ids(device, seed=5, invalid=False)
    cap, align = 200, 64
    full_cap = K.workspace_rows(T * TOPK, E, align)
    oc, os_, om, _ = _oracle_layout(ids, align, full_cap)
    dropped = int(sum(((os_[e] + torch.arange(int(oc[e]))) >= cap).sum() for e in range(E)))
    assert dropped > 0
    x = torch.full((T, H), 5, dtype=torch.uint8, device=device).view(torch.float8_e4m3fn)
    xs = torch.ones(40, 2, device=device).t().contiguous().t()[:T]
    buf = torch.full((cap + 8, H), 0x7B, dtype=torch.uint8, device=device).view(torch.float8_e4m3fn)
    sbuf = torch.full((2, cap + 8), float("nan"), device=device).t()
    lay, oidx = K.ep_dispatch(x, xs, ids, E, buf[:cap], sbuf[:cap], align)
    assert lay[3].cpu().tolist() == [0, dropped] and int((oidx.cpu() == -1).sum()) == dropped
    assert torch.equal(lay[2].cpu(), om[:cap]) and int(oidx.max()) < cap
    assert bool((buf.view(torch.uint8)[cap:].cpu() == 0x7B).all()) and bool(torch.isnan(sbuf[cap:].cpu()).all())
    for bad in (torch.zeros(cap - 1, dtype=torch.int32, device=device), torch.zeros(cap, device=device)):
        with pytest.raises(ValueError, match="m_indices must be"):
            K.ep_dispatch(x, xs, ids, E, buf[:cap], sbuf[:cap], align, m_indices=bad)
    with pytest.raises(ValueError, match="alignment must be a power of two"):
        K.ep_dispatch(x, xs, ids, E, buf[:cap], sbuf[:cap], 3)
    with pytest.raises(ValueError, match="out_scales must be"):
        K.ep_dispatch(x, xs, ids, E, buf[:cap], sbuf[:cap - 1], align)
    with pytest.raises(ValueError, match="x must be a tensor on topk_ids' device"):  # before any launch
        K.ep_dispatch(x.to("meta"), xs, ids, E, buf[:cap], sbuf[:cap], align)
    with pytest.raises(ValueError, match="out_scales must be a tensor on topk_ids' device"):
        K.ep_scatter(x, xs, ids, lay[1], buf[:cap], sbuf[:cap].to("meta"), lay[3])
