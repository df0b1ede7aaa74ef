"""The Arch value, arch-dependent quantization entry points, and the torch.library ops."""

import pathlib
import re

import pytest
import torch

from helpers import DEVICES, assert_bits_equal
from rtp_fp8 import arch as A
from rtp_fp8 import ops  # noqa: F401  (registers torch.ops.rtp_fp8.*)
from rtp_fp8 import quant as Q
from rtp_fp8.quant import block as B
from rtp_fp8.quant import reference as R
from rtp_fp8.quant import ue8m0

ROOT = pathlib.Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(
    "arch,fmt,family,backends",
    [
        (A.Arch(9, 0), "fp32", "sm90", ("deepgemm", "triton", "reference")),
        (A.Arch(10, 0), "ue8m0", "sm100", ("deepgemm", "triton", "reference")),
        (A.Arch(12, 0), "ue8m0", "sm120", ("triton", "reference")),
        (A.CPU, "fp32", "cpu", ("triton", "reference")),
    ],
)
def test_arch_properties(arch, fmt, family, backends):
    assert arch.scale_format == fmt and arch.family == family and arch.gemm_backends == backends
    assert arch.direct_ue8m0_weights == (fmt == "ue8m0")


def test_smem_per_block():
    """CUDA's opt-in shared memory per block by compute capability (kernels size rings from it)."""
    kib = {A.Arch(9, 0): 227, A.Arch(10, 0): 227, A.Arch(12, 0): 99, A.Arch(8, 0): 163, A.Arch(8, 9): 99,
           A.CPU: 0}
    assert {arch: arch.smem_per_block // 1024 for arch in kib} == kib
    if torch.cuda.is_available():  # the table agrees with the device's opt-in limit, as Triton reads it
        import triton

        props = triton.runtime.driver.active.utils.get_device_properties(torch.cuda.current_device())
        assert A.detect().smem_per_block == props["max_shared_mem"]


def test_arch_validation_and_detect_on_cpu():
    with pytest.raises(ValueError, match="major/minor"):
        A.Arch(-1, 0)
    with pytest.raises(TypeError, match="arch must be rtp_fp8.arch.Arch"):
        A.resolve((9, 0))
    if not torch.cuda.is_available():
        assert A.detect() == A.CPU and A.detect("cpu") == A.CPU


def test_only_arch_py_reads_device_capability():
    offenders = [
        str(p.relative_to(ROOT)) for p in (ROOT / "rtp_fp8").rglob("*.py")
        if p.name != "arch.py" and re.search(r"get_device_capability|\.major\b.*cuda", p.read_text())
    ]
    assert offenders == []


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("arch", [A.Arch(9, 0), A.Arch(10, 0), A.Arch(12, 0)], ids=str)
def test_quantize_activation_per_arch(device, arch):
    x = torch.randn(7, 640, device=device, dtype=torch.bfloat16)
    q, s = Q.quantize_activation(x, arch=arch)
    pow2 = arch.scale_format == "ue8m0"
    qr, sr = R.per_token_group_quant_ref(x.cpu(), 128, pow2=pow2)
    assert_bits_equal(q.cpu(), qr)
    if pow2:
        assert s.dtype == torch.int32 and s.shape == (7, 2) and s.stride() == (1, 8)
        assert_bits_equal(s.cpu(), R.pack_ue8m0_ref(sr))
    else:
        assert s.dtype == torch.float32 and s.stride() == (1, 8)
        assert_bits_equal(s.cpu(), sr)


@pytest.mark.parametrize("arch", [A.Arch(9, 0), A.Arch(10, 0), A.Arch(12, 0)], ids=str)
def test_quantize_weight_per_arch(arch):
    w = torch.randn(300, 520, dtype=torch.bfloat16)
    q, s = Q.quantize_weight(w, arch=arch)
    if arch.scale_format == "ue8m0":
        qr, sr = R.block_quant_ref(w, pow2=True)
        assert s.dtype == torch.int32 and s.shape == (300, 2) and s.stride() == (1, 300)
        assert_bits_equal(s, R.pack_ue8m0_ref(ue8m0.broadcast_block_to_rows(sr, 300)))
    else:
        qr, sr = R.block_quant_ref(w)
        assert_bits_equal(s, sr)
    assert_bits_equal(q, qr)
    assert_bits_equal(B.quantize_weight_blocks(w, pow2=arch.scale_format == "ue8m0")[0], q)


@pytest.mark.parametrize("device", DEVICES)
def test_custom_op_eager_and_compiled(device):
    x = torch.randn(9, 512, device=device, dtype=torch.bfloat16)
    q, s = torch.ops.rtp_fp8.per_token_group_quant(x, 128, torch.float8_e4m3fn, "ue8m0", True, 1e-10)
    qr, sr = R.per_token_group_quant_ref(x.cpu(), 128, pow2=True)
    assert_bits_equal(q.cpu(), qr)
    assert_bits_equal(s.cpu(), R.pack_ue8m0_ref(sr))

    def f(x):
        q, s = torch.ops.rtp_fp8.per_token_group_quant(x, 128, torch.float8_e4m3fn, "col_tma", False, 1e-10)
        return q.float() * 2, s

    cf = torch.compile(f, backend="aot_eager" if device == "cpu" else "inductor", fullgraph=True)
    q2, s2 = cf(x)
    assert s2.stride() == (1, 12)
    assert_bits_equal(s2.cpu(), R.per_token_group_quant_ref(x.cpu(), 128)[1])


def test_opcheck_fake_matches_real():
    x = torch.randn(6, 256, dtype=torch.bfloat16)
    for layout in ("row", "col_tma", "ue8m0"):
        torch.library.opcheck(torch.ops.rtp_fp8.per_token_group_quant.default,
                              (x, 128, torch.float8_e4m3fn, layout, False, 1e-10),
                              test_utils=("test_schema", "test_faketensor"))
