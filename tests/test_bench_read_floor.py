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
