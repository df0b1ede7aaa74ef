"""FP8 for PyTorch models: an nn.Module linear, one-call conversion, FP8 checkpoints.

    from rtp_fp8 import nn as fp8nn
    report = fp8nn.quantize_model(model)                   # every eligible nn.Linear -> FP8Linear
    print(report)                                          # what was converted, what was skipped and why
    fp8nn.save_checkpoint(model, "out/", config=model.config.to_dict())
    fp8nn.load_checkpoint(fresh_model, "out/", tp=2, rank=0)   # FP8 (published format) or BF16

`FP8Linear` holds its weight the way block-scaled FP8 checkpoints publish it (DeepSeek-V3 and
the FP8 releases that follow it, transformers' FineGrainedFP8Config): `weight` float8_e4m3fn
[N, K] and `weight_scale_inv` float32 [ceil(N/128), ceil(K/128)], the multiplier that turns a
128x128 block back into real values; `bias` as nn.Linear has it. Those are its state_dict, so
`state_dict()` / `load_state_dict()` / safetensors round-trip bit-exactly and `.to(device)` moves
them (a dtype change such as `model.to(torch.float16)` is refused for them: it would round the
scales). What the Arch's GEMM reads is derived from them once per device: SM90 and the CPU read
them as they are; SM100/SM120 read packed UE8M0 per-row scales, exact when the block scales are
powers of two (what `from_linear` writes for those archs), else through the legacy requant path
(dequantize, requantize with power-of-two scales; lossy, logged once).

Each call quantizes the input per 1x128 token group in the Arch's layout and runs the backend
`rtp_fp8.gemm.backends.select` picks (DeepGEMM where it serves the Arch and shape, Triton
otherwise); any leading dims; the output has the input's dtype (the GEMM accumulates in FP32 and
rounds to BF16 first). The work is one torch.library op, `torch.ops.rtp_fp8.fp8_linear` (with a
fake implementation), so torch.compile sees the module whole. `prepare()` derives the operands
eagerly (it syncs once, checking the scales), so a CUDA graph captured or a model compiled
afterwards holds no host sync.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import json
import logging
import pathlib

import torch
from torch import nn

from rtp_fp8 import arch as A
from rtp_fp8._logging import log_once
from rtp_fp8.gemm import backends as BK
from rtp_fp8.quant import activation_scale_layout, ue8m0
from rtp_fp8.quant import block as B
from rtp_fp8.quant import token_group as T
from rtp_fp8.quant import tp as TP
from rtp_fp8.quant.layout import cdiv

log = logging.getLogger("rtp_fp8.nn")
_logged: set[str] = set()

BLOCK = 128
# What config.json's quantization_config says for these checkpoints (DeepSeek-V3's, and what
# transformers' FineGrainedFP8Config reads).
QUANT_CONFIG = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                "weight_block_size": [BLOCK, BLOCK]}
SCALE_NAMES = ("weight_scale_inv", "weight_scale")  # the second: some releases name it so
# Linear layers left in their precision by default: output heads, embeddings, MoE routers.
DEFAULT_SKIP = ("lm_head", "*embed*", "*router*", "*.gate", "gate", "*classifier*", "*.score", "score")
# Tensor-parallel role of a linear, by the end of its name (column: split N; row: split K).
COLUMN = ("q_proj", "k_proj", "v_proj", "qkv_proj", "query_key_value", "gate_proj", "up_proj",
          "gate_up_proj", "query", "key", "value", "intermediate.dense", "fc1", "w1", "w3", "c_fc", "c_attn")
ROW = ("o_proj", "down_proj", "out_proj", "attention.output.dense", "output.dense", "fc2", "w2", "c_proj",
       "dense_4h_to_h")


def _log_once(key: str, msg: str, *args) -> None:
    log_once(log, _logged, key, msg, *args)


@torch.library.custom_op("rtp_fp8::fp8_linear", mutates_args=())
def fp8_linear(x: torch.Tensor, q: torch.Tensor, s: torch.Tensor, bias: torch.Tensor | None, arch_major: int,
               arch_minor: int, backend: str) -> torch.Tensor:
    """x [M, K] -> [M, N] in x's dtype: per-token-group quantization in the Arch's layout, the
    backend's GEMM with the Arch's weight operands (q, s), bias. One opaque op for torch.compile."""
    arch = A.Arch(arch_major, arch_minor)
    a, sa = T.per_token_group_quant(x, BLOCK, scale_layout=activation_scale_layout(arch))
    y = BK.get(backend, arch, x.device).gemm_nt(a, sa, q, s)
    if bias is not None:
        y = (y.float() + bias.float()).to(torch.bfloat16)
    return y.to(x.dtype)


@fp8_linear.register_fake
def _(x, q, s, bias, arch_major, arch_minor, backend):
    return x.new_empty(x.shape[0], q.shape[0])


class FP8Linear(nn.Module):
    """y = x W^T + b with W in block-scaled FP8 (see the module doc)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *, arch: A.Arch | None = None,
                 backend: str | None = None, device=None, bias_dtype: torch.dtype = torch.bfloat16):
        super().__init__()
        for what, v in (("in_features", in_features), ("out_features", out_features)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{what} must be a positive int, got {v!r}")
        if in_features % BLOCK:
            raise ValueError(f"in_features={in_features} must be a multiple of {BLOCK} (the activation group)")
        if arch is not None and not isinstance(arch, A.Arch):
            raise TypeError(f"arch must be an rtp_fp8.arch.Arch or None, got {type(arch).__name__}")
        self.in_features, self.out_features = in_features, out_features
        self.arch_request, self.backend_request = arch, backend
        self.register_buffer("weight", torch.zeros(out_features, in_features, dtype=torch.float8_e4m3fn,
                                                   device=device))
        self.register_buffer("weight_scale_inv", torch.ones(cdiv(out_features, BLOCK), cdiv(in_features, BLOCK),
                                                            dtype=torch.float32, device=device))
        if bias:
            self.bias = nn.Parameter(torch.zeros(out_features, dtype=bias_dtype, device=device), requires_grad=False)
        else:
            self.register_parameter("bias", None)
        self._run = None
        self.register_load_state_dict_post_hook(lambda module, keys: module.invalidate())

    # ------------------------------------------------------------------ construction

    @classmethod
    def from_linear(cls, linear: nn.Linear, arch: A.Arch | None = None, backend: str | None = None) -> FP8Linear:
        """Quantize an nn.Linear's weight in 128x128 blocks (power-of-two scales where `arch` reads UE8M0)."""
        if not isinstance(linear, nn.Linear):
            raise TypeError(f"linear must be a torch.nn.Linear, got {type(linear).__name__}")
        w = linear.weight.detach()
        if w.dtype not in (torch.bfloat16, torch.float16, torch.float32):
            raise TypeError(f"linear.weight must be bf16/fp16/fp32 to quantize, got {w.dtype}")
        resolved = A.resolve(arch, w.device)
        q, s = B.quantize_weight_blocks(w, BLOCK, pow2=resolved.scale_format == "ue8m0")
        bias = None if linear.bias is None else linear.bias.detach()
        return cls.from_fp8(q, s, bias, arch=arch, backend=backend)

    @classmethod
    def from_fp8(cls, weight: torch.Tensor, weight_scale_inv: torch.Tensor, bias: torch.Tensor | None = None, *,
                 arch: A.Arch | None = None, backend: str | None = None) -> FP8Linear:
        """From a published-format pair: float8_e4m3fn [N, K] and float32 [ceil(N/128), ceil(K/128)]."""
        if not isinstance(weight, torch.Tensor) or weight.dim() != 2 or weight.dtype != torch.float8_e4m3fn:
            raise ValueError(f"weight must be a 2-D torch.float8_e4m3fn tensor [N, K], got "
                             f"{getattr(weight, 'dtype', type(weight).__name__)} {tuple(getattr(weight, 'shape', ()))}")
        n, k = weight.shape
        want = (cdiv(n, BLOCK), cdiv(k, BLOCK))
        if not isinstance(weight_scale_inv, torch.Tensor) or tuple(weight_scale_inv.shape) != want \
                or weight_scale_inv.dtype != torch.float32:
            got = (getattr(weight_scale_inv, "dtype", None), tuple(getattr(weight_scale_inv, "shape", ())))
            raise ValueError(f"weight_scale_inv must be float32 {list(want)} for weight [{n}, {k}], got {got}")
        if weight_scale_inv.device != weight.device:
            raise ValueError(f"weight_scale_inv is on {weight_scale_inv.device}, weight on {weight.device}")
        if bias is not None and (not isinstance(bias, torch.Tensor) or tuple(bias.shape) != (n,)):
            raise ValueError(f"bias must be [{n}], got {tuple(getattr(bias, 'shape', ()))}")
        mod = cls(k, n, bias is not None, arch=arch, backend=backend, device=weight.device,
                  bias_dtype=bias.dtype if bias is not None else torch.bfloat16)
        mod.weight.copy_(weight)
        mod.weight_scale_inv.copy_(weight_scale_inv)
        if bias is not None:
            mod.bias.data.copy_(bias.to(weight.device))
        return mod

    @classmethod
    def from_fp8_weight(cls, w, bias: torch.Tensor | None = None, *, arch: A.Arch | None = None,
                        backend: str | None = None) -> FP8Linear:
        """From the loader's `Fp8Weight` (FP32 block scales, or packed UE8M0 per-row scales)."""
        if w.q.dim() != 2:
            raise ValueError(f"an FP8Linear holds one 2-D weight, got {tuple(w.q.shape)}")
        scales = w.scales
        if w.scale_format == "ue8m0":
            n, k = w.q.shape
            rows = ue8m0.unpack(scales, cdiv(k, BLOCK))  # per-row copies of the block scales
            scales = rows[::BLOCK].contiguous()
            if not torch.equal(rows, scales.repeat_interleave(BLOCK, 0)[:n]):
                raise ValueError("packed per-row scales differ within a 128-row block: not block scales")
        return cls.from_fp8(w.q, scales, bias, arch=arch, backend=backend)

    # ------------------------------------------------------------------ run time

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"format=fp8_e4m3 block {BLOCK}x{BLOCK}")

    def invalidate(self) -> None:
        """Forget the derived GEMM operands (after the buffers were replaced or edited in place)."""
        self._run = None

    def _apply(self, fn, recurse=True):
        # .to(device) moves the FP8 weight and its scales; a dtype change would round them
        # (float8 and float32 are "floating point" to nn.Module), so they keep theirs.
        def keep_dtype(t):
            out = fn(t)
            return out if out.dtype == t.dtype else t.to(device=out.device)

        self.invalidate()
        return super()._apply(keep_dtype, recurse)

    def prepare(self):
        """The operands the Arch's GEMM reads, derived once per device (call before CUDA-graph capture)."""
        dev = self.weight.device
        if self._run is not None and self._run["device"] == dev:
            return self._run
        arch = A.resolve(self.arch_request, dev)
        q, s = self.weight, self.weight_scale_inv
        if arch.scale_format == "ue8m0":
            if not bool(ue8m0.is_pow2(s).all()):
                _log_once(f"legacy:{arch}", "rtp_fp8.nn: block scales that are not powers of two meet %s's UE8M0 "
                          "GEMM: requantized through the legacy path (lossy)", arch)
                q, s = B.requant_ue8m0(q, s, BLOCK)
            s = B.pack_weight_scales_per_row(s, self.out_features, BLOCK)
        name, _ = BK.select(arch, self.out_features, self.in_features, self.backend_request, device=dev)
        self._run = {"device": dev, "arch": arch, "q": q, "s": s, "backend": BK.get(name, arch, dev),
                     "backend_name": name}
        return self._run

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not isinstance(x, torch.Tensor) or x.dim() < 1 or x.shape[-1] != self.in_features:
            raise ValueError(f"x must be [..., in_features={self.in_features}], got {tuple(getattr(x, 'shape', ()))}")
        if x.dtype not in (torch.bfloat16, torch.float16, torch.float32):
            raise TypeError(f"x must be bf16/fp16/fp32, got {x.dtype}")
        if x.device != self.weight.device:
            raise ValueError(f"x is on {x.device}, the module on {self.weight.device}")
        run = self.prepare()
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features)
        if x2.shape[0] == 0:
            return x.new_zeros(*lead, self.out_features)
        arch = run["arch"]
        y = torch.ops.rtp_fp8.fp8_linear(x2.contiguous(), run["q"], run["s"], self.bias, arch.major, arch.minor,
                                         run["backend_name"])
        return y.reshape(*lead, self.out_features)


# ---------------------------------------------------------------------- model conversion


@dataclasses.dataclass
class Report:
    """What quantize_model / load_checkpoint did: converted linears (name, N, K) and skipped ones (name: why)."""

    converted: list[tuple[str, int, int]] = dataclasses.field(default_factory=list)
    skipped: dict[str, str] = dataclasses.field(default_factory=dict)

    def __str__(self) -> str:
        total = len(self.converted) + len(self.skipped)
        lines = [f"rtp_fp8: {len(self.converted)} of {total} linear layers in FP8"]
        lines += [f"  kept  {name}: {why}" for name, why in sorted(self.skipped.items())]
        return "\n".join(lines)


def _name_skip(name: str, skip) -> str | None:
    leaf = name.rsplit(".", 1)[-1]
    for pat in skip:
        if fnmatch.fnmatchcase(name, pat) or fnmatch.fnmatchcase(leaf, pat):
            return f"matches skip pattern {pat!r}"
    return None


def _skip_reason(name: str, linear: nn.Linear, skip) -> str | None:
    why = _name_skip(name, skip)
    if why:
        return why
    if linear.in_features % BLOCK:
        return f"in_features={linear.in_features} is not a multiple of {BLOCK}"
    if linear.weight.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        return f"weight dtype {linear.weight.dtype} is not bf16/fp16/fp32"
    if linear.weight.device.type == "meta":
        return "weight is on the meta device (load it first)"
    return None


def _check_skip(skip):
    if isinstance(skip, str) or not all(isinstance(p, str) for p in skip):
        raise TypeError(f"skip must be a sequence of name patterns (fnmatch), got {skip!r}")
    return tuple(skip)


def _linears(model: nn.Module):
    """(parent, attribute, full name, module) of every nn.Linear / FP8Linear, in module order."""
    for parent_name, parent in model.named_modules():
        for attr, child in parent.named_children():
            if isinstance(child, (nn.Linear, FP8Linear)):
                yield parent, attr, f"{parent_name}.{attr}" if parent_name else attr, child


def quantize_model(model: nn.Module, arch: A.Arch | None = None, skip=DEFAULT_SKIP,
                   backend: str | None = None) -> Report:
    """Replace, in place, every nn.Linear with K % 128 == 0 whose name matches no `skip` pattern
    (fnmatch on the full name or its last part; default: heads, embeddings, routers) by an FP8Linear."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    skip = _check_skip(skip)
    report = Report()
    for parent, attr, name, child in list(_linears(model)):
        if isinstance(child, FP8Linear):
            report.converted.append((name, child.out_features, child.in_features))
            continue
        why = _skip_reason(name, child, skip)
        if why:
            report.skipped[name] = why
            continue
        setattr(parent, attr, FP8Linear.from_linear(child, arch=arch, backend=backend))
        report.converted.append((name, child.out_features, child.in_features))
    return report


def _ends(name: str, suffixes) -> bool:
    return any(name == s or name.endswith("." + s) for s in suffixes)


def weight_plan(model: nn.Module, overrides: dict[str, str] | None = None) -> dict[str, str]:
    """Tensor-parallel role of each linear, from its name: "column" (split N: q/k/v, gate/up, ...),
    "row" (split K: o/down/out projections, ...) or "fp8" (whole on every rank). `overrides` maps
    fnmatch patterns of module names to a role and wins over the derived one."""
    overrides = dict(overrides or {})
    bad = {p: r for p, r in overrides.items() if r not in ("column", "row", "fp8")}
    if bad:
        raise ValueError(f"overrides: roles must be 'column', 'row' or 'fp8', got {bad}")
    plan = {}
    for _, _, name, _ in _linears(model):
        role = next((r for p, r in overrides.items() if fnmatch.fnmatchcase(name, p)), None)
        if role is None:
            role = "row" if _ends(name, ROW) else "column" if _ends(name, COLUMN) else "fp8"
        plan[name] = role
    return plan


# ---------------------------------------------------------------------- checkpoints


def save_checkpoint(model: nn.Module, out_dir, config: dict | None = None) -> pathlib.Path:
    """model.safetensors + config.json in the published block-FP8 format (FP8Linear: `weight` +
    `weight_scale_inv`; everything else as it is), config's quantization_config set, and rtp_fp8's
    own metadata (version, the FP8 modules) in the safetensors header."""
    from safetensors.torch import save_file

    from rtp_fp8 import __version__

    if config is not None and not isinstance(config, dict):
        raise TypeError(f"config must be a dict (e.g. model.config.to_dict()), got {type(config).__name__}")
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tensors, seen = {}, set()
    for k, v in model.state_dict().items():
        v = v.detach().to("cpu").contiguous()
        key = (v.untyped_storage().data_ptr(), v.storage_offset(), tuple(v.shape))
        tensors[k] = v.clone() if key in seen else v  # tied weights: safetensors stores each once
        seen.add(key)
    fp8 = [name for _, _, name, m in _linears(model) if isinstance(m, FP8Linear)]
    kept = [name for _, _, name, m in _linears(model) if not isinstance(m, FP8Linear)]
    meta = {"format": "pt", "rtp_fp8": json.dumps({"version": __version__, "fp8_modules": fp8})}
    save_file(tensors, str(out / "model.safetensors"), metadata=meta)
    cfg = dict(config or {})
    cfg["quantization_config"] = dict(QUANT_CONFIG, modules_to_not_convert=kept)
    (out / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    return out


def check_quant_config(cfg: dict, where: str) -> dict | None:
    """The checkpoint's quantization_config (None for a high-precision checkpoint); refuses what
    this loader cannot read exactly."""
    qc = cfg.get("quantization_config")
    if qc is None:
        return None
    if not isinstance(qc, dict):
        raise ValueError(f"{where}: quantization_config must be an object, got {type(qc).__name__}")
    for key, want in (("quant_method", "fp8"), ("fmt", "e4m3"), ("activation_scheme", "dynamic")):
        got = qc.get(key, want if key == "fmt" else None)
        if got != want:
            raise ValueError(f"{where}: quantization_config.{key} = {got!r}; rtp_fp8 reads {key} {want!r}")
    if list(qc.get("weight_block_size") or []) != [BLOCK, BLOCK]:
        raise ValueError(f"{where}: quantization_config.weight_block_size = {qc.get('weight_block_size')!r}; "
                         f"rtp_fp8 reads [{BLOCK}, {BLOCK}] blocks")
    return qc


def _split_bias(bias, role, tp, rank):
    if bias is None or tp == 1 or role == "fp8":
        return bias
    if role == "column":
        n = bias.shape[0] // tp
        return bias[rank * n:(rank + 1) * n]
    return bias if rank == 0 else None  # row-parallel: added once, after the partial sums are reduced


def load_checkpoint(model: nn.Module, ckpt_dir, arch: A.Arch | None = None, backend: str | None = None,
                    tp: int = 1, rank: int = 0, plan: dict[str, str] | None = None,
                    skip=DEFAULT_SKIP) -> Report:
    """Load a checkpoint folder (config.json + *.safetensors) into `model`, FP8 linears included.

    A block-FP8 checkpoint (quantization_config as QUANT_CONFIG; scales named weight_scale_inv or
    weight_scale) loads its FP8 tensors as they are; a high-precision one is quantized on load
    (the linears quantize_model would convert). With tp > 1 each FP8 linear keeps this rank's part
    (`plan`: weight_plan(model) by default), split on 128-blocks before any UE8M0 packing; a
    row-parallel bias stays on rank 0. Every other tensor must match the model (names and shapes)."""
    from rtp_fp8.loader import online_fp8 as LD

    LD.check_tp(tp, rank)
    skip = _check_skip(skip)
    cfg, tensors = LD.load_safetensors(ckpt_dir)
    fp8_ckpt = check_quant_config(cfg, f"{ckpt_dir}/config.json") is not None
    plan = weight_plan(model) if plan is None else dict(plan)
    report = Report()
    for parent, attr, name, _ in list(_linears(model)):
        w = tensors.get(f"{name}.weight")
        if w is None:
            continue
        bias = tensors.pop(f"{name}.bias", None)
        role = plan.get(name, "fp8")
        if role not in ("column", "row", "fp8"):
            raise ValueError(f"plan[{name!r}] must be 'column', 'row' or 'fp8', got {role!r}")
        if w.dtype == torch.float8_e4m3fn:
            scale_key = next((f"{name}.{s}" for s in SCALE_NAMES if f"{name}.{s}" in tensors), None)
            if scale_key is None:
                raise KeyError(f"{ckpt_dir}: {name}.weight is FP8 but neither {name}.weight_scale_inv nor "
                               f"{name}.weight_scale is in the checkpoint")
            del tensors[f"{name}.weight"]
            q, s = w, tensors.pop(scale_key).to(torch.float32)
            if tp > 1 and role != "fp8":
                try:
                    q, s = TP.split_weight(q, s, tp, rank, "n" if role == "column" else "k", BLOCK)
                except ValueError as exc:
                    raise ValueError(f"{name}: {exc}") from None
            mod = FP8Linear.from_fp8(q.contiguous(), s.contiguous(), _split_bias(bias, role, tp, rank),
                                     arch=arch, backend=backend)
        else:  # high precision: kept as it is in an FP8 checkpoint, else quantized like quantize_model would
            why = "high precision in an FP8 checkpoint" if fp8_ckpt else _name_skip(name, skip) or (
                f"in_features={w.shape[-1]} is not a multiple of {BLOCK}" if w.shape[-1] % BLOCK else None)
            if why:
                if bias is not None:
                    tensors[f"{name}.bias"] = bias
                report.skipped[name] = why
                continue
            del tensors[f"{name}.weight"]
            fw = LD.quantize_weight(name, w, A.resolve(arch, w.device), role, tp, rank, BLOCK)
            mod = FP8Linear.from_fp8_weight(fw, _split_bias(bias, role, tp, rank), arch=arch, backend=backend)
        setattr(parent, attr, mod)
        report.converted.append((name, mod.out_features, mod.in_features))
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    fp8_keys = {f"{n}.{t}" for n, _, _ in report.converted for t in ("weight", "weight_scale_inv", "bias")}
    missing = [k for k in missing if k not in fp8_keys]
    if missing or unexpected:
        raise KeyError(f"{ckpt_dir}: checkpoint and model differ: missing {missing[:8]}, unexpected "
                       f"{list(unexpected)[:8]}")
    return report
