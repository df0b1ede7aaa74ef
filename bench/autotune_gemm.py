"""Regenerate rtp_fp8/gemm/triton/configs.json: time candidate launch configs per M bucket.

    PYTHONPATH=. python3 bench/autotune_gemm.py            # print the winners
    PYTHONPATH=. python3 bench/autotune_gemm.py --write    # and rewrite configs.json

Per bucket, every candidate runs on the bucket's representative shapes (dense, FP32
scales, from bench/gemm.py's list); the winner has the best geometric-mean TFLOP/s. A
candidate that fails to compile or run (e.g. out of shared memory) is skipped.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math

from rtp_fp8.gemm.triton import block_scaled as G

# (max_m, representative (M, N, K) shapes, search space); the last bucket takes any M.
# Small M has few output tiles: 64-row tiles and narrower N tiles keep the SMs busy.
SMALL = {"BLOCK_M": [64], "BLOCK_N": [64, 128], "BLOCK_K": [128], "num_warps": [4],
         "num_stages": [3, 4, 5, 6], "GROUP_M": [8]}
LARGE = {"BLOCK_M": [64, 128], "BLOCK_N": [128, 256], "BLOCK_K": [128], "num_warps": [4, 8],
         "num_stages": [3, 4, 5], "GROUP_M": [8]}
BUCKETS = [
    (64, [(64, 7168, 16384), (64, 4096, 7168), (16, 2112, 7168)], SMALL),
    (256, [(128, 7168, 16384), (128, 4096, 7168), (256, 7168, 2048)], SMALL),
    (None, [(4096, 2112, 7168), (4096, 7168, 2048), (4096, 4096, 7168), (4096, 32768, 512)], LARGE),
]


def candidates(space: dict) -> list[dict]:
    keys = list(G.CONFIG_KEYS)
    return [dict(zip(keys, vals)) for vals in itertools.product(*(space[k] for k in keys))]


def pick(bench_ms, buckets=BUCKETS) -> list[dict]:
    """Best candidate per bucket; bench_ms(config, (m, n, k)) -> ms, raising when it cannot run."""
    out = []
    for max_m, shapes, space in buckets:
        best, best_score = None, -1.0
        for cfg in candidates(space):
            try:
                tflops = [2 * m * n * k / (bench_ms(cfg, (m, n, k)) * 1e-3) / 1e12 for m, n, k in shapes]
            except Exception as exc:  # noqa: BLE001 - a config that cannot run is not a candidate
                print(f"skip max_m={max_m} {cfg}: {type(exc).__name__}: {str(exc)[:80]}")
                continue
            score = math.exp(sum(math.log(t) for t in tflops) / len(tflops))
            print(f"max_m={max_m} {cfg}: {score:.0f} TFLOP/s (geomean)")
            if score > best_score:
                best, best_score = cfg, score
        if best is None:
            raise RuntimeError(f"no candidate ran for bucket max_m={max_m}")
        out.append({"max_m": max_m, "config": best, "geomean_tflops": round(best_score, 1)})
    return out


def write(buckets: list[dict], measured_on: str, path=G.CONFIG_TABLE) -> None:
    data = json.loads(path.read_text())
    data["buckets"] = [{"max_m": b["max_m"], "config": b["config"]} for b in buckets]
    data["measured_on"] = measured_on
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    G.config_table.cache_clear()


def gpu_bench_ms(cfg, shape):  # pragma: no cover - GPU only
    import torch

    from bench.common import graph_ms
    from rtp_fp8.quant import block as B
    from rtp_fp8.quant import token_group as T

    m, n, k = shape
    a, sa = T.per_token_group_quant(torch.randn(m, k, device="cuda", dtype=torch.bfloat16), 128,
                                    scale_layout="col_tma")
    b, sb = B.quantize_weight_blocks(torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5)
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    with G.config_override(cfg):
        return graph_ms(lambda: G.fp8_gemm_nt(a, sa, b, sb, out=out), rep=50)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--write", action="store_true", help="rewrite rtp_fp8/gemm/triton/configs.json")
    a = ap.parse_args()
    import torch

    buckets = pick(gpu_bench_ms)
    for b in buckets:
        print("winner", b)
    if a.write:
        write(buckets, f"{torch.cuda.get_device_name()} (bench/autotune_gemm.py)")


if __name__ == "__main__":
    main()
