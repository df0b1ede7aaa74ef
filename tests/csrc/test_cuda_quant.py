"""CUDA extension per_token_group_quant vs the oracle, bit for bit (H200), its TORCH_CHECKs,
and the compile-only build for sm_90a/sm_100a/sm_120a (CPU CI, with the machine's nvcc)."""

import itertools
import shutil

import pytest
import torch

from helpers import assert_bits_equal, poison_
from rtp_fp8 import _ext
from rtp_fp8.quant import layout as L
from rtp_fp8.quant import reference as R
from rtp_fp8.quant import token_group as T
from tools import build_ext

needs_ext = pytest.mark.skipif(not (torch.cuda.is_available() and _ext.available()),
                               reason=f"needs a CUDA GPU and the built extension ({_ext.unavailable_reason()})")


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc (CUDA toolkit) to compile csrc/")
def test_compile_only_for_every_arch(tmp_path):
    archs = ["sm_90a", "sm_100a", "sm_120a"]
    assert build_ext.default_archs("13.0") == archs
    objs = build_ext.build(archs, tmp_path)
    assert all(o.stat().st_size > 0 for o in objs)
    flags = build_ext.gencode_flags(archs)
    assert flags == ["-gencode=arch=compute_90a,code=sm_90a", "-gencode=arch=compute_100a,code=sm_100a",
                     "-gencode=arch=compute_120a,code=sm_120a", "-gencode=arch=compute_120,code=compute_120"]


def test_cuda_backend_refused_without_gpu_or_extension(monkeypatch):
    x = torch.randn(4, 256)
    with pytest.raises(ValueError, match="backend='cuda' needs a CUDA input"):
        T.per_token_group_quant(x, 128, backend="cuda")
    monkeypatch.setenv("RTP_FP8_QUANT_BACKEND", "cuda")
    with pytest.raises(ValueError, match="backend='cuda' needs"):
        T.per_token_group_quant(x, 128)
    monkeypatch.setenv("RTP_FP8_QUANT_BACKEND", "fast")
    with pytest.raises(ValueError, match="RTP_FP8_QUANT_BACKEND must be one of"):
        T.per_token_group_quant(x, 128)


def _rand(m, k, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g) * torch.exp2(torch.randint(-10, 10, (m, 1), generator=g).float())
    if m > 2:
        x[1, 5] = float("nan")
        x[2, k - 1] = float("inf")
    return x.to(dtype).cuda()


def _call_poisoned(x, out_dtype, group, layout, pow2=False, guard=64):
    m, k = x.shape
    q = poison_(torch.empty(m, k, dtype=out_dtype, device="cuda"))
    ref = L.alloc_scales((), m, k // group, layout, "cuda")
    words = ref.untyped_storage().nbytes() // 4
    base = poison_(torch.empty(words + guard, dtype=ref.dtype, device="cuda"))
    s = torch.as_strided(base, ref.shape, ref.stride())
    _ext.per_token_group_quant(x, q, s, group, layout, pow2, 1e-10)
    torch.cuda.synchronize()
    tail = base[words:].cpu()
    assert bool(torch.isnan(tail).all()) if tail.dtype.is_floating_point else bool((tail == 0x7B7B7B7B).all()), \
        "a write past the scale tensor"
    return q, s


CASES = list(itertools.product(
    [torch.bfloat16, torch.float16, torch.float32], [torch.float8_e4m3fn, torch.int8], [64, 128, 256],
    [1, 3, 128, 4097], ["group", 2304, 7168]))


@needs_ext
@pytest.mark.gpu
@pytest.mark.parametrize("dtype,out,group,m,k", CASES,
                         ids=[f"{str(d)[6:]}-{str(o)[6:]}-g{g}-m{m}-k{k}" for d, o, g, m, k in CASES])
def test_matches_oracle_every_layout(dtype, out, group, m, k):
    k = group if k == "group" else k
    if 16 // torch.tensor([], dtype=dtype).element_size() * 4 > group:
        pytest.skip(f"group {group} below 4 x 16-byte vectors of {dtype} (the kernel's minimum)")
    x = _rand(m, k, dtype, seed=m * 7 + k + group)
    for pow2 in (False, True):
        qr, sr = R.per_token_group_quant_ref(x, group, out, pow2=pow2)
        layouts = ["row", "col", "col_tma"] + (["ue8m0"] if out == torch.float8_e4m3fn and pow2 else [])
        for layout in layouts:
            q, s = _call_poisoned(x, out, group, layout, pow2)
            assert_bits_equal(q.cpu(), qr, f"values {layout} pow2={pow2}")
            want = R.pack_ue8m0_ref(sr) if layout == "ue8m0" else sr
            assert_bits_equal(s.cpu(), want, f"scales {layout} pow2={pow2}")


# Column-major scales: a 2-D grid (x = group, y = row tile), one launch per 65535 row tiles
# (gridDim.y's limit). bf16 group 128 puts 16 rows in a tile: one launch, then two (the second
# holding one row).
@needs_ext
@pytest.mark.gpu
@pytest.mark.parametrize("m", [65535 * 16, 65535 * 16 + 1])
def test_column_order_split_at_the_grid_limit(m):
    g = torch.Generator(device="cuda").manual_seed(m)
    x = (torch.randn(m, 256, device="cuda", generator=g) *
         torch.exp2(torch.randint(-10, 10, (m, 1), device="cuda", generator=g).float())).to(torch.bfloat16)
    qr, sr = (t.to("cuda") for t in R.per_token_group_quant_ref(x, 128))  # the oracle answers on the CPU
    for layout in ("col", "col_tma"):
        q, s = _call_poisoned(x, torch.float8_e4m3fn, 128, layout)
        bad_q = int((q.view(torch.uint8) != qr.view(torch.uint8)).sum())
        bad_s = int((s.view(torch.int32) != sr.contiguous().view(torch.int32)).sum())
        assert (bad_q, bad_s) == (0, 0), f"{layout}: {bad_q} values and {bad_s} scales differ from the oracle"


@needs_ext
@pytest.mark.gpu
def test_default_backend_is_cuda_and_matches_triton():
    x = _rand(300, 7168, torch.bfloat16, seed=1)
    for layout in ("row", "col_tma", "ue8m0"):
        qc, sc = T.per_token_group_quant(x, 128, scale_layout=layout)  # extension by default
        qt, st = T.per_token_group_quant(x, 128, scale_layout=layout, backend="triton")
        assert_bits_equal(qc, qt, layout)
        assert_bits_equal(sc, st, layout)


@needs_ext
@pytest.mark.gpu
def test_every_torch_check_names_its_argument():
    op = torch.ops.rtp_fp8_C.per_token_group_quant
    x = torch.randn(8, 512, device="cuda", dtype=torch.bfloat16)
    q = torch.empty(8, 512, device="cuda", dtype=torch.float8_e4m3fn)
    s = torch.empty(8, 4, device="cuda")
    cases = [
        ((x.cpu(), q, s, 128, "row", False, 1e-10), "x must be a CUDA tensor"),
        ((x, q.cpu(), s, 128, "row", False, 1e-10), "q must be on x's device"),
        ((x, q, s.cpu(), 128, "row", False, 1e-10), "scales must be on x's device"),
        ((x.view(2, 4, 512), q.view(2, 4, 512), s, 128, "row", False, 1e-10), "x must be 2-D"),
        ((x.to(torch.int32), q, s, 128, "row", False, 1e-10), "x must be bfloat16, float16 or float32"),
        ((torch.randn(512, 8, device="cuda", dtype=torch.bfloat16).t(), q, s, 128, "row", False, 1e-10),
         "x must be contiguous"),
        ((x, q.to(torch.float16), s, 128, "row", False, 1e-10), "q must be float8_e4m3fn or int8"),
        ((x, q[:, :256], s, 128, "row", False, 1e-10), "q must be contiguous with x's shape"),
        ((x, q, s, 96, "row", False, 1e-10), "group_size must be a positive power of two"),
        ((x, q, s, 1024 * 1024, "row", False, 1e-10), "is not divisible by group_size"),
        ((x, q, s, 16, "row", False, 1e-10), "group_size must be a multiple of 4 x the 16-byte vector width"),
        ((torch.randn(8, 4096, device="cuda", dtype=torch.bfloat16),
          torch.empty(8, 4096, device="cuda", dtype=torch.float8_e4m3fn), torch.empty(8, 1, device="cuda"), 4096,
          "row", False, 1e-10), "group_size=4096 is not supported for BFloat16 input"),
        ((x, q, s, 128, "row", False, 0.0), "eps must be positive"),
        ((x, q.view(torch.int8), s.to(torch.int32)[:, :1], 128, "ue8m0", False, 1e-10), "needs q of float8_e4m3fn"),
        ((x, q, s, 128, "blocked", False, 1e-10), "scale_layout must be one of"),
        ((x, q, s.to(torch.float16), 128, "row", False, 1e-10), "scales must be float32"),
        ((x, q, torch.empty(8, 3, device="cuda"), 128, "row", False, 1e-10), "scales must have shape"),
        ((x, q, torch.empty(4, 8, device="cuda").t(), 128, "row", False, 1e-10), "scales must have strides"),
        ((x, q, s, 128, "ue8m0", False, 1e-10), "scales must be int32"),
    ]
    xo = torch.empty(8 * 512 + 1, device="cuda", dtype=torch.bfloat16)[1:].view(8, 512)  # 2-byte offset
    cases.append(((xo, q, s, 128, "row", False, 1e-10), "x must be 16-byte aligned"))
    qo = torch.empty(8 * 512 + 8, device="cuda", dtype=torch.float8_e4m3fn)[8:].view(8, 512)
    cases.append(((x, qo, s, 128, "row", False, 1e-10), "q must be 16-byte aligned"))
    for args, msg in cases:
        with pytest.raises(RuntimeError, match=msg):
            op(*args)


def test_every_op_wrapper_raises_the_loaders_reason_when_the_extension_is_absent(monkeypatch):
    monkeypatch.setattr(_ext, "_load", lambda: (None, "_C.so not built (python3 tools/build_ext.py)"))
    calls = [lambda: _ext.per_token_group_quant(*range(7)), lambda: _ext.fp8_gemm_sm90(*range(5)),
             lambda: _ext.fp8_gemm_sm90_clusters(128), lambda: _ext.fp8_gemm_sm90_contiguous(*range(7))]
    for call in calls:
        with pytest.raises(RuntimeError, match=r"_C\.so not built \(python3 tools/build_ext\.py\)"):
            call()
