"""Load a BF16 safetensors checkpoint and quantize its linear weights to FP8 per block.

Scale format by Arch: SM90/CPU -> FP32 128x128 block scales; SM100/SM120 -> power-of-two
scales broadcast to rows and packed UE8M0, packed *after* the tensor-parallel split (a
rank boundary can fall inside an int32 word, and packing first cut scales wrongly in the
system this project learns from). 2-D weights on UE8M0 arches take the direct path
(power-of-two scales straight from BF16); stacked 3-D MoE weights take the legacy path
(FP32 block quant, then requantize to powers of two), logged once, as does any weight
quantized with a block other than 128.

A weight plan names, for each tensor, how it is split: "column" (rows N, column-parallel),
"row" (columns K, row-parallel), "fp8" (quantized, whole on every rank) or "replicate" (kept
in its checkpoint precision, whole on every rank: norms, embeddings, routers; any rank, 1-D
included). Tensors the plan does not name are kept as they are. Shapes whose TP part is not a
multiple of 128 are rejected with the tensor's name; tp must be >= 1 and 0 <= rank < tp.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import pathlib

import torch

from rtp_fp8 import arch as A
from rtp_fp8._logging import log_once
from rtp_fp8.quant import block as B
from rtp_fp8.quant import tp as TP

log = logging.getLogger(__name__)
_logged: set[str] = set()


def _log_once(key: str, msg: str, *args) -> None:
    log_once(log, _logged, key, msg, *args)


@dataclasses.dataclass
class Fp8Weight:
    """An FP8 weight [*, N, K] with its scales in the arch's format."""

    q: torch.Tensor
    scales: torch.Tensor  # FP32 block [*, ceil(N/128), ceil(K/128)] or packed int32 per-row
    scale_format: str  # "fp32" | "ue8m0"
    path: str  # "fp32", "direct_ue8m0", "legacy_ue8m0"


def load_safetensors(model_dir: str | pathlib.Path) -> tuple[dict, dict[str, torch.Tensor]]:
    """config.json and every *.safetensors tensor of a checkpoint folder."""
    from safetensors.torch import load_file

    d = pathlib.Path(model_dir)
    cfg_path = d / "config.json"
    if not cfg_path.exists():
        raise FileNotFoundError(f"model_dir {d}: config.json not found")
    files = sorted(d.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"model_dir {d}: no *.safetensors file")
    try:
        cfg = json.loads(cfg_path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{cfg_path}: not valid JSON ({exc})") from None
    if not isinstance(cfg, dict):
        raise ValueError(f"{cfg_path}: expected a JSON object, got {type(cfg).__name__}")
    tensors: dict[str, torch.Tensor] = {}
    for f in files:
        try:
            part = load_file(str(f))
        except Exception as exc:  # safetensors raises its own error types for truncated/corrupt files
            raise ValueError(f"{f}: not a readable safetensors file ({type(exc).__name__}: {exc})") from None
        for k, v in part.items():
            if k in tensors:
                raise ValueError(f"tensor {k!r} appears in more than one file of {d}")
            tensors[k] = v
    return cfg, tensors


def check_tp(tp, rank) -> None:
    for what, v in (("tp", tp), ("rank", rank)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise ValueError(f"{what} must be an int, got {v!r}")
    if tp < 1 or not 0 <= rank < tp:
        raise ValueError(f"tp must be >= 1 and rank in [0, tp), got tp={tp}, rank={rank}")


def quantize_weight(name: str, w: torch.Tensor, arch: A.Arch, split: str = "fp8", tp: int = 1,
                    rank: int = 0, block: int = 128) -> Fp8Weight:
    """One BF16 weight -> this rank's FP8 part in `arch`'s scale format ("fp8": the whole weight)."""
    if split == "replicate":
        raise ValueError(f"{name}: split 'replicate' keeps a tensor in its own precision (quantize_checkpoint "
                         "does); quantize_weight takes 'column', 'row' or 'fp8' (whole)")
    if split not in ("column", "row", "fp8"):
        raise ValueError(f"{name}: split must be 'column', 'row' or 'fp8', got {split!r}")
    check_tp(tp, rank)
    if not isinstance(w, torch.Tensor):
        raise ValueError(f"{name}: expected a tensor, got {type(w).__name__}")
    if w.dim() not in (2, 3):
        raise ValueError(f"{name}: expected a 2-D weight or 3-D stacked experts, got shape {tuple(w.shape)}")
    ue8m0 = arch.scale_format == "ue8m0"
    direct = ue8m0 and arch.direct_ue8m0_weights and w.dim() == 2 and block == 128
    if ue8m0 and not direct:
        _log_once(f"legacy:{w.dim()}:{block}", "rtp_fp8 loader: %s uses the legacy UE8M0 path "
                  "(FP32 block quant then power-of-two requant): %s", name,
                  "3-D expert weights" if w.dim() == 3 else f"block {block} != 128")
    q, s = B.quantize_weight_blocks(w, block, pow2=direct, chunk_rows=1024 if 1024 % block == 0 else None)
    if ue8m0 and not direct:
        q, s = B.requant_ue8m0(q, s, block)
    if split != "fp8" and tp > 1:
        dim = "n" if split == "column" else "k"
        try:
            q, s = TP.split_weight(q, s, tp, rank, dim, block)
        except ValueError as exc:
            raise ValueError(f"{name}: {exc}") from None
    if ue8m0:
        s = B.pack_weight_scales_per_row(s, q.shape[-2], block)  # pack after the split
        return Fp8Weight(q, s, "ue8m0", "direct_ue8m0" if direct else "legacy_ue8m0")
    return Fp8Weight(q, s, "fp32", "fp32")


def quantize_checkpoint(tensors: dict[str, torch.Tensor], plan: dict[str, str], arch: A.Arch | None = None,
                        tp: int = 1, rank: int = 0, device: str | torch.device = "cpu"):
    """-> {name: Fp8Weight for planned linears (column, row, fp8), the tensor itself, in its own
    precision, for "replicate" and unplanned ones}."""
    arch = A.resolve(arch)
    check_tp(tp, rank)
    bad = {n: v for n, v in plan.items() if v not in ("column", "row", "fp8", "replicate")}
    if bad:
        raise ValueError(f"plan: splits must be 'column', 'row', 'fp8' or 'replicate', got {bad}")
    out = {}
    for name, t in tensors.items():
        split = plan.get(name)
        if split in (None, "replicate"):
            out[name] = t.to(device)
            continue
        if t.dtype not in (torch.bfloat16, torch.float16, torch.float32):
            raise TypeError(f"{name}: expected a BF16/FP16/FP32 weight to quantize, got {t.dtype}")
        out[name] = quantize_weight(name, t.to(device), arch, split, tp, rank)
    missing = sorted(set(plan) - set(tensors))
    if missing:
        raise KeyError(f"weights named by the plan are missing from the checkpoint: {missing}")
    return out
