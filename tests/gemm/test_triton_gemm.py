"""The FP8 GEMM contract, run against every backend present (Triton and the reference
always; DeepGEMM when it is importable and serves the arch of the scale format), vs the
float64 oracle of the dequantized operands. Triton-only extras (counters, zeroed -1 rows,
per-row FP32 B scales) are checked where the backend is Triton.

Tolerance: relative L2 <= 5e-3 (FP32 accumulation of exact fp8 products, bf16 output
rounding ~2e-3). Outputs are poisoned with NaN first, so unwritten elements fail.
"""

import pytest
import torch

from helpers import DEVICES, quantized_weights, rel_l2
from rtp_fp8 import arch as A
from rtp_fp8.gemm import backends as BK
from rtp_fp8.gemm import reference as GR
from rtp_fp8.gemm.triton import block_scaled as G
from rtp_fp8.quant import token_group as T

TOL = 5e-3
BACKENDS = ["triton", "reference", "deepgemm"]
FMT_ARCH = {"fp32": A.Arch(9, 0), "fp32_rows": A.Arch(9, 0), "ue8m0": A.Arch(10, 0)}


@pytest.fixture(autouse=True, params=["tma", "pointer"])
def load_path(request, monkeypatch):
    """Every case through both Triton load paths: the persistent TMA kernel (dense and
    contiguous, when strides allow) and the pointer kernel."""
    monkeypatch.setattr(G, "USE_TMA", request.param == "tma")
    return request.param


def _backend(name, fmt, device, n=None, k=None):
    """The backend for this scale format's arch, shape and device, or a skip naming the missing
    capability (DeepGEMM: not importable, N % 64 or K % 128, or a GPU that cannot run that arch's
    kernels, e.g. the UE8M0 format on an SM90 GPU)."""
    if name == "deepgemm" and fmt == "fp32_rows":
        pytest.skip("per-row FP32 B scales are a Triton-only format")
    why = BK.unavailable_reason(name, FMT_ARCH[fmt], n, k, device)
    if why:
        pytest.skip(f"{name}: {why}")
    return BK.get(name, FMT_ARCH[fmt], device)


def _operands(m, n, k, fmt, device, e=None, seed=0):
    """Quantized A [m, k] and B [(e,) n, k] in fmt. K need not be a multiple of 128 (the API
    allows it): A is then quantized over K padded with zeros to whole groups and cut back to K
    (the last group's scale covers its K % 128 real columns), B has a partial last block."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g).to(torch.bfloat16)
    x = torch.nn.functional.pad(x, (0, -k % 128)).to(device)
    w = (torch.randn(*((e,) if e else ()), n, k, generator=g) / k**0.5).to(torch.bfloat16).to(device)
    a, sa = T.per_token_group_quant(x, 128, scale_layout={"ue8m0": "ue8m0", "fp32_rows": "row"}.get(fmt, "col_tma"))
    return (a[:, :k].contiguous(), sa, *quantized_weights(w, fmt))


def _nan(shape, device):
    return torch.full(shape, float("nan"), dtype=torch.bfloat16, device=device)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt", ["fp32", "fp32_rows", "ue8m0"])
@pytest.mark.parametrize("m", [1, 7, 128, 300])
@pytest.mark.parametrize("n,k", [(256, 512), (200, 384), (384, 1024)])  # K: whole 1x128 groups
def test_dense(backend, device, fmt, m, n, k):
    be = _backend(backend, fmt, device, n, k)
    a, sa, b, sb = _operands(m, n, k, fmt, device, seed=m + n + k)
    out = be.gemm_nt(a, sa, b, sb, out=_nan((m, n), device))
    ref = GR.gemm_nt_ref(a, sa, b, sb)
    assert not torch.isnan(out).any()
    assert rel_l2(out.cpu(), ref) <= TOL


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["triton", "deepgemm"])
@pytest.mark.parametrize("fmt", ["fp32", "ue8m0"])
@pytest.mark.parametrize("n,k", [(384, 1024), (200, 512)])
def test_dense_m4096(backend, fmt, n, k):
    """The large-M contract case (GPU: the CPU interpreter would take minutes)."""
    be = _backend(backend, fmt, "cuda", n, k)
    a, sa, b, sb = _operands(4096, n, k, fmt, "cuda", seed=n + k)
    out = be.gemm_nt(a, sa, b, sb, out=_nan((4096, n), "cuda"))
    assert not torch.isnan(out).any()
    assert rel_l2(out.cpu(), GR.gemm_nt_ref(a, sa, b, sb)) <= TOL


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt", ["fp32", "ue8m0"])
@pytest.mark.parametrize("m,n,k", [(7, 200, 200), (130, 256, 208), (1, 384, 1000)])
def test_dense_ragged_k(backend, device, fmt, m, n, k):
    """K % 128 != 0, which the Triton API allows (scales cover ceil(K / 128) groups): K=200 and
    1000 have rows TMA cannot address (pointer kernel only), K=208 takes the TMA kernel too."""
    be = _backend(backend, fmt, device, n, k)
    a, sa, b, sb = _operands(m, n, k, fmt, device, seed=k)
    out = be.gemm_nt(a, sa, b, sb, out=_nan((m, n), device))
    assert not torch.isnan(out).any()
    assert rel_l2(out.cpu(), GR.gemm_nt_ref(a, sa, b, sb)) <= TOL


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt", ["fp32", "ue8m0"])
def test_grouped_contiguous_ragged_k(device, fmt):
    ids = _contiguous_layout([40, 0, 100], 64, device)
    a, sa, b, sb = _operands(ids.numel(), 256, 208, fmt, device, e=3, seed=1)
    out = G.m_grouped_fp8_gemm_nt_contiguous(a, sa, b, sb, ids, out=_nan((ids.numel(), 256), device), alignment=64)
    assert rel_l2(out.cpu(), GR.grouped_contiguous_ref(a, sa, b, sb, ids)) <= TOL


def _contiguous_layout(counts, align, device):
    ids = []
    for ex, c in enumerate(counts):
        ids += [ex] * c + [-1] * ((-c) % align)
    return torch.tensor(ids, dtype=torch.int32, device=device)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt", ["fp32", "ue8m0"])
@pytest.mark.parametrize("counts", [[40, 0, 128, 7], [0, 0, 0, 0], [0, 300, 0, 0]], ids=["mixed", "empty", "one"])
def test_grouped_contiguous(backend, device, fmt, counts):
    """Rows of an expert match the oracle; -1 (padding) rows are unspecified by the backend contract
    (DeepGEMM leaves them as the buffer held them), so only the Triton kernel's own extra is checked
    there: it writes zeros and counts them."""
    n, k, align = 256, 384, 128
    be = _backend(backend, fmt, device, n, k)
    ids = _contiguous_layout(counts, align, device)
    m = max(ids.numel(), 1)
    if ids.numel() == 0:
        ids = torch.full((align,), -1, dtype=torch.int32, device=device)  # all padding
        m = align
    a, sa, b, sb = _operands(m, n, k, fmt, device, e=4, seed=sum(counts))
    counters = torch.zeros(2, dtype=torch.int32, device=device)
    out = be.grouped_contiguous(a, sa, b, sb, ids, out=_nan((m, n), device), alignment=align, counters=counters)
    out = out.cpu()
    for ex in range(4):
        rows = (ids.cpu() == ex).nonzero().ravel()
        if rows.numel():
            ref = GR.gemm_nt_ref(a[rows], sa_rows(sa, rows), b[ex], sb[ex])
            assert not torch.isnan(out[rows]).any()
            assert rel_l2(out[rows], ref) <= TOL
    if backend == "triton":  # a Triton-only extra; the contract leaves -1 rows unspecified
        assert bool((out[ids.cpu() == -1] == 0).all())
    if backend == "triton":
        assert counters.tolist() == [int((ids == -1).sum()), 0]


def sa_rows(sa, rows):
    return sa.cpu()[rows.cpu()]


@pytest.mark.parametrize("device", DEVICES)
def test_grouped_invalid_ids_are_zeroed_and_counted(device):
    n, k, align = 128, 256, 128
    ids = _contiguous_layout([100, 128], align, device)
    ids[5] = 9  # out of range, inside expert 0's tile
    ids[128:256] = 77  # a whole tile with an out-of-range expert
    m = ids.numel()
    a, sa, b, sb = _operands(m, n, k, "fp32", device, e=2, seed=3)
    counters = torch.zeros(2, dtype=torch.int32, device=device)
    out = G.m_grouped_fp8_gemm_nt_contiguous(a, sa, b, sb, ids, out=_nan((m, n), device), counters=counters)
    out = out.cpu()
    assert bool((out[5] == 0).all()) and bool((out[128:256] == 0).all())
    ok = (ids.cpu() == 0).nonzero().ravel()
    assert rel_l2(out[ok], GR.gemm_nt_ref(a[ok], sa_rows(sa, ok), b[0], sb[0])) <= TOL
    assert counters.tolist() == [28, 1 + 128]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt", ["fp32", "ue8m0"])
def test_grouped_masked(backend, device, fmt):
    """Rows below masked_m[e] match the oracle. Rows past it are unspecified by the contract every
    backend meets (DeepGEMM writes whole row tiles past masked_m), so they are not read."""
    e, mmax, n, k = 3, 64, 256, 384
    be = _backend(backend, fmt, device, n, k)
    masked = torch.tensor([0, 64, 17], dtype=torch.int32, device=device)
    a, sa, b, sb = _operands(e * mmax, n, k, fmt, device, e=e, seed=5)
    a3 = a.view(e, mmax, k)
    from rtp_fp8.quant import layout as L

    g = k // 128
    sa3 = L.alloc_scales((e,), mmax, g, "ue8m0" if fmt == "ue8m0" else "col_tma", device)
    for i in range(e):
        sa3[i].copy_(sa[i * mmax:(i + 1) * mmax])
    out = be.grouped_masked(a3, sa3, b, sb, masked, expected_m=32, out=_nan((e, mmax, n), device))
    out = out.cpu()
    for i, mm in enumerate(masked.tolist()):
        assert not torch.isnan(out[i, :mm]).any()
        if mm:
            ref = GR.gemm_nt_ref(a3[i, :mm], sa3[i, :mm], b[i], sb[i])
            assert rel_l2(out[i, :mm], ref) <= TOL


def _no_launch(monkeypatch):
    """Any kernel launch (Triton or DeepGEMM) fails the test: bad input must be refused before."""
    def launched(*args, **kwargs):
        raise AssertionError("launched despite bad input")

    for name in ("_launch", "_launch_tma", "_launch_ws"):
        monkeypatch.setattr(G, name, launched)
    for name in ("fp8_gemm_nt", "m_grouped_fp8_gemm_nt_contiguous", "m_grouped_fp8_gemm_nt_masked"):
        monkeypatch.setattr(BK.D, name, launched)


@pytest.mark.parametrize("backend", BACKENDS)
def test_bad_input_names_the_argument(backend, monkeypatch):
    """The same bad calls through every backend (DeepGEMM's validation runs before DeepGEMM is
    touched, so it is checked here on CPU too): ValueError naming the argument, no launch."""
    _no_launch(monkeypatch)
    be = BK.Backend(backend, A.Arch(9, 0))
    a, sa, b, sb = _operands(8, 256, 512, "fp32", "cpu")
    ids = torch.zeros(8, dtype=torch.int32)
    b3, sb3 = b[None], sb[None]
    a3, sa3 = a[None], sa[None]
    masked = torch.zeros(1, dtype=torch.int32)
    cases = [
        (lambda: be.gemm_nt(a, sa, b[:, :384], sb[:, :3]), "b has K=384, a has K=512"),
        (lambda: be.gemm_nt(a.float(), sa, b, sb), "a must be torch.float8_e4m3fn"),
        (lambda: be.gemm_nt(a, sa, b.to(torch.float8_e5m2), sb), "b must be torch.float8_e4m3fn"),
        (lambda: be.gemm_nt(a, sa[:, :3], b, sb), "sa must have shape"),
        (lambda: be.gemm_nt(a, sa.double(), b, sb), "sa must be float32"),
        (lambda: be.gemm_nt(a, sa, b, sb[:1]), "sb must have shape"),
        (lambda: be.gemm_nt(a, sa, b, sb, out=torch.empty(8, 256)), "out must be bfloat16"),
        (lambda: be.gemm_nt(a, sa, b, sb, out=torch.empty(8, 128, dtype=torch.bfloat16)),
         "out must be bfloat16 of shape"),
        (lambda: be.grouped_contiguous(a, sa, b3, sb3, ids.long()), "m_indices must be int32"),
        (lambda: be.grouped_contiguous(a, sa, b3, sb3, ids[:4]), "m_indices must be"),
        (lambda: be.grouped_contiguous(a, sa, b3, sb3, ids, alignment=8), "alignment"),
        (lambda: be.grouped_contiguous(a, sa, b3, sb3, torch.zeros(16, dtype=torch.int32)[::2]),
         "m_indices must be .* contiguous"),
        (lambda: be.grouped_contiguous(a, sa, b3, sb3, ids, counters=torch.zeros(4, dtype=torch.int32)[::2]),
         "counters must be contiguous"),
        (lambda: be.grouped_contiguous(a, sa, b3, sb3[:, :1], ids), "sb must have shape"),
        (lambda: be.grouped_masked(*(t[None].expand(2, *t.shape).contiguous() for t in (a, sa, b, sb)),
                                   torch.zeros(4, dtype=torch.int32)[::2]), "masked_m must be .* contiguous"),
        (lambda: be.grouped_masked(a3, sa3, b3, sb3, torch.zeros(2, dtype=torch.int32)),
         "masked_m must be int32 of shape"),
        (lambda: be.grouped_masked(a3, sa3, torch.cat([b3, b3]), torch.cat([sb3, sb3]), masked),
         "b has 2 experts, a has 1"),
        (lambda: be.grouped_masked(a3, sa3, b3, sb3, masked, expected_m=0), "expected_m must be a positive int"),
        (lambda: be.grouped_masked(a3, sa3, b3, sb3, masked, out=torch.empty(1, 8, 256)), "out must be bfloat16"),
    ]
    for fn, msg in cases:
        with pytest.raises(ValueError, match=msg):
            fn()


def test_deepgemm_refuses_scales_of_another_format(monkeypatch):
    """DeepGEMM consumes the Arch's format only; anything else is refused before the call, never
    converted (FP32 scales on SM100 would be truncated to UE8M0 without requantizing: wrong)."""
    _no_launch(monkeypatch)
    a, sa, b, sb = _operands(7, 256, 1024, "fp32", "cpu")  # 7 rows: TMA-aligned strides differ from dense ones
    au, sau, bu, sbu = _operands(7, 256, 1024, "ue8m0", "cpu")
    _, _, br, sbr = _operands(7, 256, 1024, "fp32_rows", "cpu")
    from rtp_fp8.quant import layout as L

    sm90, sm100 = BK.Backend("deepgemm", A.Arch(9, 0)), BK.Backend("deepgemm", A.Arch(10, 0))
    cases = [
        (lambda: sm100.gemm_nt(a, sa, b, sb), "sa must be packed UE8M0 int32 for DeepGEMM on sm100"),
        (lambda: sm100.gemm_nt(au, sau, b, sb), "sb must be packed UE8M0 int32"),
        (lambda: sm100.gemm_nt(au, sau.contiguous(), bu, sbu), "sa must have strides"),
        (lambda: sm90.gemm_nt(au, sau, bu, sbu), "sa must be float32 scales for DeepGEMM on sm90"),
        (lambda: sm90.gemm_nt(a, L.to_layout(sa, "row"), b, sb), "sa must have strides .* 'col_tma'"),
        (lambda: sm90.gemm_nt(a, sa, br, sbr), "sb must be 128x128 block scales"),
        (lambda: sm90.gemm_nt(a, sa, b, sb.t().contiguous().t()), "sb must be contiguous"),
        (lambda: sm100.grouped_contiguous(a, sa, b[None], sb[None], torch.zeros(7, dtype=torch.int32)),
         "sa must be packed UE8M0"),
        (lambda: sm90.grouped_masked(au[None], sau[None], bu[None], sbu[None], torch.zeros(1, dtype=torch.int32)),
         "sa must be float32 scales"),
        (lambda: sm90.gemm_nt(*_operands(7, 256, 208, "fp32", "cpu")),
         "K % 128 == 0 for DeepGEMM, got N=256, K=208"),
        (lambda: sm90.gemm_nt(a, sa, b[:200], sb), "N % 64 == 0 .* got N=200"),
        (lambda: sm90.gemm_nt(a, sa, b, sb), "a: DeepGEMM runs on CUDA tensors, got a cpu tensor"),
    ]
    for fn, msg in cases:
        with pytest.raises(ValueError, match=msg):
            fn()


def test_deepgemm_gets_the_formats_it_consumes(monkeypatch):
    """Valid operands in the Arch's format reach DeepGEMM unchanged (the tensors themselves), with
    the mk-alignment set around the contiguous call."""
    calls = []
    monkeypatch.setattr(BK.D, "device_reason", lambda arch, device: "")  # a GPU of the Arch's family (stand-in)
    monkeypatch.setattr(BK.D, "fp8_gemm_nt", lambda *args: calls.append(("dense", args)) or args[4])
    monkeypatch.setattr(BK.D, "m_grouped_fp8_gemm_nt_masked", lambda *args: calls.append(("masked", args)) or args[6])
    for fmt, arch in (("fp32", A.Arch(9, 0)), ("ue8m0", A.Arch(10, 0))):
        a, sa, b, sb = _operands(8, 256, 512, fmt, "cpu")
        be = BK.Backend("deepgemm", arch)
        out = be.gemm_nt(a, sa, b, sb)
        assert out.shape == (8, 256) and out.dtype == torch.bfloat16
        _, args = calls.pop()
        assert all(x is y for x, y in zip(args[:4], (a, sa, b, sb))) and args[5] == arch
        from rtp_fp8.quant import layout as L

        g = 512 // 128
        sa3 = L.alloc_scales((1,), 8, g, "ue8m0" if fmt == "ue8m0" else "col_tma", "cpu")
        sa3[0].copy_(sa)
        masked = torch.tensor([5], dtype=torch.int32)
        be.grouped_masked(a[None], sa3, b[None], sb[None], masked)
        _, args = calls.pop()
        assert args[5] == 8  # expected_m defaults to the capacity


@pytest.mark.gpu_sm90
def test_deepgemm_refuses_an_arch_the_gpu_cannot_run(monkeypatch):
    """Arch(10, 0) operands (packed UE8M0, valid for SM100) on the SM90 GPU: DeepGEMM would assert in
    C++; the backend refuses first, naming both archs, and the selection never offers it."""
    _no_launch(monkeypatch)
    a, sa, b, sb = _operands(8, 256, 512, "ue8m0", "cuda")
    with pytest.raises(ValueError, match=r"a: DeepGEMM's sm100 kernels cannot run on this GPU \(sm90\)"):
        BK.Backend("deepgemm", A.Arch(10, 0)).gemm_nt(a, sa, b, sb)
    name, _ = BK.select(A.Arch(10, 0), 256, 512, device=a.device)
    assert name == "triton"  # which runs any Arch's format (test_dense, ue8m0 on this GPU)
