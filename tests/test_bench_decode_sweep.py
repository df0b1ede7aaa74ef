"""bench/decode_sweep.py's masked check, host side: _masked_mismatch compares what a masked call
writes below masked_m under two settings of block_scaled's flags (each over a NaN-poisoned out) and
names the experts that differ, so that a timed variant which computes something else is reported
instead of timed. Run here under the interpreter on CPU tensors; the timings come from the GPU."""

import torch

from bench import decode_sweep as S
from helpers import quantized_weights
from rtp_fp8.gemm.triton import block_scaled as G
from rtp_fp8.quant import layout as L
from rtp_fp8.quant import token_group as T


def _set(e=3, mmax=80, n=128, k=256):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(e * mmax, k, generator=g).to(torch.bfloat16)
    a, sa_flat = T.per_token_group_quant(x, 128, scale_layout="col_tma")
    sa = L.alloc_scales((e,), mmax, k // 128, "col_tma", "cpu")
    for i in range(e):
        sa[i].copy_(sa_flat[i * mmax:(i + 1) * mmax])
    b, sb = quantized_weights((torch.randn(e, n, k, generator=g) / k**0.5).to(torch.bfloat16), "fp32")
    mm = torch.tensor([80, 0, 33], dtype=torch.int32)
    return a.view(e, mmax, k), sa, b, sb, mm, torch.empty(e, mmax, n, dtype=torch.bfloat16)


def _call(a, sa, b, sb, mm, out):
    G.m_grouped_fp8_gemm_nt_masked(a, sa, b, sb, mm, expected_m=80, out=out)


def test_the_tma_kernel_writes_what_the_pointer_kernel_writes():
    assert S._masked_mismatch(_call, [_set()], {"USE_TMA": False}, {}) == ""


def test_a_variant_that_writes_other_rows_is_named():
    def off_by_one(a, sa, b, sb, mm, out):
        _call(a, sa, b, sb, mm, out)
        if G.USE_TMA:
            out[2, 32] += 1  # the last row expert 2 owns

    got = S._masked_mismatch(off_by_one, [_set()], {"USE_TMA": False}, {})
    assert got == "differs from the pointer kernel in experts [2]"
