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


def has(op: str) -> bool:
    """Whether the loaded extension registers `op` (a _C.so built before the op was added does not)."""
    ops = _load()[0]
    return ops is not None and hasattr(ops, op)


def _ops():
    """torch.ops.rtp_fp8_C, or RuntimeError saying why the extension is unavailable."""
    ops, why = _load()
    if ops is None:
        raise RuntimeError(why)
    return ops


def per_token_group_quant(x, q, scales, group_size, scale_layout, pow2, eps):
    _ops().per_token_group_quant(x, q, scales, group_size, scale_layout, pow2, eps)


def fp8_gemm_sm90(a, sa, b, sb, out, group_m=8, clusters=0, multicast=True):
    """out = the block-scaled FP8 GEMM of a [M, K] and b [N, K] (csrc/fp8_gemm_sm90.cu: SM90, 2-CTA
    clusters multicasting B); sa col_tma [M, K/128], sb [N/128, K/128] FP32. Bit-identical to the
    Triton kernel. clusters: at most this many 2-CTA clusters (0: as many as fit at once).
    multicast=False: each CTA loads its whole B tile and keeps its ring to itself (the same bits; for
    measuring what the multicast buys). Raises RuntimeError naming the argument on bad input, or when
    the extension is absent."""
    _ops().fp8_gemm_sm90(a, sa, b, sb, out, group_m, clusters, bool(multicast))


def fp8_gemm_sm90_clusters(k):
    """How many of fp8_gemm_sm90's 2-CTA clusters fit on the current GPU at once for this K."""
    return _ops().fp8_gemm_sm90_clusters(k)


def fp8_gemm_sm90_contiguous(a, sa, b, sb, ids, out, counters, group_m=8, clusters=0, multicast=True):
    """fp8_gemm_sm90, m-grouped contiguous: b [E, N, K], sb [E, N/128, K/128], ids [M] int32 (-1
    padding), 128-row segments per expert; rows not of their tile's expert are stored as zeros and
    counted into counters [2] (-1 rows, other rows), as the Triton kernels do."""
    _ops().fp8_gemm_sm90_contiguous(a, sa, b, sb, ids, out, counters, group_m, clusters, bool(multicast))


def fp8_gemm_sm90_narrow(a, sa, b, sb, out, block_n=64, stages=0, multicast=False, pdl=0):
    """fp8_gemm_sm90 for few rows (csrc/fp8_gemm_sm90.cu's narrow kernel: 64 x block_n tiles, block_n
    32, 56, 64, 112 or 128, one consumer warpgroup, a ring of `stages` slots, 0: as many as fit, see
    fp8_gemm_sm90_narrow_stages). multicast: 2-CTA clusters on neighbouring column tiles share A's
    loads. pdl 1: launched as a programmatic dependent of the stream's kernel before (it reads and
    writes global memory only once that kernel has completed); 2: also lets the stream's next
    programmatic dependent launch once its last load is issued. Dense only; bit-identical to the
    Triton kernel."""
    _ops().fp8_gemm_sm90_narrow(a, sa, b, sb, out, block_n, stages, bool(multicast), int(pdl))


def fp8_gemm_sm90_narrow_stages(block_n):
    """The ring slots fp8_gemm_sm90_narrow takes with stages=0 for this block_n."""
    return _ops().fp8_gemm_sm90_narrow_stages(block_n)
