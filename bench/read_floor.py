"""The read floor: how long a kernel that does nothing but stream N bytes from device memory takes,
timed as bench/gemm.py times its GEMMs (CUDA-graph replays over operand sets rotated past the L2, so
each call reads device memory, not the cache the call before filled), its launch and drain included.

    PYTHONPATH=. python3 bench/read_floor.py [--mb 14.68 29.36] [--tiles 7168x2048 4096x7168]
        [--tile-rows 56 32] [--out F]

A memory-bound GEMM (a decode batch's weights) reads at least its weight's bytes, so this floor (the
fastest read of the sweep) is what a GEMM of that size can hope to approach on the same GPU;
bench/gemm.py's limit (bytes at the large-copy bandwidth) leaves out the fixed cost of a launch, which
dominates at a few MB. The floor is the fastest of a small sweep (words per program step, programs,
warps); the kernel XORs every 32-bit word once, and the result is checked, so a configuration cannot
pass by skipping bytes.

--tiles times the same bytes read in a GEMM's weight pattern (tile_floor_us): an [N, K] byte matrix
as boxes of ROWS rows by 128 bytes (the narrow kernel's TMA boxes of B, --tile-rows), `group` K blocks
side by side per program (1: a row's 128-byte pieces fetched apart, as the GEMM's ring does; K / 128:
whole rows), one program per box group, taken stripe-major or K-major. Beside the contiguous floor of
the same bytes in the same run it shows what the boxes' access pattern costs device memory, if anything.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
import triton
import triton.language as tl

from bench.common import dump, environment, nk_pair, operand_sets, rotated_ms
from rtp_fp8.arch import num_sms
from rtp_fp8.quant.layout import cdiv

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


@triton.jit
def _read_tiles_kernel(x_ptr, out_ptr, n_rows, row_words, tiles_n, groups, ROWS: tl.constexpr,
                       ROWS_P2: tl.constexpr, COLS: tl.constexpr, COLS_P2: tl.constexpr, K_MAJOR: tl.constexpr):
    """out[pid] = the XOR of one [ROWS, COLS] box of x [n_rows, row_words] (int32): row stripe s and
    column group g of program pid = s * groups + g (stripe-major) or g * tiles_n + s (K_MAJOR)."""
    pid = tl.program_id(0)
    if K_MAJOR:
        stripe = pid % tiles_n
        group = pid // tiles_n
    else:
        stripe = pid // groups
        group = pid % groups
    r = tl.arange(0, ROWS_P2)
    rows = stripe * ROWS + r
    c = tl.arange(0, COLS_P2)
    cols = group * COLS + c
    mask = ((r < ROWS) & (rows < n_rows))[:, None] & ((c < COLS) & (cols < row_words))[None, :]
    v = tl.load(x_ptr + rows[:, None] * row_words + cols[None, :], mask=mask, other=0,
                eviction_policy="evict_first")
    tl.store(out_ptr + pid, tl.reduce(tl.reduce(v, 1, _xor), 0, _xor))


K_BLOCK_WORDS = 32  # one K block of an FP8 weight row: 128 bytes
TILE_GROUPS = (1, 2, 4, 8)  # K blocks per program side by side (and whole rows, see tile_configs)


def tile_configs(k_words: int) -> list[tuple[int, bool]]:
    """(group, k_major) to time for rows of k_words int32 words: 1, 2, 4 and 8 K blocks per program
    (those not over the row) and the whole row, each stripe-major and K-major (one order for whole rows)."""
    blocks = cdiv(k_words, K_BLOCK_WORDS)
    groups = sorted({g for g in TILE_GROUPS if g < blocks} | {blocks})
    return [(g, km) for g in groups for km in ((False, True) if g < blocks else (False,))]


def tile_programs(n: int, k_words: int, rows: int, group: int) -> int:
    """The tile read's programs over [N, K words]: one per box of `rows` rows by `group` K blocks."""
    return cdiv(n, rows) * cdiv(k_words, group * K_BLOCK_WORDS)


def _launch_tiles(x: torch.Tensor, out: torch.Tensor, rows: int, group: int, k_major: bool, warps: int) -> None:
    """_read_tiles_kernel over x [N, K words] in boxes of `rows` rows by `group` K blocks."""
    n, kw = x.shape
    tiles_n, cols = cdiv(n, rows), group * K_BLOCK_WORDS
    _read_tiles_kernel[(tile_programs(n, kw, rows, group),)](
        x, out, n, kw, tiles_n, cdiv(kw, cols), ROWS=rows, ROWS_P2=triton.next_power_of_2(rows), COLS=cols,
        COLS_P2=triton.next_power_of_2(cols), K_MAJOR=k_major, num_warps=warps)


def read_tiles_xor(x: torch.Tensor, out: torch.Tensor, rows: int, group: int, k_major: bool,
                   warps: int = 4) -> int:
    """Run the tile read over x ([N, K words] int32, contiguous) with boxes of `rows` rows by `group`
    K blocks into out[:programs]; the XOR of what it read (each word once: x's XOR)."""
    if x.dtype != torch.int32 or x.dim() != 2 or not x.is_contiguous():
        raise ValueError(f"read_tiles_xor: x must be 2-D contiguous int32, got {x.dtype} {tuple(x.shape)}")
    if rows < 1 or group < 1:
        raise ValueError(f"read_tiles_xor: rows and group must be >= 1, got {rows} and {group}")
    programs = tile_programs(*x.shape, rows, group)
    if out.numel() < programs:
        raise ValueError(f"read_tiles_xor: out has {out.numel()} slots for {programs} programs")
    _launch_tiles(x, out, rows, group, k_major, warps)
    return expected_xor(out[:programs])


def tile_floor_us(n: int, k: int, rows: int) -> list[dict]:
    """Each tile_configs read of an [N, K] FP8 weight's bytes (K a multiple of 4) in boxes of `rows`
    rows, timed over operand sets rotated past the L2 after its XOR is checked: [{"group", "k_major",
    "programs", "us"}], fastest first."""
    if k % 4:
        raise ValueError(f"tile_floor_us: K={k} must be a multiple of 4 (whole int32 words)")
    kw = k // 4
    most = tile_programs(n, kw, rows, 1)

    def make():
        return (torch.randint(-2**31, 2**31 - 1, (n, kw), dtype=torch.int32, device="cuda"),
                torch.empty(most, dtype=torch.int32, device="cuda"))

    sets = operand_sets(make)
    want = expected_xor(sets[0][0])
    each = []
    for group, k_major in tile_configs(kw):
        got = read_tiles_xor(*sets[0], rows, group, k_major)
        if got != want:
            raise RuntimeError(f"tile read: {rows} rows, group {group}, k_major {k_major} read XOR "
                               f"{got:#x}, not {want:#x}")
        ms = rotated_ms(lambda x, out, g=group, km=k_major: _launch_tiles(x, out, rows, g, km, 4), sets)
        each.append({"group": group, "k_major": k_major, "programs": tile_programs(n, kw, rows, group),
                     "us": ms * 1e3, "operand_sets": len(sets)})
    return sorted(each, key=lambda c: c["us"])


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
    """The XOR of x's int32 words (any shape), as read_xor returns it."""
    return int(np.bitwise_xor.reduce(x.cpu().numpy().reshape(-1)))


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
    ap.add_argument("--mb", type=float, nargs="*", default=[7168 * 2048 / 1e6, 4096 * 7168 / 1e6],
                    help="sizes in MB (1e6 bytes); default: DeepSeek-V3's expert down and gate_up weights")
    ap.add_argument("--tiles", nargs="*", type=nk_pair, default=[], metavar="NxK",
                    help="also read N x K byte weights in the GEMM's box pattern (tile_floor_us)")
    ap.add_argument("--tile-rows", type=int, nargs="+", default=[56, 32])
    ap.add_argument("--out")
    args = ap.parse_args()
    tiles = args.tiles
    if any(k % 4 for _, k in tiles):
        ap.error("--tiles: K must be a multiple of 4 (the reads are whole int32 words)")
    if min(args.tile_rows) < 1:
        ap.error(f"--tile-rows must be >= 1, got {args.tile_rows}")
    env = environment()
    print(env)
    sms = num_sms(torch.cuda.current_device())
    rows, floors = [], {}  # bytes -> read_floor_us, each size measured once
    for mb in args.mb:
        us, cfg = floors[int(mb * 1e6)] = read_floor_us(int(mb * 1e6), sms)
        rows.append({"mb": mb, "us": us, "gbs": mb * 1e3 / us, **cfg})
        one_per_sm = min((c for c in cfg["each"] if c["programs"] <= sms), key=lambda c: c["us"])
        print(f"{mb:8.2f} MB  {us:6.2f} us  {mb * 1e3 / us:6.0f} GB/s  BLOCK {cfg['block']}, {cfg['programs']} "
              f"programs, {cfg['num_warps']} warps; one program per SM at best {one_per_sm['us']:.2f} us", flush=True)
        if args.out:
            dump(args.out, {"env": env, "results": rows})
    for n, k in tiles:
        if n * k not in floors:
            floors[n * k] = read_floor_us(n * k, sms)
        us, cfg = floors[n * k]
        row = {"tiles": [n, k], "contiguous_us": us, "contiguous": cfg, "boxes": {}}
        print(f"{n} x {k} ({n * k / 1e6:.2f} MB): contiguous floor {us:.2f} us", flush=True)
        for rows_ in args.tile_rows:
            each = tile_floor_us(n, k, rows_)
            row["boxes"][rows_] = each
            cells = ", ".join(f"g{c['group']}{' K-major' if c['k_major'] else ''} {c['us']:.2f}" for c in each)
            print(f"    {rows_}-row boxes: {cells}  (best / contiguous {each[0]['us'] / us:.2f})", flush=True)
        rows.append(row)
        if args.out:
            dump(args.out, {"env": env, "results": rows})


if __name__ == "__main__":
    main()
