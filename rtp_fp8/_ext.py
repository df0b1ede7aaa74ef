"""The compiled CUDA extension (csrc/): rtp_fp8/_C.so (tools/build_ext.py, or installed by a
wheel), else Bazel's csrc/_C.so beside the package in the runfiles (//csrc:_C.so).

`available()` is False when the library is absent (not built, CPU-only wheel) or fails
to load against this torch; callers then take the Triton path, and the reason is logged
once. Ops live in the `rtp_fp8_C` namespace (torch.ops.rtp_fp8_C.*).
"""

from __future__ import annotations

import functools
import logging
import pathlib

log = logging.getLogger(__name__)
_HERE = pathlib.Path(__file__).parent
CANDIDATES = (_HERE / "_C.so", _HERE.parent / "csrc" / "_C.so")


@functools.lru_cache(maxsize=1)
def _load():
    import torch

    found = [p for p in CANDIDATES if p.exists()]
    if not found:
        return None, "_C.so not built (python3 tools/build_ext.py)"
    library = found[0]
    try:
        torch.ops.load_library(str(library))
    except (OSError, RuntimeError) as exc:
        reason = f"{library} failed to load: {exc}"
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
