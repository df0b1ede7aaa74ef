"""rtp_fp8.nn.FP8Linear: the published-format module against the float64 oracle, its
state_dict / .to() behaviour, construction paths, conversion of a model, weight plans,
tensor-parallel loading and bad input. CPU under the interpreter, and CUDA."""

import json

import pytest
import torch
from torch import nn

from helpers import DEVICES, assert_bits_equal, rel_l2
from rtp_fp8 import nn as fp8nn
from rtp_fp8.arch import Arch
from rtp_fp8.gemm import reference as GR
from rtp_fp8.loader import online_fp8 as LD
from rtp_fp8.quant import block as B
from rtp_fp8.quant import reference as QR

ARCHS = [pytest.param(Arch(9, 0), id="sm90"), pytest.param(Arch(10, 0), id="sm100"),
         pytest.param(Arch(12, 0), id="sm120")]
# FP8 e4m3 activations and weights, FP32 accumulation, BF16 output: against the float64 product of
# the unquantized operands the relative L2 error is ~0.03-0.05 for random data (docs/models.md).
TOL_VS_FP = 0.08


def _linear(k, n, bias, device, seed):
    g = torch.Generator().manual_seed(seed)
    lin = nn.Linear(k, n, bias=bias, dtype=torch.bfloat16)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(n, k, generator=g) * 0.05)
        if bias:
            lin.bias.copy_(torch.randn(n, generator=g))
    return lin.to(device)


def _oracle(mod, x):
    """float64: x quantized per 1x128 group as the Arch's kernels do (power-of-two scales for UE8M0),
    times the module's FP8 weight."""
    x2 = x.reshape(-1, mod.in_features)
    qa, sa = QR.per_token_group_quant_ref(x2.float(), 128, pow2=mod.prepare()["arch"].scale_format == "ue8m0")
    a = QR.group_dequant_ref(qa, sa, 128).double()
    w = B.dequantize_weight_blocks(mod.weight.cpu(), mod.weight_scale_inv.cpu(), 128, torch.float64)
    y = a @ w.T
    if mod.bias is not None:
        y = y + mod.bias.double().cpu()
    return y.reshape(*x.shape[:-1], mod.out_features)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_forward_against_the_oracle(device, arch, dtype):
    lin = _linear(384, 320, True, device, seed=1)  # N not a multiple of 128
    mod = fp8nn.FP8Linear.from_linear(lin, arch=arch)
    x = torch.randn(2, 5, 384, generator=torch.Generator().manual_seed(2)).to(device, dtype)
    y = mod(x)
    assert y.shape == (2, 5, 320) and y.dtype == dtype
    assert torch.isfinite(y).all()
    # the module's own FP8 weight, exactly: only bf16 rounding of the output and the summation order
    assert rel_l2(y.cpu(), _oracle(mod, x).cpu()) < 8e-3
    # and the unquantized layer: FP8 noise
    assert rel_l2(y.cpu(), lin(x.to(torch.bfloat16)).detach().double().cpu()) < TOL_VS_FP


@pytest.mark.parametrize("device", DEVICES)
def test_ue8m0_archs_read_power_of_two_scales_exactly(device):
    """from_linear writes power-of-two block scales for UE8M0 archs: the operands the GEMM reads are
    the direct-path ones (bit-exact), and the published-format scales are those powers of two."""
    lin = _linear(256, 256, False, device, seed=3)
    mod = fp8nn.FP8Linear.from_linear(lin, arch=Arch(10, 0))
    q, packed = B.quantize_weight_ue8m0_packed(lin.weight.detach())
    run = mod.prepare()
    assert_bits_equal(run["q"], q, "q")
    assert_bits_equal(run["s"], packed, "packed scales")
    assert torch.equal(mod.weight_scale_inv, torch.exp2(torch.log2(mod.weight_scale_inv).round()))


@pytest.mark.parametrize("device", DEVICES)
def test_fp32_block_scales_on_a_ue8m0_arch_take_the_legacy_path(device):
    lin = _linear(256, 192, False, device, seed=4)
    q, s = B.quantize_weight_blocks(lin.weight.detach(), 128)  # FP32 (not power-of-two) scales
    assert not torch.equal(s, torch.exp2(torch.log2(s).round()))
    mod = fp8nn.FP8Linear.from_fp8(q, s, arch=Arch(12, 0))
    want_q, want_s = B.requant_ue8m0(q, s, 128)
    run = mod.prepare()
    assert_bits_equal(run["q"], want_q, "requantized q")
    assert_bits_equal(run["s"], B.pack_weight_scales_per_row(want_s, 192), "packed scales")
    x = torch.randn(7, 256, generator=torch.Generator().manual_seed(5)).to(device, torch.bfloat16)
    assert rel_l2(mod(x).cpu(), lin(x).detach().double().cpu()) < TOL_VS_FP


def test_state_dict_is_the_published_format_and_round_trips():
    mod = fp8nn.FP8Linear.from_linear(_linear(256, 200, True, "cpu", seed=6), arch=Arch(9, 0))
    sd = mod.state_dict()
    assert sorted(sd) == ["bias", "weight", "weight_scale_inv"]
    assert sd["weight"].dtype == torch.float8_e4m3fn and sd["weight"].shape == (200, 256)
    assert sd["weight_scale_inv"].dtype == torch.float32 and sd["weight_scale_inv"].shape == (2, 2)
    fresh = fp8nn.FP8Linear(256, 200, bias=True, arch=Arch(9, 0))
    x = torch.randn(3, 256, dtype=torch.bfloat16)
    before = fresh(x)  # derives operands from the zero weight; loading must invalidate them
    fresh.load_state_dict(sd)
    assert not torch.equal(before, fresh(x))
    assert_bits_equal(fresh(x), mod(x), "after load_state_dict")
    for name, t in sd.items():
        assert_bits_equal(fresh.state_dict()[name], t, name)


def test_dtype_casts_leave_fp8_weights_and_scales_alone():
    mod = fp8nn.FP8Linear.from_linear(_linear(128, 128, True, "cpu", seed=7), arch=Arch(9, 0))
    w, s = mod.weight.clone(), mod.weight_scale_inv.clone()
    seq = nn.Sequential(mod).to(torch.float16)  # what users do to a whole model
    assert_bits_equal(seq[0].weight, w, "weight")
    assert_bits_equal(seq[0].weight_scale_inv, s, "weight_scale_inv")
    seq.half()
    assert seq[0].weight.dtype == torch.float8_e4m3fn and seq[0].weight_scale_inv.dtype == torch.float32


@pytest.mark.parametrize("device", DEVICES)
def test_empty_and_leading_dims(device):
    mod = fp8nn.FP8Linear.from_linear(_linear(128, 64, False, device, seed=8), arch=Arch(9, 0))
    assert mod(torch.randn(0, 128, device=device, dtype=torch.bfloat16)).shape == (0, 64)
    x = torch.randn(2, 3, 4, 128, generator=torch.Generator().manual_seed(9)).to(device, torch.bfloat16)
    assert_bits_equal(mod(x), mod(x.reshape(24, 128)).reshape(2, 3, 4, 64), "leading dims")


def test_from_the_loaders_fp8_weight_in_either_format():
    w = torch.randn(256, 384, generator=torch.Generator().manual_seed(10)).to(torch.bfloat16)
    fp32 = LD.quantize_weight("w", w, Arch(9, 0))
    packed = LD.quantize_weight("w", w, Arch(10, 0))
    assert packed.scale_format == "ue8m0"
    a = fp8nn.FP8Linear.from_fp8_weight(fp32, arch=Arch(9, 0))
    b = fp8nn.FP8Linear.from_fp8_weight(packed, arch=Arch(10, 0))
    assert_bits_equal(a.weight_scale_inv, fp32.scales, "fp32 scales")
    q, s = B.quantize_weight_blocks(w, 128, pow2=True)
    assert_bits_equal(b.weight, q, "q")
    assert_bits_equal(b.weight_scale_inv, s, "unpacked block scales")
    assert_bits_equal(b.prepare()["s"], packed.scales, "repacked")


@pytest.mark.parametrize("call,err,needle", [
    (lambda: fp8nn.FP8Linear(100, 64), ValueError, "in_features=100 must be a multiple of 128"),
    (lambda: fp8nn.FP8Linear(128, 0), ValueError, "out_features must be a positive int"),
    (lambda: fp8nn.FP8Linear(128, 64, arch="sm90"), TypeError, "arch must be an rtp_fp8.arch.Arch"),
    (lambda: fp8nn.FP8Linear.from_fp8(torch.zeros(64, 128), torch.ones(1, 1)), ValueError,
     "weight must be a 2-D torch.float8_e4m3fn tensor"),
    (lambda: fp8nn.FP8Linear.from_fp8(torch.zeros(64, 128).to(torch.float8_e4m3fn), torch.ones(2, 1)), ValueError,
     "weight_scale_inv must be float32 [1, 1] for weight [64, 128]"),
    (lambda: fp8nn.FP8Linear.from_fp8(torch.zeros(64, 128).to(torch.float8_e4m3fn), torch.ones(1, 1),
                                      torch.zeros(3)), ValueError, "bias must be [64]"),
    (lambda: fp8nn.FP8Linear.from_linear(nn.Conv1d(1, 1, 1)), TypeError, "linear must be a torch.nn.Linear"),
    (lambda: fp8nn.FP8Linear(128, 64, arch=Arch(9, 0))(torch.zeros(2, 64)), ValueError,
     "x must be [..., in_features=128]"),
    (lambda: fp8nn.FP8Linear(128, 64, arch=Arch(9, 0))(torch.zeros(2, 128, dtype=torch.int32)), TypeError,
     "x must be bf16/fp16/fp32"),
    (lambda: fp8nn.quantize_model(nn.Linear(128, 128), skip="lm_head"), TypeError,
     "skip must be a sequence of name patterns"),
    (lambda: fp8nn.weight_plan(nn.Linear(128, 128), {"*": "diagonal"}), ValueError,
     "roles must be 'column', 'row' or 'fp8'"),
])
def test_bad_input_names_the_argument(call, err, needle):
    with pytest.raises(err) as exc:
        call()
    assert needle in str(exc.value)


class Toy(nn.Module):
    """Names as real models use them: an embedding, attention and MLP projections, a router, a head."""

    def __init__(self):
        super().__init__()
        self.embed_tokens = nn.Embedding(64, 256)
        self.q_proj = nn.Linear(256, 256, bias=False)
        self.o_proj = nn.Linear(256, 256, bias=True)
        self.gate = nn.Linear(256, 8, bias=False)  # MoE router
        self.up_proj = nn.Linear(256, 512, bias=False)
        self.down_proj = nn.Linear(512, 256, bias=True)
        self.odd = nn.Linear(100, 128)  # K not a multiple of 128
        self.lm_head = nn.Linear(256, 64, bias=False)

    def forward(self, ids):
        h = self.embed_tokens(ids)
        h = h + self.o_proj(self.q_proj(h))
        h = h + self.down_proj(torch.relu(self.up_proj(h)))
        return self.lm_head(h)


def _toy(seed=11):
    torch.manual_seed(seed)
    return Toy().to(torch.bfloat16).eval()


def test_quantize_model_converts_and_reports():
    model = _toy()
    report = fp8nn.quantize_model(model, arch=Arch(9, 0))
    assert [c[0] for c in report.converted] == ["q_proj", "o_proj", "up_proj", "down_proj"]
    assert report.skipped == {"gate": "matches skip pattern 'gate'",
                              "odd": "in_features=100 is not a multiple of 128",
                              "lm_head": "matches skip pattern 'lm_head'"}
    assert str(report).splitlines()[0] == "rtp_fp8: 4 of 7 linear layers in FP8"
    assert isinstance(model.q_proj, fp8nn.FP8Linear) and type(model.lm_head) is nn.Linear
    ids = torch.randint(0, 64, (2, 6), generator=torch.Generator().manual_seed(12))
    with torch.no_grad():
        ref, got = _toy()(ids), model(ids)
    assert rel_l2(got, ref) < TOL_VS_FP
    again = fp8nn.quantize_model(model, arch=Arch(9, 0))  # idempotent
    assert [c[0] for c in again.converted] == [c[0] for c in report.converted]


def test_weight_plan_from_names_with_overrides():
    plan = fp8nn.weight_plan(_toy())
    assert plan == {"q_proj": "column", "o_proj": "row", "gate": "fp8", "up_proj": "column", "down_proj": "row",
                    "odd": "fp8", "lm_head": "fp8"}
    assert fp8nn.weight_plan(_toy(), {"q_*": "fp8", "odd": "row"})["q_proj"] == "fp8"


def test_tensor_parallel_load_from_an_fp8_checkpoint(tmp_path):
    """Column shards concatenate to the whole layer's output bit for bit (same activation groups);
    row shards sum to it within the FP32-accumulation tolerance; the bias is added on rank 0 only."""
    model = _toy()
    fp8nn.quantize_model(model, arch=Arch(9, 0))
    fp8nn.save_checkpoint(model, tmp_path)
    x = torch.randn(5, 256, generator=torch.Generator().manual_seed(13)).to(torch.bfloat16)
    shards = []
    for rank in range(2):
        m = _toy(seed=99)
        report = fp8nn.load_checkpoint(m, tmp_path, arch=Arch(9, 0), tp=2, rank=rank)
        assert ("up_proj", 256, 256) in report.converted and ("down_proj", 256, 256) in report.converted
        shards.append(m)
    up = torch.cat([s.up_proj(x) for s in shards], dim=-1)
    assert_bits_equal(up, model.up_proj(x), "column-parallel up_proj")
    h = torch.randn(5, 512, generator=torch.Generator().manual_seed(14)).to(torch.bfloat16)
    parts = [s.down_proj(h[:, r * 256:(r + 1) * 256]).float() for r, s in enumerate(shards)]
    assert shards[1].down_proj.bias is None and shards[0].down_proj.bias is not None
    assert rel_l2(parts[0] + parts[1], model.down_proj(h).float()) < 1e-2


def test_checkpoint_round_trip_is_bit_exact(tmp_path):
    model = _toy()
    fp8nn.quantize_model(model, arch=Arch(10, 0))
    fp8nn.save_checkpoint(model, tmp_path, config={"model_type": "toy"})
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["model_type"] == "toy"
    assert cfg["quantization_config"] == {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                          "weight_block_size": [128, 128],
                                          "modules_to_not_convert": ["gate", "odd", "lm_head"]}
    from safetensors import safe_open

    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        meta = json.loads(f.metadata()["rtp_fp8"])
        assert f.get_tensor("q_proj.weight").dtype == torch.float8_e4m3fn
        assert f.get_tensor("q_proj.weight_scale_inv").shape == (2, 2)
    assert meta["fp8_modules"] == ["q_proj", "o_proj", "up_proj", "down_proj"]

    fresh = _toy(seed=77)
    fp8nn.load_checkpoint(fresh, tmp_path, arch=Arch(10, 0))
    for name, t in model.state_dict().items():
        assert_bits_equal(fresh.state_dict()[name], t, name)
    ids = torch.randint(0, 64, (2, 6), generator=torch.Generator().manual_seed(15))
    assert_bits_equal(fresh(ids), model(ids), "logits")


def test_scales_named_weight_scale_and_a_bf16_checkpoint(tmp_path):
    from safetensors.torch import load_file, save_file

    model = _toy()
    fp8nn.quantize_model(model, arch=Arch(9, 0))
    fp8nn.save_checkpoint(model, tmp_path / "a")
    t = load_file(str(tmp_path / "a/model.safetensors"))
    renamed = {k.replace("weight_scale_inv", "weight_scale"): v for k, v in t.items()}
    (tmp_path / "b").mkdir()
    save_file(renamed, str(tmp_path / "b/model.safetensors"))
    (tmp_path / "b/config.json").write_text((tmp_path / "a/config.json").read_text())
    fresh = _toy(seed=5)
    fp8nn.load_checkpoint(fresh, tmp_path / "b", arch=Arch(9, 0))
    assert_bits_equal(fresh.q_proj.weight_scale_inv, model.q_proj.weight_scale_inv, "weight_scale")

    # a BF16 checkpoint is quantized on load: the same modules as quantize_model, the same bits
    (tmp_path / "c").mkdir()
    save_file({k: v.contiguous() for k, v in _toy().state_dict().items()}, str(tmp_path / "c/model.safetensors"))
    (tmp_path / "c/config.json").write_text("{}")
    loaded = _toy(seed=6)
    report = fp8nn.load_checkpoint(loaded, tmp_path / "c", arch=Arch(9, 0))
    assert [c[0] for c in report.converted] == ["q_proj", "o_proj", "up_proj", "down_proj"]
    for name, t in model.state_dict().items():
        assert_bits_equal(loaded.state_dict()[name], t, name)


@pytest.mark.parametrize("qc,needle", [
    ({"quant_method": "awq"}, "quantization_config.quant_method = 'awq'"),
    ({"quant_method": "fp8", "activation_scheme": "static", "weight_block_size": [128, 128]},
     "quantization_config.activation_scheme = 'static'"),
    ({"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [64, 64]},
     "quantization_config.weight_block_size = [64, 64]"),
    ({"quant_method": "fp8", "fmt": "e5m2", "activation_scheme": "dynamic", "weight_block_size": [128, 128]},
     "quantization_config.fmt = 'e5m2'"),
])
def test_checkpoints_this_loader_cannot_read_exactly_are_refused(tmp_path, qc, needle):
    model = _toy()
    fp8nn.quantize_model(model, arch=Arch(9, 0))
    fp8nn.save_checkpoint(model, tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"quantization_config": qc}))
    with pytest.raises(ValueError, match=needle.replace("[", r"\[").replace("]", r"\]")):
        fp8nn.load_checkpoint(_toy(), tmp_path)


def test_missing_scale_and_mismatched_model_are_named(tmp_path):
    from safetensors.torch import load_file, save_file

    model = _toy()
    fp8nn.quantize_model(model, arch=Arch(9, 0))
    fp8nn.save_checkpoint(model, tmp_path)
    t = load_file(str(tmp_path / "model.safetensors"))
    del t["o_proj.weight_scale_inv"]
    save_file(t, str(tmp_path / "model.safetensors"))
    with pytest.raises(KeyError, match="o_proj.weight is FP8 but neither o_proj.weight_scale_inv nor "
                                       "o_proj.weight_scale"):
        fp8nn.load_checkpoint(_toy(), tmp_path)


@pytest.mark.parametrize("device", DEVICES)
def test_gemm_is_what_the_backend_computes(device):
    """The module adds nothing to the GEMM but the bias: bit-exact with quantize + backend + bias."""
    from rtp_fp8.quant import quantize_activation

    lin = _linear(256, 128, True, device, seed=16)
    mod = fp8nn.FP8Linear.from_linear(lin, arch=Arch(9, 0))
    x = torch.randn(9, 256, generator=torch.Generator().manual_seed(17)).to(device, torch.bfloat16)
    run = mod.prepare()
    a, sa = quantize_activation(x, 128, arch=Arch(9, 0))
    want = (run["backend"].gemm_nt(a, sa, run["q"], run["s"]).float() + mod.bias.float()).to(torch.bfloat16)
    assert_bits_equal(mod(x), want, "forward")
    assert rel_l2(mod(x).cpu(), GR.gemm_nt_ref(a, sa, run["q"], run["s"]).double().cpu() + mod.bias.double().cpu()) \
        < 8e-3


@pytest.mark.gpu
def test_moves_to_cuda_and_replays_in_a_cuda_graph():
    """Built on the CPU, moved with .to("cuda"): the operands are derived again for the GPU's Arch;
    after prepare() a captured forward replays bit-identically to eager calls on new inputs."""
    mod = fp8nn.FP8Linear.from_linear(_linear(256, 256, True, "cpu", seed=18)).to("cuda")
    assert mod.weight.is_cuda and mod.weight.dtype == torch.float8_e4m3fn
    g = torch.Generator().manual_seed(19)
    x_static = torch.randn(16, 256, generator=g).to("cuda", torch.bfloat16)
    mod(x_static)  # eager warm-up: JIT compilation, operand derivation
    mod.prepare()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y_static = mod(x_static)
    for _ in range(2):
        x = torch.randn(16, 256, generator=g).to("cuda", torch.bfloat16)
        x_static.copy_(x)
        graph.replay()
        torch.cuda.synchronize()
        assert_bits_equal(y_static, mod(x), "graph replay")


@pytest.mark.gpu
def test_deepgemm_and_triton_backends_agree():
    from rtp_fp8.gemm import backends as BK

    lin = _linear(512, 256, True, "cuda", seed=20)
    arch = Arch(*torch.cuda.get_device_capability())
    why = BK.unavailable_reason("deepgemm", arch, 256, 512, device="cuda")
    if why:
        pytest.skip(f"DeepGEMM cannot run here: {why}")
    a = fp8nn.FP8Linear.from_linear(lin, backend="deepgemm")
    b = fp8nn.FP8Linear.from_linear(lin, backend="triton")
    assert a.prepare()["backend_name"] == "deepgemm" and b.prepare()["backend_name"] == "triton"
    x = torch.randn(33, 512, generator=torch.Generator().manual_seed(21)).to("cuda", torch.bfloat16)
    assert rel_l2(a(x), b(x)) < 2e-3


@pytest.mark.parametrize("device", DEVICES)
def test_torch_compile_sees_one_op(device):
    """The forward is one torch.library op with a fake implementation: torch.compile traces a model
    of FP8Linears whole (fullgraph) once prepare() ran, and gives the eager bits; the fake
implementation agrees with the real one (opcheck's fake-tensor test)."""
    model = nn.Sequential(_linear(256, 256, True, device, seed=22), nn.ReLU(), _linear(256, 128, False, device, 23))
    fp8nn.quantize_model(model, arch=Arch(9, 0))
    x = torch.randn(2, 4, 256, generator=torch.Generator().manual_seed(24)).to(device, torch.bfloat16)
    with torch.no_grad():
        want = model(x)  # eager: prepares the operands
        got = torch.compile(model, backend="eager", fullgraph=True)(x)
    assert_bits_equal(got, want, "compiled")
    run = model[0].prepare()
    torch.library.opcheck(torch.ops.rtp_fp8.fp8_linear, (x.reshape(8, 256), run["q"], run["s"], model[0].bias, 9, 0,
                                                          run["backend_name"]), test_utils="test_faketensor")
