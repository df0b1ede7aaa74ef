"""Where the MoE activation step's time goes (issue #28), timed on the GPU.

    PYTHONPATH=. python3 bench/silu_sweep.py [--out silu.json]

silu*mul+quant (token_group.silu_mul_quant_into) over R routed rows of gate_up [R, 2I] bf16
(bench/moe.py's forward: R = 16403, I = 2048; col_tma scales), every row read and written, beside
in the same run: a device copy of the same bytes (the step's floor), the quantization alone over
an [R, INTER] bf16 input (per_token_group_quant_into: half the reads, no silu), and the tile kernel's
launch configurations (CONFIGS). Each configuration's output must equal
the shipped one's bit for bit. CUDA-graph medians in us.
"""

from __future__ import annotations

import argparse

import torch

from bench.common import copy_ms, dump, environment, graph_ms
from rtp_fp8.arch import num_sms
from rtp_fp8.quant import layout as L
from rtp_fp8.quant import token_group as T

R, INTER = 16403, 2048
# (BLOCK_M, groups per program, warps, stages[, row programs per SM]) of the tile kernel: without the
# fifth entry a program per row block; with it a persistent grid of that many row programs per SM, each
# looping over row blocks. The shipped one is token_group's SILU_CONFIG + SILU_PROGRAMS_PER_SM; (4, 4, 4, 1)
# was shipped before it. The wider searches that chose it: docs/bench_silu_2026-12-06a.json, -06b.json.
CONFIGS = [(4, 4, 4, 1), (1, 4, 1, 1), (4, 4, 4, 1, 8), (4, 4, 4, 1, 16), (1, 4, 1, 1, 16), (1, 4, 1, 1, 32),
           (1, 4, 1, 1, 64), (1, 4, 1, 2, 32), (1, 16, 4, 1, 32)]


def launch_config(cfg):
    """cfg as _launch_tiles takes it: a fifth entry (programs per SM) times the SM count."""
    if len(cfg) < 5:
        return cfg
    return cfg[:4] + (cfg[4] * num_sms(torch.cuda.current_device()),)


def run():
    g = torch.Generator(device="cuda").manual_seed(0)
    gate_up = torch.randn(R, 2 * INTER, generator=g, device="cuda").to(torch.bfloat16)
    q = torch.empty(R, INTER, dtype=torch.float8_e4m3fn, device="cuda")
    s = L.alloc_scales((), R, INTER // 128, "col_tma", gate_up.device)
    nbytes = R * (2 * INTER * 2 + INTER + 4 * INTER // 128)
    res = {"rows": R, "inter": INTER, "bytes": nbytes}
    res["shipped"] = graph_ms(lambda: T.silu_mul_quant_into(gate_up, q, s, 128, "col_tma")) * 1e3
    ref_q, ref_s = q.clone(), s.clone()
    copy, moved = copy_ms(nbytes // 2, graph=True)
    res["copy same bytes"] = copy * 1e3
    x = gate_up[:, :INTER].contiguous()
    res["quant only [R, INTER]"] = graph_ms(lambda: T.per_token_group_quant_into(x, q, s, 128, "col_tma",
                                                                             backend="triton")) * 1e3
    print({k: (round(v, 1) if isinstance(v, float) else v) for k, v in res.items()}, flush=True)
    configs = {}
    for cfg in CONFIGS:
        q.fill_(0)

        def call(cfg=cfg):
            T._launch_tiles(gate_up, q, s, R, INTER // 128, 128, 1e-10, False, False, up_off=INTER,
                            config=launch_config(cfg))
        try:
            t = graph_ms(call) * 1e3
        except Exception as exc:  # noqa: BLE001 - a configuration that cannot run is reported
            configs[str(cfg)] = f"{type(exc).__name__}"
            continue
        same = torch.equal(q.view(torch.uint8), ref_q.view(torch.uint8)) and torch.equal(s, ref_s)
        configs[str(cfg)] = round(t, 2) if same else "differs"
        print(cfg, configs[str(cfg)], flush=True)
    res["configs"] = configs
    ok = {c: t for c, t in configs.items() if isinstance(t, float)}
    res["best"] = min(ok, key=ok.get) if ok else None
    print({k: (round(v, 1) if isinstance(v, float) else v) for k, v in res.items() if k != "configs"}, flush=True)
    print(sorted(ok.items(), key=lambda kv: kv[1])[:8], flush=True)
    return res


def run_skip(cap=36864, experts=32, align=128):
    """The executor's workspace: cap rows, expert segments of about R / experts routed rows each, padded
    to `align`, then padding to cap; m_indices -1 on padding. Each configuration skips the padding."""
    g = torch.Generator().manual_seed(1)
    counts = torch.multinomial(torch.ones(experts), R, replacement=True, generator=g).bincount(minlength=experts)
    ids = torch.full((cap,), -1, dtype=torch.int32)
    row = 0
    for e, c in enumerate(counts.tolist()):
        ids[row:row + c] = e
        row += (c + align - 1) // align * align
    ids = ids.cuda()
    gate_up = torch.randn(cap, 2 * INTER, device="cuda").to(torch.bfloat16)
    q = torch.empty(cap, INTER, dtype=torch.float8_e4m3fn, device="cuda")
    s = L.alloc_scales((), cap, INTER // 128, "col_tma", gate_up.device)
    res = {"cap": cap, "routed": R, "shipped": graph_ms(lambda: T.silu_mul_quant_into(
        gate_up, q, s, 128, "col_tma", m_indices=ids)) * 1e3}
    ref_q = q.clone()
    valid = ids >= 0
    for cfg in CONFIGS:
        q.fill_(0)

        def call(cfg=cfg):
            T._launch_tiles(gate_up, q, s, cap, INTER // 128, 128, 1e-10, False, False, up_off=INTER,
                            config=launch_config(cfg), skip=(1, ids, 1))
        t = graph_ms(call) * 1e3
        same = torch.equal(q[valid].view(torch.uint8), ref_q[valid].view(torch.uint8))
        res[str(cfg)] = round(t, 2) if same else "differs"
        print("skip", cfg, res[str(cfg)], flush=True)
    print({k: (round(v, 1) if isinstance(v, float) else v) for k, v in res.items()}, flush=True)
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--skip", action="store_true", help="also time the executor's padded workspace (m_indices)")
    args = ap.parse_args()
    res = {"env": environment(), "silu": run()}
    if args.skip:
        res["skip"] = run_skip()
    if args.out:
        dump(args.out, res)


if __name__ == "__main__":
    main()
