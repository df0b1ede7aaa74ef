"""Launch-shape sweep of the EP scatter on the GPU (the choice behind ep_kernels.SCATTER_WARPS
and ROW_MAP_ROUTES).

    PYTHONPATH=. python3 bench/moe_sweep.py [--out results.json]

bench/moe.py's setting (H=7168, topk=8, 32 local experts of 64, FP8 rows, T in {256, 4096,
16384}): the scatter kernel at 4/8/16 warps, col_tma scale rows written in place or through
the row map + a by-row scale launch, and row-major scales for comparison. (An earlier sweep also
timed a split scatter, slots then a tokens x row-chunks copy: slower at every T, dropped.)
Every variant's result is checked (each route's row and scales where its output_index
says) before it is timed. Ceilings measured in the same run: the copy bandwidth and a
write-only fill of the scatter's written bytes.
"""

from __future__ import annotations

import argparse
import functools

import torch

from bench.common import copy_bandwidth_gbs, dump, environment, graph_ms
from bench.moe import ALIGN, E_GLOBAL, E_LOCAL, TOPK, H, scatter_setup
from rtp_fp8.moe import ep_kernels as K

VARIANTS = ([(row_map, w, "") for row_map in (False, True) for w in (4, 8, 16)]
            + [(True, 8, ".cs"), (False, 8, ".cs")])  # .cs: streaming row stores


def run(t, layout):
    ids, _, x, xs, out, out_s, counters, local, _, nbytes = scatter_setup(t, layout)
    cap = out.shape[0]
    tok = torch.arange(t, device="cuda").repeat_interleave(TOPK)
    rows = []
    for row_map, warps, cm in VARIANTS:
        if row_map and layout == "row":
            continue

        def call(row_map=row_map, warps=warps, cm=cm):
            lay = K.ep_layout(ids, E_LOCAL, cap, ALIGN, num_global_experts=E_GLOBAL, counters=counters)
            oidx = torch.empty(t, TOPK, dtype=torch.int32, device="cuda")
            rmap, ts = K._row_map_buffers(xs, out_s) if row_map else (None, None)
            K._scatter_launch(x, xs, ids, oidx, lay[1], None, lay.cursor, out, out_s, oidx, counters, E_LOCAL, 0,
                              False, row_map=rmap, token_scales=ts, num_warps=warps, store_cm=cm)
            if row_map:
                K._scales_by_row(rmap, ts, out_s)
            return oidx

        out.view(torch.uint8).fill_(0x7B)
        oidx = call().view(-1)
        ok = oidx >= 0
        exact = bool(int(ok.sum()) == local and torch.equal(out.view(torch.uint8)[oidx[ok].long()],
                                                            x.view(torch.uint8)[tok[ok]])
                     and torch.equal(out_s[oidx[ok].long()], xs[tok[ok]]))
        ms = graph_ms(call)
        rows.append({"t": t, "layout": layout, "row_map": row_map, "warps": warps, "store": cm, "us": ms * 1e3,
                     "gbs": nbytes / (ms * 1e-3) / 1e9, "exact": exact})
    w = out.view(torch.uint8).view(-1)[: local * H]
    fill = graph_ms(lambda: w.fill_(3))
    # Where the shipped path's time goes: the layout launches, the scatter launch alone (its
    # cursor re-zeroed, a memset timed apart; with the row map when the shipped path uses it),
    # the by-row scale launch alone (from the scatter's aligned token rows; straight from
    # x_scales as given; and from the token rows with the plan, as ep_dispatch runs it).
    lay = K.ep_layout(ids, E_LOCAL, cap, ALIGN, num_global_experts=E_GLOBAL, counters=counters)
    oidx = torch.empty(t, TOPK, dtype=torch.int32, device="cuda")
    row_map = layout != "row" and t * TOPK > K.ROW_MAP_ROUTES
    rmap, ts = K._row_map_buffers(xs, out_s)
    parts = {"layout_us": graph_ms(lambda: K.ep_layout(ids, E_LOCAL, cap, ALIGN, num_global_experts=E_GLOBAL,
                                                       counters=counters)) * 1e3,
             "memset_us": graph_ms(lambda: lay.cursor.zero_()) * 1e3,
             "scatter_only_us": graph_ms(lambda: (lay.cursor.zero_(), K._scatter_launch(
                 x, xs, ids, oidx, lay[1], None, lay.cursor, out, out_s, oidx, counters,
                 E_LOCAL, 0, False, row_map=rmap if row_map else None,
                 token_scales=ts))) * 1e3}
    if row_map:
        plan = (lay[0], torch.empty_like(lay[1]), torch.empty_like(lay[2]), ALIGN)  # counts, starts, m_indices
        for br, warps in ((128, 4), (64, 4), (32, 4), (32, 2), (32, 8), (16, 4), (16, 2), (64, 8), (256, 8)):
            for name, src, p in (("", ts, None), ("_xs", xs, None), ("_plan", ts, plan)):
                parts[f"scales_r{br}w{warps}{name}_us"] = graph_ms(functools.partial(
                    K._scales_by_row, rmap, src, out_s, br, warps, p)) * 1e3
    return rows, {"t": t, "layout": layout, "write_only_gbs": w.numel() / (fill * 1e-3) / 1e9, "filled": w.numel(),
                  **parts}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    a = ap.parse_args()
    env = environment()
    copy = copy_bandwidth_gbs()
    rows, fills = [], []
    for t in (256, 4096, 16384):
        for layout in ("col_tma", "row"):
            r, f = run(t, layout)
            rows += r
            fills.append(f)
    for r in rows:
        r["ratio"] = r["gbs"] / copy
    if a.out:
        dump(a.out, {"bench": "moe_sweep", "env": env, "copy_gbs": copy, "results": rows, "fills": fills})
    print(env)
    print(f"copy {copy:.0f} GB/s; write-only fill: " +
          ", ".join(f"T={f['t']} {f['layout']} {f['write_only_gbs']:.0f}" for f in fills))
    for f in fills:
        print(f"T={f['t']} {f['layout']} parts (us): " + ", ".join(f"{k} {v:.1f}" for k, v in f.items()
                                                                  if k.endswith("_us")))
    for t in (256, 4096, 16384):
        for layout in ("col_tma", "row"):
            sel = sorted((r for r in rows if r["t"] == t and r["layout"] == layout), key=lambda r: r["us"])
            print(f"T={t} {layout}: " + ", ".join(
                f"{'row_map' if r['row_map'] else 'direct'}/w{r['warps']}{r['store']} {r['us']:.1f}us "
                f"{r['gbs']:.0f}{'' if r['exact'] else ' WRONG'}" for r in sel))


if __name__ == "__main__":
    main()
