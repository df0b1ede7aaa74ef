"""Backend selection per Arch (with and without a usable DeepGEMM) and the FP8 linear layer
vs the oracle of its quantized operands (relative L2 <= 5e-3) and the BF16 linear (<= 0.05)."""

import json
import logging

import pytest
import torch

from helpers import DEVICES, real_deep_gemm, rel_l2
from helpers import fake_deep_gemm as fake
from rtp_fp8 import arch as A
from rtp_fp8 import triton_env
from rtp_fp8.gemm import backends as BK
from rtp_fp8.gemm import deepgemm as D
from rtp_fp8.gemm import reference as GR
from rtp_fp8.gemm.linear import FP8Linear
from rtp_fp8.quant import reference as R
from rtp_fp8.quant import token_group as T


@pytest.fixture
def dg_present(monkeypatch):
    caps = D.probe(fake())
    monkeypatch.setattr(D, "capabilities", lambda: caps)
    monkeypatch.setattr(BK, "_logged", set())
    monkeypatch.delenv(BK.BACKEND_ENV, raising=False)
    return caps


@pytest.fixture
def dg_absent(monkeypatch):
    caps = D.probe(None)
    monkeypatch.setattr(D, "capabilities", lambda: caps)
    monkeypatch.setattr(BK, "_logged", set())
    monkeypatch.delenv(BK.BACKEND_ENV, raising=False)
    return caps


@pytest.mark.parametrize("arch,want", [(A.Arch(9, 0), "deepgemm"), (A.Arch(10, 0), "deepgemm"),
                                       (A.Arch(12, 0), "triton"), (A.CPU, "triton")], ids=str)
def test_selection_with_deepgemm(dg_present, arch, want, caplog):
    with caplog.at_level(logging.INFO, logger="rtp_fp8.gemm.backends"):
        assert BK.select(arch, 7168, 2048)[0] == want
        BK.select(arch, 7168, 2048)
    assert caplog.text.count(f"{arch}: {want} GEMM backend") == 1
    if arch == A.Arch(12, 0):
        assert "sm120: deepgemm bypassed: DeepGEMM mainline has no kernels for sm120" in caplog.text


@pytest.mark.parametrize("arch", [A.Arch(9, 0), A.Arch(10, 0), A.Arch(12, 0)], ids=str)
def test_selection_without_deepgemm(dg_absent, arch, caplog):
    with caplog.at_level(logging.INFO, logger="rtp_fp8.gemm.backends"):
        assert BK.select(arch, 7168, 2048) == ("triton", f"preferred for {arch}")
    if arch.major in (9, 10):
        assert "deepgemm bypassed: deep_gemm is not installed" in caplog.text


def test_shape_gate_and_overrides(dg_present, monkeypatch):
    assert BK.select(A.Arch(9, 0), 200, 2048)[0] == "triton"  # N % 64 != 0
    assert BK.select(A.Arch(9, 0), 256, 2048, override="reference") == ("reference", "forced")
    monkeypatch.setenv(BK.BACKEND_ENV, "triton")
    assert BK.select(A.Arch(9, 0), 256, 2048) == ("triton", "forced")
    monkeypatch.setenv(BK.BACKEND_ENV, "deepgemm")
    with pytest.raises(ValueError, match="backend 'deepgemm' was forced .* no kernels for sm120"):
        BK.select(A.Arch(12, 0), 256, 2048)
    monkeypatch.setenv(BK.BACKEND_ENV, "cutlass")
    with pytest.raises(ValueError, match=r"backend \(RTP_FP8_GEMM_BACKEND\) must be one of"):
        BK.select(A.Arch(9, 0), 256, 2048)


def _check_linear(lin, w, bias, x, arch):
    y = lin(x)
    assert y.shape == (*x.shape[:-1], w.shape[0]) and y.dtype == torch.bfloat16 and y.device == x.device
    k = x.shape[-1]
    qa, sa = R.per_token_group_quant_ref(x.reshape(-1, k).cpu(), 128, pow2=arch.scale_format == "ue8m0")
    emulated = GR.gemm_nt_ref(qa, sa, lin.weight.cpu(), lin.weight_scales.cpu())
    if bias is not None:
        emulated = emulated + bias.double().cpu()
    assert rel_l2(y.reshape(-1, w.shape[0]).cpu(), emulated) <= 5e-3
    want = torch.nn.functional.linear(x.float(), w.float(), None if bias is None else bias.float())
    assert rel_l2(y.float(), want) <= 0.05


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("arch", [A.Arch(9, 0), A.Arch(12, 0)], ids=str)
def test_linear_matches_oracles(dg_absent, arch, device):
    """Triton on CUDA tensors and on CPU ones under the interpreter; on a GPU host (interpreter off)
    CPU tensors take the plain-torch reference instead of reaching Triton."""
    g = torch.Generator().manual_seed(0)
    w = (torch.randn(320, 512, generator=g) / 512**0.5).to(torch.bfloat16).to(device)
    bias = torch.randn(320, generator=g).to(torch.bfloat16).to(device)
    x = torch.randn(2, 5, 512, generator=g).to(torch.bfloat16).to(device)
    lin = FP8Linear(w, bias, arch=arch)
    assert lin.backend == ("triton" if device == "cuda" or triton_env.interpreting() else "reference")
    _check_linear(lin, w, bias, x, arch)


def test_cpu_tensors_never_reach_triton_without_the_interpreter(dg_absent, monkeypatch):
    """What a GPU host does with CPU tensors (TRITON_INTERPRET off): the reference backend, and a
    clear error where Triton is forced."""
    monkeypatch.setattr(BK.triton_env, "interpreting", lambda: False)
    assert BK.select(A.Arch(9, 0), 256, 512, device="cpu")[0] == "reference"
    a, sa, b, sb = (torch.empty(1),) * 4
    with pytest.raises(ValueError, match="a is on cpu: the triton backend needs CUDA tensors"):
        BK.Backend("triton", A.Arch(9, 0)).gemm_nt(a, sa, b, sb)
    with pytest.raises(ValueError, match="backend 'triton' was forced .* Triton kernels need CUDA tensors"):
        BK.select(A.Arch(9, 0), 256, 512, override="triton", device="cpu")


@pytest.mark.parametrize("arch", [A.Arch(9, 0), A.Arch(10, 0)], ids=str)
def test_linear_operands_pass_the_deepgemm_format_gate(dg_present, arch, monkeypatch):
    """FP8Linear's own weights and activations are in the format DeepGEMM takes for the Arch (the
    backend refuses anything else): a stand-in for deep_gemm's GEMM gets them and answers with the
    oracle. (DeepGEMM is never selected for CPU tensors, so the layer's operands are handed to the
    DeepGEMM backend directly; on a GPU, test_linear_on_the_real_deepgemm runs the real thing.)"""
    def fake_gemm(a, sa, b, sb, out, arch_):
        want = torch.int32 if arch.scale_format == "ue8m0" else torch.float32
        assert arch_ == arch and sa.dtype == sb.dtype == want
        return out.copy_(GR.gemm_nt_ref(a, sa, b, sb))

    g = torch.Generator().manual_seed(1)
    w = (torch.randn(256, 512, generator=g) / 512**0.5).to(torch.bfloat16)
    x = torch.randn(7, 512, generator=g).to(torch.bfloat16)
    lin = FP8Linear(w, arch=arch)
    assert lin.backend != "deepgemm"  # CPU tensors
    monkeypatch.setattr(BK.D, "fp8_gemm_nt", fake_gemm)
    monkeypatch.setattr(BK.D, "device_reason", lambda arch_, device: "")  # a GPU of the Arch's family (stand-in)
    a, sa = T.per_token_group_quant(x, 128, scale_layout=lin.layout)
    y = BK.Backend("deepgemm", arch).gemm_nt(a, sa, lin.weight, lin.weight_scales)
    assert rel_l2(y.float(), x.float() @ w.float().t()) <= 0.05


@pytest.mark.gpu
def test_linear_on_the_real_deepgemm(monkeypatch):
    """FP8Linear on this GPU's own Arch picks the real DeepGEMM and matches the oracle; an Arch the
    GPU cannot run (sm100 formats on sm90, or the reverse) is not offered DeepGEMM."""
    real_deep_gemm()
    monkeypatch.setattr(BK, "_logged", set())
    monkeypatch.delenv(BK.BACKEND_ENV, raising=False)
    here = A.detect()
    g = torch.Generator().manual_seed(2)
    w = (torch.randn(512, 1024, generator=g) / 32).to(torch.bfloat16).cuda()
    bias = torch.randn(512, generator=g).to(torch.bfloat16).cuda()
    x = torch.randn(3, 37, 1024, generator=g).to(torch.bfloat16).cuda()
    lin = FP8Linear(w, bias, arch=here)
    assert lin.backend == "deepgemm", lin.reason
    _check_linear(lin, w, bias, x, here)
    other = A.Arch(10, 0) if here.major == 9 else A.Arch(9, 0)
    assert FP8Linear(w, arch=other).backend == "triton"
    with pytest.raises(ValueError, match=f"DeepGEMM's {other} kernels cannot run on this GPU"):
        FP8Linear(w, arch=other, backend="deepgemm")


def test_linear_bad_input(dg_absent):
    w = torch.randn(256, 512).to(torch.bfloat16)
    with pytest.raises(ValueError, match="weight's K=500 must be a multiple"):
        FP8Linear(torch.randn(256, 500), arch=A.Arch(9, 0))
    with pytest.raises(ValueError, match="weight must be bf16/fp16/fp32"):
        FP8Linear(w.to(torch.float8_e4m3fn), arch=A.Arch(9, 0))
    with pytest.raises(ValueError, match=r"bias must be \[256\]"):
        FP8Linear(w, torch.zeros(255), arch=A.Arch(9, 0))
    lin = FP8Linear(w, arch=A.Arch(9, 0), backend="reference")
    assert lin.backend == "reference"
    with pytest.raises(ValueError, match=r"x must be \[..., K=512\]"):
        lin(torch.randn(3, 256))


def test_launch_config_table_and_autotune_writer(tmp_path, monkeypatch):
    """configs.json drives the GPU launch configs; the autotuner picks by geomean and rewrites it."""
    from bench import autotune_gemm as AT
    from rtp_fp8.gemm.triton import block_scaled as G

    monkeypatch.setattr(G.triton_env, "interpreting", lambda: False)  # the GPU branch of _config
    table_rows = json.loads(G.CONFIG_TABLE.read_text())["buckets"]
    for m in (1, 16, 64, 65, 128, 256, 257, 4096):
        row = next(b for b in table_rows if b["max_m"] is None or m <= b["max_m"])
        assert G._config(m, 256, 512) == tuple(row["config"][key] for key in G.CONFIG_KEYS), m

    def fake_ms(cfg, shape):  # the widest BLOCK_N with the most warps is "fastest"; BLOCK_M 128 + 4 stages "fails"
        if cfg["BLOCK_M"] == 128 and cfg["num_stages"] == 4:
            raise RuntimeError("out of resources: shared memory")
        return 1.0 / (cfg["BLOCK_N"] * (1 + (cfg["num_warps"] == 8)))

    buckets = AT.pick(fake_ms, AT.BUCKETS)
    for got, (_, _, space) in zip(buckets, AT.BUCKETS, strict=True):
        assert got["config"]["BLOCK_N"] == max(space["BLOCK_N"])
        assert got["config"]["num_warps"] == max(space["num_warps"])
        assert not (got["config"]["BLOCK_M"] == 128 and got["config"]["num_stages"] == 4)
    table = tmp_path / "configs.json"
    table.write_text(G.CONFIG_TABLE.read_text())
    monkeypatch.setattr(G, "CONFIG_TABLE", table)
    G.config_table.cache_clear()
    try:
        AT.write(buckets, "fake GPU", path=table)
        text = table.read_text()
        AT.write(buckets, "fake GPU", path=table)
        assert table.read_text() == text  # stable output
        assert G._config(4096, 256, 512)[1] == 256
        with G.config_override({**buckets[0]["config"], "BLOCK_M": 32}):
            assert G._config(4096, 256, 512)[0] == 32
    finally:
        G.config_table.cache_clear()


def test_tma_path_is_taken(monkeypatch):
    """With TMA allowed, a dense call never reaches the pointer kernel's launcher; a K-offset
    view (not 16-byte aligned) does. Both paths run the full contract in test_triton_gemm.py."""
    from rtp_fp8.gemm.triton import block_scaled as G
    from rtp_fp8.quant import block as B
    from rtp_fp8.quant import token_group as T

    device = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator().manual_seed(4)
    a, sa = T.per_token_group_quant(torch.randn(64, 512, generator=g).to(torch.bfloat16).to(device), 128,
                                    scale_layout="col_tma")
    b, sb = B.quantize_weight_blocks((torch.randn(256, 512, generator=g) / 512**0.5).to(torch.bfloat16).to(device))

    def no_pointer_launch(*args, **kwargs):
        raise AssertionError("pointer kernel launched")

    monkeypatch.setattr(G, "USE_TMA", True)
    monkeypatch.setattr(G, "_launch", no_pointer_launch)
    got = G.fp8_gemm_nt(a, sa, b, sb).float()
    assert rel_l2(got.cpu(), GR.gemm_nt_ref(a, sa, b, sb).cpu()) < 5e-3
    with pytest.raises(AssertionError, match="pointer kernel"):
        G.fp8_gemm_nt(a[:, 8:], sa, b[:, 8:], sb)
