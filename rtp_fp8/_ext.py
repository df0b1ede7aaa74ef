"""The compiled CUDA extension (csrc/), when built and importable.

`available()` is False when rtp_fp8._C cannot be imported (not built, CPU-only wheel);
callers then take the Triton path. The reason is kept for logging.
"""

from __future__ import annotations

import functools
import logging

log = logging.getLogger(__name__)


@functools.lru_cache(maxsize=1)
def _load():
    try:
        from rtp_fp8 import _C  # noqa: F401
    except ImportError as exc:
        return None, f"rtp_fp8._C not importable: {exc}"
    import torch

    if not hasattr(torch.ops.rtp_fp8_C, "per_token_group_quant"):
        return None, "rtp_fp8._C lacks per_token_group_quant"
    return torch.ops.rtp_fp8_C, ""


def available() -> bool:
    return _load()[0] is not None


def unavailable_reason() -> str:
    return _load()[1]


def per_token_group_quant(x, q, scales, group_size, scale_layout, pow2, eps):
    ops, why = _load()
    if ops is None:
        raise RuntimeError(why)
    ops.per_token_group_quant(x, q, scales, group_size, scale_layout, pow2, eps)
