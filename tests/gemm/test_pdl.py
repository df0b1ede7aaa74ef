"""Programmatic dependent launches of the decode GEMMs: a kernel launched so (the swapped Triton kernel
when it splits K) may start while the kernel before it in the stream still runs. The kernel before is a
writer that lets its dependents launch at once (griddepcontrol.launch_dependents), then spins for a
while, then copies `out` away and writes every operand the GEMM reads (A, B, both scales, masked_m)
over an older operand set. The GEMM must read the new operands (not the old set it would find if it
loaded before waiting) and must not write `out` before the writer read it: its output must be the bits
of a plain launch on the new operands. The narrow kernel and sm90_ws (programmatic dependents where
USE_PDL) run it in both of their modes (block_scaled.NARROW_PDL, WS_PDL 1 and 2). The decode calls launched plainly (the
unsplit swapped kernel, the masked swapped kernel) run the same check, so that a launch made
programmatic later without its wait fails here."""

import pytest
import torch
import triton
import triton.language as tl

from helpers import assert_bits_equal, dense_operands, masked_operands, spy_ws_pdls
from rtp_fp8.gemm.triton import block_scaled as G

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(
    not (torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 9 and G.HAS_GDC),
    reason="programmatic dependent launch needs an SM90+ GPU and a Triton with grid dependency control")]
gdc_launch_dependents = G.gdc_launch_dependents
SPIN = 1_000_000  # the writer's steps before it writes: milliseconds, past the GEMM call's host time


@triton.jit
def _late_writer(src, dst, nbytes, out, saved, nout, spin, CHUNK: tl.constexpr):
    """Every program: let the dependents launch, spin `spin` steps, then copy out -> saved and
    src -> dst (bytes), striding over the programs."""
    gdc_launch_dependents()
    x = tl.program_id(0).to(tl.float32)
    for _ in range(spin):
        x = x * 0.5 + 1.0  # stays in [1, 2): the stores' masks below depend on it, so the loop stays
    live = x > 0.0
    step = tl.num_programs(0) * CHUNK
    for lo in range(tl.program_id(0) * CHUNK, nout, step):
        offs = lo + tl.arange(0, CHUNK)
        tl.store(saved + offs, tl.load(out + offs, mask=offs < nout), mask=(offs < nout) & live)
    for lo in range(tl.program_id(0) * CHUNK, nbytes, step):
        offs = lo + tl.arange(0, CHUNK)
        tl.store(dst + offs, tl.load(src + offs, mask=offs < nbytes), mask=(offs < nbytes) & live)


def _span(t):
    """The bytes from t's first element to its last (its strides' padding included), 256-byte rounded."""
    return ((1 + sum((s - 1) * st for s, st in zip(t.shape, t.stride()))) * t.element_size() + 255) // 256 * 256


def _carve(buf, tensors):
    """Views into the uint8 buffer buf, one per tensor, with its dtype, sizes and strides (each at a
    256-byte aligned offset), and their values copied in."""
    views, off = [], 0
    for t in tensors:
        v = torch.as_strided(buf[off:off + _span(t)].view(t.dtype), t.shape, t.stride())
        v.copy_(t)
        views.append(v)
        off += _span(t)
    return views


def _late_writes_then(call, old, new, out):
    """call(*views) launched right after a _late_writer that overwrites the views (holding `old`) with
    `new` and copies out away: what the writer found in out."""
    dst = torch.zeros(sum(map(_span, old)), dtype=torch.uint8, device="cuda")
    src = torch.zeros_like(dst)
    views = _carve(dst, old)
    _carve(src, new)
    saved = torch.empty_like(out)
    torch.cuda.synchronize()
    n16 = out.numel()
    _late_writer[(16,)](src, dst, dst.numel(), out.view(torch.int16), saved.view(torch.int16), n16, SPIN,
                        CHUNK=1024)
    call(*views)
    torch.cuda.synchronize()
    return saved


@pytest.mark.parametrize("m,n,k,kernel", [
    (1, 4096, 7168, "swap"),  # 4 K splits, then the split reduction (USE_NARROW off: it takes these rows first)
    (1, 16384, 2048, "swap"),  # unsplit
    (1, 4096, 7168, "narrow"),  # an A box of 1 row, where the swapped kernel would split K
    (4, 7168, 2048, "narrow"),  # an A box of 4 rows, 64x56 tiles
    (32, 4096, 7168, "narrow"),  # where the swapped kernel would split K
    (64, 7168, 2048, "narrow"),
    (128, 4096, 7168, "narrow"),
    (128, 7168, 2048, "ws"),  # sm90_ws 128x64 (the narrow kernel's 224 tiles of 64x64 would make two waves)
    (256, 7168, 2048, "ws"),  # sm90_ws 128x128
    (128, 1024, 7168, "ws"),  # sm90_ws 64x64 in 4 K splits, then the split reduction
])
def test_dense_decode_gemm_waits_for_the_kernel_before(monkeypatch, m, n, k, kernel):
    if kernel == "swap":
        monkeypatch.setattr(G, "USE_NARROW", False)
    old, new = dense_operands(m, n, k, seed=m + n), dense_operands(m, n, k, seed=m + n + 1)
    plain = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
    with monkeypatch.context() as mp:
        mp.setattr(G, "USE_PDL", False)
        G.fp8_gemm_nt(*new, out=plain)
        stale = G.fp8_gemm_nt(*old)
    assert not torch.equal(plain, stale)  # the old set would show
    if kernel == "narrow":
        if (why := G.narrow_refusal(*new, plain)) is not None:
            pytest.skip(f"the narrow kernel does not run here: {why}")
    elif kernel == "ws":
        if G.narrow_refusal(*new, plain) is None or G.ws_refusal(G.DENSE, *new, plain, False, G.GRAN) is not None:
            pytest.skip(f"sm90_ws does not run ({m}, {n}, {k}) here")
        pdls = spy_ws_pdls(monkeypatch)
    else:
        assert m <= G.SWAP_MAX_ROWS and G.USE_SWAP and G._pdl_args(plain.device, True)
    for mode in (1, 2) if kernel != "swap" else (None,):
        if mode is not None:
            monkeypatch.setattr(G, "NARROW_PDL" if kernel == "narrow" else "WS_PDL", mode)
            assert (G.narrow_pdl() if kernel == "narrow" else G.ws_pdl()) == mode
        # and its kernels compiled before the race
        assert_bits_equal(G.fp8_gemm_nt(*new), plain, "a dependent launch")
        poison = torch.randn(m, n, device="cuda").to(torch.bfloat16)
        out = poison.clone()
        saved = _late_writes_then(lambda a, sa, b, sb, out=out: G.fp8_gemm_nt(a, sa, b, sb, out=out), old, new, out)
        assert_bits_equal(saved, poison, "out as the writer read it")  # the GEMM wrote it only after
        assert_bits_equal(out, plain, f"({m}, {n}, {k}) {kernel} pdl {mode} after a late writer")
        if kernel == "ws":
            assert pdls and set(pdls) == {mode}
            pdls.clear()


def _masked_race(cap_n_k, seed, old_m, new_m):
    """(old, new, plain): two masked operand sets of 4 experts (operands and masked_m; seeds seed and
    seed + 1) and a zeroed output for them."""
    cap, n, k = cap_n_k
    sets = [(*masked_operands(4, cap, n, k, "fp32", "cuda", seed=seed + i),
             torch.tensor(mm, dtype=torch.int32, device="cuda")) for i, mm in enumerate((old_m, new_m))]
    return sets[0], sets[1], torch.zeros(4, cap, n, dtype=torch.bfloat16, device="cuda")


def test_masked_swap_waits_for_masked_m_and_its_operands(monkeypatch):
    old, new, plain = _masked_race((32, 4096, 2048), 3, [0, 5, 32, 1], [17, 32, 3, 0])
    with monkeypatch.context() as mp:
        mp.setattr(G, "USE_PDL", False)
        G.m_grouped_fp8_gemm_nt_masked(*new, 16, out=plain)
    G.m_grouped_fp8_gemm_nt_masked(*new, 16, out=torch.zeros_like(plain))  # compiled before the race
    out = torch.zeros_like(plain)
    saved = _late_writes_then(
        lambda a, sa, b, sb, mm: G.m_grouped_fp8_gemm_nt_masked(a, sa, b, sb, mm, 16, out=out), old, new, out)
    assert not bool(saved.any())  # written only after the writer read it
    for i, rows in enumerate([17, 32, 3, 0]):
        assert_bits_equal(out[i, :rows], plain[i, :rows], f"expert {i}'s {rows} rows")
        assert not bool(out[i, rows:].any())  # past the new masked_m: untouched (the old one would write them)


@pytest.mark.parametrize("mode", [1, 2])
def test_masked_sm90_ws_waits_for_masked_m_and_its_operands(monkeypatch, mode):
    """The masked GEMM at expected_m 256 (sm90_ws's masked mode, launched with WS_PDL) after the late writer."""
    old, new, plain = _masked_race((256, 4096, 1024), 5, [0, 200, 256, 1], [129, 256, 3, 0])
    if G.ws_refusal(G.MASKED, *new[:4], plain, expected_m=256) is not None:
        pytest.skip("sm90_ws does not run the masked call here")
    with monkeypatch.context() as mp:
        mp.setattr(G, "USE_PDL", False)
        G.m_grouped_fp8_gemm_nt_masked(*new, 256, out=plain)
    monkeypatch.setattr(G, "WS_PDL", mode)
    pdls = spy_ws_pdls(monkeypatch)
    G.m_grouped_fp8_gemm_nt_masked(*new, 256, out=torch.zeros_like(plain))  # compiled before the race
    out = torch.zeros_like(plain)
    saved = _late_writes_then(
        lambda a, sa, b, sb, mm: G.m_grouped_fp8_gemm_nt_masked(a, sa, b, sb, mm, 256, out=out), old, new, out)
    assert not bool(saved.any())  # written only after the writer read it
    assert pdls == [mode, mode]
    for i, rows in enumerate([129, 256, 3, 0]):
        assert_bits_equal(out[i, :rows], plain[i, :rows], f"expert {i}'s {rows} rows, pdl {mode}")
        # past the 128-row tiles of the new masked_m: untouched (the old one would write them)
        assert not bool(out[i, (rows + 127) // 128 * 128:].any())
