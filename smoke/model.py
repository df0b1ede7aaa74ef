"""The embedded default model: a small decoder that needs no download.

Two layers: causal single-head attention (q/k/v/o dense linears) and an MLP (layer 0:
dense gate/up/down; layer 1: MoE, 4 experts, top-2, stacked [E, N, K] weights). Weights
come from a seed and are saved as a BF16 safetensors checkpoint on first use.

Channel magnitudes are uneven (rows and columns of a linear scaled by 2^u, u uniform in
[-channel_spread, channel_spread] per 128 channels plus +-0.5 per channel, then renormalized),
as in real checkpoints, so that block scales differ and a scale laid out wrongly changes the
numbers.

Built for large greedy margins: the LM head is the embedding shifted by one row, so the
residual stream (embedding of the last token plus small layer contributions) picks
"token + 1" with a margin of ~H, while attention, MLP and MoE still move the logits
enough that a broken FP8 path shows. FP8 noise is not what decides the tokens.

The same forward runs in BF16 (reference: float32 math on BF16 weights) or FP8 (online
quantized weights, per-token-group quantized activations, a GEMM backend), with tensor
parallelism emulated in one process (column/row-parallel parts, partial sums).
"""

from __future__ import annotations

import json
import math
import os
import pathlib

import torch

from rtp_fp8.gemm import reference as GR
from rtp_fp8.gemm.triton import block_scaled as G
from rtp_fp8.loader import online_fp8 as LD
from rtp_fp8.quant import quantize_activation

CONFIG = {"architecture": "rtp_fp8_smoke_decoder", "vocab": 512, "hidden": 512, "ffn": 1024, "moe_ffn": 512,
          "experts": 4, "topk": 2, "layers": 2, "moe_layers": [1], "seed": 20261202, "channel_spread": 2}
def _cache_dir() -> pathlib.Path:
    """Where the seeded checkpoint is written: $RTP_FP8_CACHE, else $TEST_TMPDIR under `bazel test`
    (the runfiles are read-only: nothing may write into the source tree), else smoke/.cache."""
    base = os.environ.get("RTP_FP8_CACHE") or os.environ.get("TEST_TMPDIR")
    return (pathlib.Path(base) if base else pathlib.Path(__file__).resolve().parent / ".cache") / "default_model"


CACHE = _cache_dir()


def weight_plan(cfg: dict) -> dict[str, str]:
    plan = {}
    for i in range(cfg["layers"]):
        p = f"layers.{i}."
        plan.update({p + "wq": "column", p + "wk": "column", p + "wv": "column", p + "wo": "row"})
        if i in cfg["moe_layers"]:
            plan.update({p + "experts.w_gate": "column", p + "experts.w_up": "column", p + "experts.w_down": "row"})
        else:
            plan.update({p + "w_gate": "column", p + "w_up": "column", p + "w_down": "row"})
    return plan


def generate_weights(cfg: dict) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(cfg["seed"])
    v, h, f, mf, e = cfg["vocab"], cfg["hidden"], cfg["ffn"], cfg["moe_ffn"], cfg["experts"]

    spread = cfg.get("channel_spread", 0)

    def rnd(*shape, scale):
        w = torch.randn(*shape, generator=g) * scale
        if spread:  # uneven channel magnitudes, as real checkpoints have: 128x128 block scales differ
            def factors(n):  # 2^u per 128 channels, u uniform in [-spread, spread], times 2^(+-0.5) per channel
                u = torch.rand(*shape[:-2], -(-n // 128), generator=g) * 2 * spread - spread
                u = u.repeat_interleave(128, -1)[..., :n] + torch.rand(*shape[:-2], n, generator=g) - 0.5
                return 2.0 ** u

            f = factors(shape[-2])[..., :, None] * factors(shape[-1])[..., None, :]
            w = w * f / f.pow(2).mean((-2, -1), keepdim=True).sqrt()
        return w.to(torch.bfloat16)

    emb = torch.randn(v, h, generator=g)
    emb = emb / emb.norm(dim=1, keepdim=True) * math.sqrt(h)
    w = {"embed": emb.to(torch.bfloat16), "lm_head": torch.roll(emb, 1, 0).to(torch.bfloat16) / math.sqrt(h)}
    for i in range(cfg["layers"]):
        p = f"layers.{i}."
        w[p + "attn_norm"] = torch.ones(h, dtype=torch.bfloat16)
        w[p + "mlp_norm"] = torch.ones(h, dtype=torch.bfloat16)
        for n in ("wq", "wk", "wv"):
            w[p + n] = rnd(h, h, scale=1 / math.sqrt(h))
        w[p + "wo"] = rnd(h, h, scale=0.3 / math.sqrt(h))
        if i in cfg["moe_layers"]:
            w[p + "router"] = rnd(e, h, scale=1 / math.sqrt(h))
            w[p + "experts.w_gate"] = rnd(e, mf, h, scale=1 / math.sqrt(h))
            w[p + "experts.w_up"] = rnd(e, mf, h, scale=1 / math.sqrt(h))
            w[p + "experts.w_down"] = rnd(e, h, mf, scale=0.3 / math.sqrt(mf))
        else:
            w[p + "w_gate"] = rnd(f, h, scale=1 / math.sqrt(h))
            w[p + "w_up"] = rnd(f, h, scale=1 / math.sqrt(h))
            w[p + "w_down"] = rnd(h, f, scale=0.3 / math.sqrt(f))
    return w


def tensor_names(cfg: dict) -> list[str]:
    """The tensor names a checkpoint of this architecture holds (for --model-dir's check)."""
    names = ["embed", "lm_head"]
    for i in range(cfg["layers"]):
        p = f"layers.{i}."
        names += [p + n for n in ("attn_norm", "mlp_norm", "wq", "wk", "wv", "wo")]
        names += [p + n for n in (("router", "experts.w_gate", "experts.w_up", "experts.w_down")
                                  if i in cfg["moe_layers"] else ("w_gate", "w_up", "w_down"))]
    return names


def ensure_default_checkpoint(path: pathlib.Path = CACHE) -> pathlib.Path:
    """Write the seeded checkpoint once (config.json + model.safetensors)."""
    from safetensors.torch import save_file

    cfg_file = path / "config.json"
    if cfg_file.exists() and json.loads(cfg_file.read_text()) == CONFIG and (path / "model.safetensors").exists():
        return path
    path.mkdir(parents=True, exist_ok=True)
    # per-process temp names + atomic renames: parallel test workers may race here
    tmp = path / f"model.safetensors.tmp{os.getpid()}"
    save_file(generate_weights(CONFIG), str(tmp))
    tmp.replace(path / "model.safetensors")
    tmp_cfg = path / f"config.json.tmp{os.getpid()}"
    tmp_cfg.write_text(json.dumps(CONFIG, indent=2, sort_keys=True) + "\n")
    tmp_cfg.replace(cfg_file)
    return path


# ----------------------------------------------------------------------------- linears


class Bf16Linears:
    """Reference: float32 math on the BF16 weights, results rounded to BF16 like a BF16 model."""

    def __init__(self, tensors):
        self.t = tensors

    def linear(self, x, name, expert=None):
        w = self.t[name] if expert is None else self.t[name][expert]
        return (x.float() @ w.float().t()).to(torch.bfloat16)


class Fp8Linears:
    """FP8: weights quantized online per TP rank; activations per-token-group; a GEMM backend."""

    def __init__(self, tensors, plan, arch, tp=1, backend="triton", device="cpu"):
        self.arch, self.tp, self.backend, self.plan = arch, tp, backend, plan
        self.ranks = [LD.quantize_checkpoint(tensors, plan, arch, tp, r, device) for r in range(tp)]

    def _gemm(self, x, w: LD.Fp8Weight, expert=None):
        a, sa = quantize_activation(x.contiguous(), 128, arch=self.arch)
        q = w.q if expert is None else w.q[expert]
        s = w.scales if expert is None else w.scales[expert]
        if self.backend == "reference":
            return GR.gemm_nt_ref(a, sa, q, s).to(torch.bfloat16).to(x.device)
        return G.fp8_gemm_nt(a, sa, q, s)

    def linear(self, x, name, expert=None):
        split = self.plan[name]
        if split == "row":  # each rank takes its slice of K; partial sums are all-reduced
            k = x.shape[-1] // self.tp
            parts = [self._gemm(x[:, r * k:(r + 1) * k], self.ranks[r][name], expert) for r in range(self.tp)]
            return torch.stack([p.float() for p in parts]).sum(0).to(torch.bfloat16)
        return torch.cat([self._gemm(x, self.ranks[r][name], expert) for r in range(self.tp)], dim=-1)

    def tensor(self, name):
        return self.ranks[0][name]


# ----------------------------------------------------------------------------- forward


def _rms(x, w):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * w.float()).to(torch.bfloat16)


def forward(tokens: list[int], t: dict, lin, cfg: dict) -> torch.Tensor:
    """Logits [len(tokens), vocab] in float32. `t` holds the BF16 (unquantized) tensors."""
    dev = t["embed"].device
    x = t["embed"][torch.tensor(tokens, device=dev)]
    n = x.shape[0]
    mask = torch.full((n, n), float("-inf"), device=dev).triu(1)
    for i in range(cfg["layers"]):
        p = f"layers.{i}."
        h = _rms(x, t[p + "attn_norm"])
        q, k, v = (lin.linear(h, p + nm).float() for nm in ("wq", "wk", "wv"))
        att = torch.softmax(q @ k.t() / math.sqrt(q.shape[-1]) + mask, dim=-1)
        x = (x.float() + lin.linear((att @ v).to(torch.bfloat16), p + "wo").float()).to(torch.bfloat16)
        h = _rms(x, t[p + "mlp_norm"])
        if i in cfg["moe_layers"]:
            x = (x.float() + _moe(h, t, lin, p, cfg).float()).to(torch.bfloat16)
        else:
            act = torch.nn.functional.silu(lin.linear(h, p + "w_gate").float()) * lin.linear(h, p + "w_up").float()
            x = (x.float() + lin.linear(act.to(torch.bfloat16), p + "w_down").float()).to(torch.bfloat16)
    return x.float() @ t["lm_head"].float().t()


def _moe(h, t, lin, p, cfg):
    probs = torch.softmax(h.float() @ t[p + "router"].float().t(), dim=-1)
    weights, ids = probs.topk(cfg["topk"], dim=-1)
    weights = weights / weights.sum(-1, keepdim=True)
    out = torch.zeros(h.shape, dtype=torch.float32, device=h.device)
    for e in range(cfg["experts"]):
        rows, slot = (ids == e).nonzero(as_tuple=True)
        if rows.numel() == 0:
            continue
        he = h[rows]
        act = torch.nn.functional.silu(lin.linear(he, p + "experts.w_gate", e).float()) * lin.linear(
            he, p + "experts.w_up", e).float()
        y = lin.linear(act.to(torch.bfloat16), p + "experts.w_down", e).float()
        out.index_add_(0, rows, y * weights[rows, slot, None])
    return out.to(torch.bfloat16)


class Probe:
    """The BF16 forward, with every linear also run through the FP8 path on the BF16 path's own
    input (teacher forcing): errors[key] is the worst relative L2 of the FP8 output against the
    BF16 output of that linear (key: the weight's name, "name[e]" for expert e). Each linear is
    judged alone, so a broken expert or layer shows in full, however little it moves the logits."""

    def __init__(self, ref, fp8):
        self.ref, self.fp8, self.errors = ref, fp8, {}

    def linear(self, x, name, expert=None):
        y = self.ref.linear(x, name, expert)
        z = self.fp8.linear(x, name, expert)
        err = float((z.double() - y.double()).norm() / y.double().norm().clamp_min(1e-30))
        key = name if expert is None else f"{name}[{expert}]"
        self.errors[key] = max(self.errors.get(key, 0.0), err)
        return y


def linear_errors(tokens: list[int], t: dict, ref, fp8, cfg: dict, plan: dict[str, str]) -> dict[str, float]:
    """Probe's errors over one BF16 forward of `tokens`; a planned linear (or expert) the tokens
    never reached is probed on seeded random rows, so every weight is checked."""
    probe = Probe(ref, fp8)
    forward(tokens, t, probe, cfg)
    g = torch.Generator().manual_seed(cfg["seed"] + 1)
    for name in plan:
        w = t[name]
        for e in (range(w.shape[0]) if w.dim() == 3 else [None]):
            if (name if e is None else f"{name}[{e}]") not in probe.errors:
                x = torch.randn(16, w.shape[-1], generator=g).to(torch.bfloat16).to(w.device)
                probe.linear(x, name, e)
    return probe.errors


def greedy(prompt: list[int], steps: int, t: dict, lin, cfg: dict) -> tuple[list[int], torch.Tensor]:
    """Generated tokens and the logits of each step [steps, vocab]."""
    tokens, logits = list(prompt), []
    for _ in range(steps):
        lg = forward(tokens, t, lin, cfg)[-1]
        logits.append(lg)
        tokens.append(int(lg.argmax()))
    return tokens[len(prompt):], torch.stack(logits)

