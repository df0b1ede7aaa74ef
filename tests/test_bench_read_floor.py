"""bench/read_floor.py's kernel, host side and under the interpreter: every configuration it times
reads each 32-bit word exactly once (the XOR of its words is numpy's), so the floor cannot come from a
grid that skips bytes; the sweep includes persistent grids and one program per step. The timings
themselves come from GPU runs (docs/perf.md)."""

import pytest
import torch

from bench import read_floor as R


def test_configs_cover_persistent_grids_and_one_pass():
    cfgs = R.configs(3_670_016, 132)  # a 7168 x 2048 weight's words
    for block in R.BLOCKS:
        grids = {g for b, g, _ in cfgs if b == block}
        assert -(-3_670_016 // block) in grids  # one program per step
        assert {132, 264, 528} <= grids
    assert {w for _, _, w in cfgs} == set(R.WARPS)
    small = R.configs(3000, 132)  # fewer steps than SMs: grids capped at the step count
    assert {g for b, g, _ in small if b == 1024} == {3} and {g for b, g, _ in small if b == 4096} == {1}


@pytest.mark.parametrize("nwords,block,programs", [(5000, 1024, 3), (5000, 1024, 5), (4096, 4096, 1),
                                                   (12345, 1024, 2)])
def test_read_xor_reads_every_word_once(nwords, block, programs):
    g = torch.Generator().manual_seed(nwords + programs)
    x = torch.randint(-2**31, 2**31 - 1, (nwords,), dtype=torch.int32, generator=g)
    out = torch.full((8,), 7, dtype=torch.int32)
    assert R.read_xor(x, out, block, programs, 4) == R.expected_xor(x)
    x[nwords // 2] ^= 1 << 9  # one word changed: the XOR moves
    assert R.read_xor(x, out, block, programs, 4) == R.expected_xor(x)


def test_read_xor_refuses_bad_operands():
    with pytest.raises(ValueError, match="contiguous int32"):
        R.read_xor(torch.zeros(8, dtype=torch.int64), torch.zeros(4, dtype=torch.int32), 1024, 1, 4)
    with pytest.raises(ValueError, match="3 programs"):
        R.read_xor(torch.zeros(8, dtype=torch.int32), torch.zeros(2, dtype=torch.int32), 1024, 3, 4)


def test_tile_configs_cover_one_to_eight_blocks_and_whole_rows():
    assert R.tile_configs(512) == [(1, False), (1, True), (2, False), (2, True), (4, False), (4, True),
                                   (8, False), (8, True), (16, False)]  # K=2048: 16 K blocks a row
    assert R.tile_configs(40) == [(1, False), (1, True), (2, False)]  # 2 blocks (the second partial)


@pytest.mark.parametrize("n,kw,rows", [(7, 64, 56), (130, 40, 56), (64, 96, 32), (33, 32, 3)])
def test_read_tiles_xor_reads_every_word_once(n, kw, rows):
    """Ragged stripes (N not a multiple of the rows, rows not a power of two) and a partial last K block."""
    g = torch.Generator().manual_seed(n * kw + rows)
    x = torch.randint(-2**31, 2**31 - 1, (n, kw), dtype=torch.int32, generator=g)
    out = torch.full((64,), 7, dtype=torch.int32)
    for group, k_major in R.tile_configs(kw):
        assert R.read_tiles_xor(x, out, rows, group, k_major) == R.expected_xor(x), (group, k_major)
    x[n - 1, kw - 1] ^= 1 << 3  # the last word changed: the XOR moves
    x[n // 2, 0] ^= 1 << 30
    for group, k_major in R.tile_configs(kw):
        assert R.read_tiles_xor(x, out, rows, group, k_major) == R.expected_xor(x), (group, k_major)


def test_read_tiles_xor_refuses_bad_operands():
    x = torch.zeros(4, 32, dtype=torch.int32)
    with pytest.raises(ValueError, match="2-D contiguous int32"):
        R.read_tiles_xor(x.view(-1), torch.zeros(4, dtype=torch.int32), 4, 1, False)
    with pytest.raises(ValueError, match="rows and group must be >= 1"):
        R.read_tiles_xor(x, torch.zeros(4, dtype=torch.int32), 0, 1, False)
    with pytest.raises(ValueError, match="2 slots for 4 programs"):
        R.read_tiles_xor(torch.zeros(4, 128, dtype=torch.int32), torch.zeros(2, dtype=torch.int32), 4, 1, False)
    with pytest.raises(ValueError, match="multiple of 4"):
        R.tile_floor_us(8, 130, 4)
