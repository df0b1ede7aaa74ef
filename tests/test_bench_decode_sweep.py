"""bench/decode_sweep.py's masked check, host side: _tma_mismatch compares what a masked call writes
below masked_m through the TMA kernel and through the pointer kernel (each over a NaN-poisoned out)
and names the experts that differ, so that a timed variant which computes something else is
reported instead of timed. Run here under the interpreter on CPU tensors; the timings come from
the GPU."""

import torch

from bench import decode_sweep as S
from helpers import masked_operands
from rtp_fp8.gemm.triton import block_scaled as G


def _set(e=3, mmax=80, n=128, k=256):
    mm = torch.tensor([80, 0, 33], dtype=torch.int32)
    return *masked_operands(e, mmax, n, k, "fp32", "cpu", seed=3), mm, torch.empty(e, mmax, n, dtype=torch.bfloat16)


def _call(a, sa, b, sb, mm, out):
    G.m_grouped_fp8_gemm_nt_masked(a, sa, b, sb, mm, expected_m=80, out=out)


def test_the_tma_kernel_writes_what_the_pointer_kernel_writes():
    assert S._tma_mismatch(_call, [_set()]) == ""


def test_a_variant_that_writes_other_rows_is_named():
    def off_by_one(a, sa, b, sb, mm, out):
        _call(a, sa, b, sb, mm, out)
        if G.USE_TMA:
            out[2, 32] += 1  # the last row expert 2 owns

    assert S._tma_mismatch(off_by_one, [_set()]) == "differs from the pointer kernel in experts [2]"
