"""The read floor: how long a kernel that does nothing but stream N bytes from device memory takes,
timed as bench/gemm.py times its GEMMs (CUDA-graph replays over operand sets rotated past the L2, so
each call reads device memory, not the cache the call before filled), its launch and drain included.

    PYTHONPATH=. python3 bench/read_floor.py [--mb 14.68 29.36] [--out F]

A memory-bound GEMM (a decode batch's weights) reads at least its weight's bytes, so this floor (the
fastest read of the sweep) is what a GEMM of that size can hope to approach on the same GPU;
bench/gemm.py's limit (bytes at the large-copy bandwidth) leaves out the fixed cost of a launch, which
dominates at a few MB. The floor is the fastest of a small sweep (words per program step, programs,
warps); the kernel XORs every 32-bit word once, and the result is checked, so a configuration cannot
pass by skipping bytes.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
import triton
import triton.language as tl

from bench.common import dump, environment, operand_sets, rotated_ms
from rtp_fp8.arch import num_sms

BLOCKS = (1024, 4096)  # int32 words per program step (4 and 16 KB)
PROGRAMS_PER_SM = (1, 2, 4, 8)  # persistent grids; and one program per step (one pass each)
WARPS = (4, 8)


@triton.jit
def _xor(a, b):
    return a ^ b


@triton.jit
def _read_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    """out[pid] = the XOR of words pid*BLOCK + i*programs*BLOCK + [0, BLOCK) of x (i = 0, 1, ...)."""
    pid = tl.program_id(0)
    step = tl.num_programs(0) * BLOCK
    acc = tl.zeros([BLOCK], dtype=tl.int32)
    for start in range(pid * BLOCK, n, step):
        offs = start + tl.arange(0, BLOCK)
        acc ^= tl.load(x_ptr + offs, mask=offs < n, other=0, eviction_policy="evict_first")
    tl.store(out_ptr + pid, tl.reduce(acc, 0, _xor))


def configs(nwords: int, sms: int) -> list[tuple[int, int, int]]:
    """(BLOCK, programs, num_warps) to try for nwords words on sms SMs: persistent grids of 1-8
    programs per SM, and one program per BLOCK words (each reads one step)."""
    out = []
    for block in BLOCKS:
        grids = sorted({min(p * sms, triton.cdiv(nwords, block)) for p in PROGRAMS_PER_SM}
                       | {triton.cdiv(nwords, block)})
        out += [(block, g, w) for g in grids for w in WARPS]
    return out


def read_xor(x: torch.Tensor, out: torch.Tensor, block: int, programs: int, warps: int) -> int:
    """Run the read kernel over x (int32, contiguous) into out[:programs]; the XOR of x's words."""
    if x.dtype != torch.int32 or not x.is_contiguous():
        raise ValueError(f"read_xor: x must be contiguous int32, got {x.dtype}")
    if out.numel() < programs:
        raise ValueError(f"read_xor: out has {out.numel()} slots for {programs} programs")
    _read_kernel[(programs,)](x, out, x.numel(), BLOCK=block, num_warps=warps)
    return expected_xor(out[:programs])


def expected_xor(x: torch.Tensor) -> int:
    """The XOR of x's int32 words, as read_xor returns it."""
    return int(np.bitwise_xor.reduce(x.cpu().numpy()))


def read_floor_us(nbytes: int, sms: int | None = None) -> tuple[float, dict]:
    """(microseconds, config) of the fastest configuration reading nbytes (rounded down to whole words)
    per call, over operand sets rotated past the L2 (config["each"]: every configuration's time);
    each configuration's XOR is checked first."""
    sms = sms or num_sms(torch.cuda.current_device())
    nwords = nbytes // 4
    most = max(g for _, g, _ in configs(nwords, sms))

    def make():
        return (torch.randint(-2**31, 2**31 - 1, (nwords,), dtype=torch.int32, device="cuda"),
                torch.empty(most, dtype=torch.int32, device="cuda"))

    sets = operand_sets(make)
    want = expected_xor(sets[0][0])
    best, each = None, []
    for block, programs, warps in configs(nwords, sms):
        got = read_xor(*sets[0], block, programs, warps)
        if got != want:
            raise RuntimeError(f"read floor: BLOCK {block}, {programs} programs, {warps} warps read "
                               f"XOR {got:#x}, not {want:#x}")
        ms = rotated_ms(lambda x, out, b=block, p=programs, w=warps: _read_kernel[(p,)](
            x, out, nwords, BLOCK=b, num_warps=w), sets)
        each.append({"block": block, "programs": programs, "num_warps": warps, "us": ms * 1e3})
        if best is None or ms < best[0]:
            best = (ms, {"block": block, "programs": programs, "num_warps": warps, "operand_sets": len(sets)})
    return best[0] * 1e3, {**best[1], "each": each}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=float, nargs="+", default=[7168 * 2048 / 1e6, 4096 * 7168 / 1e6],
                    help="sizes in MB (1e6 bytes); default: DeepSeek-V3's expert down and gate_up weights")
    ap.add_argument("--out")
    args = ap.parse_args()
    env = environment()
    print(env)
    sms = num_sms(torch.cuda.current_device())
    rows = []
    for mb in args.mb:
        us, cfg = read_floor_us(int(mb * 1e6), sms)
        rows.append({"mb": mb, "us": us, "gbs": mb * 1e3 / us, **cfg})
        one_per_sm = min((c for c in cfg["each"] if c["programs"] <= sms), key=lambda c: c["us"])
        print(f"{mb:8.2f} MB  {us:6.2f} us  {mb * 1e3 / us:6.0f} GB/s  BLOCK {cfg['block']}, {cfg['programs']} "
              f"programs, {cfg['num_warps']} warps; one program per SM at best {one_per_sm['us']:.2f} us", flush=True)
    if args.out:
        dump(args.out, {"env": env, "results": rows})


if __name__ == "__main__":
    main()
