"""The compiled CUDA extension (csrc/, built by tools/build_ext.py into rtp_fp8/_C.so).

`available()` is False when the library is absent (not built, CPU-only wheel) or fails
to load against this torch; callers then take the Triton path, and the reason is logged
once. Ops live in the `rtp_fp8_C` namespace (torch.ops.rtp_fp8_C.*).
"""

from __future__ import annotations

import functools
import logging
import pathlib

log = logging.getLogger(__name__)
LIBRARY = pathlib.Path(__file__).with_name("_C.so")


@functools.lru_cache(maxsize=1)
def _load():
    import torch

    if not LIBRARY.exists():
        return None, f"{LIBRARY.name} not built (python3 tools/build_ext.py)"
    try:
        torch.ops.load_library(str(LIBRARY))
    except (OSError, RuntimeError) as exc:
        reason = f"{LIBRARY.name} failed to load: {exc}"
        log.warning("rtp_fp8: CUDA extension unavailable, using Triton: %s", reason)
        return None, reason
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
