"""DeepGEMM, gated: capabilities probed once by introspection, a version gate, explicit
`disable_ue8m0_cast`, a safe mk-alignment context, and version-dependent argument shapes
normalized here for every caller.

    caps = capabilities()            # probed once; caps.available / caps.reason
    fp8_gemm_nt(a, sa, b, sb, out, arch)
    with mk_alignment(64): m_grouped_fp8_gemm_nt_contiguous(a, sa, b, sb, m_indices, out, arch)
    m_grouped_fp8_gemm_nt_masked(a, sa, b, sb, masked_m, expected_m, out, arch)

DeepGEMM is an optional accelerator (not on PyPI): `deep_gemm` >= the minimum in
deps/toolchains.toml [accelerators] (rtp_fp8.accel.MIN_VERSIONS). A missing module, an
older version or a missing function means the backend is not selected; the reason is
logged once. Capabilities come from `hasattr` and the functions' signatures (pybind11
puts them on the first line of `__doc__`), never from calling and catching TypeError.

expected_m: for the contiguous layout, the mk-alignment is the padding of each expert's
row segment and must be a multiple of the kernel's BLOCK_M;
`theoretical_mk_alignment(expected_m, num_groups)` asks DeepGEMM for the smallest one
that suits `expected_m` rows per expert (SM100 shrinks it below 128 for small batches).
For the masked layout, expected_m is only a host-side hint of the typical rows per expert
for the tile heuristic; `masked_m` (on the device) bounds the rows actually computed.

Version-dependent shapes (sources: ../shared/reference/kernels.md 1.2, rtp_llm.md 1):
- paged MQA `context_lens`: 1-D [B] before 2.2.0, 1-D or 2-D [B, next_n] in 2.2.0-2.3.x,
  2-D only from 2.4 (and `clean_logits` must then be False);
- ragged MQA logits KV scale: [N, 1] before 2.5.0, flattened [N] from 2.5.0.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import importlib.util
import inspect
import logging
import re
import threading

import torch

from rtp_fp8 import accel
from rtp_fp8 import arch as A
from rtp_fp8.accel import parse_version

log = logging.getLogger(__name__)
MIN_VERSION = accel.MIN_VERSIONS["deep_gemm"]
REQUIRED = ("fp8_gemm_nt", "m_grouped_fp8_gemm_nt_contiguous", "get_mk_alignment_for_contiguous_layout",
            "set_mk_alignment_for_contiguous_layout", "transform_sf_into_required_layout")
MASKED_NAMES = ("m_grouped_fp8_gemm_nt_masked", "fp8_m_grouped_gemm_nt_masked")  # current, legacy alias
_MK_LOCK = threading.RLock()


def parameters(fn) -> list[str] | None:
    """Parameter names of a Python or pybind11 function, or None when they cannot be read.

    A forwarding signature (only *args/**kwargs) says nothing: the docstring's first line
    (pybind11's signature) is read instead."""
    try:
        params = inspect.signature(fn).parameters.values()
        if any(p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params):
            return [p.name for p in params]
    except (TypeError, ValueError):
        pass
    doc = (getattr(fn, "__doc__", None) or "").lstrip()
    m = re.match(r"[\w.]+\((.*?)\)\s*(->|$)", doc.splitlines()[0] if doc else "")
    if not m:
        return None
    names = []
    depth, cur = 0, ""
    for ch in m.group(1) + ",":
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == "," and depth == 0:
            name = cur.strip().split(":")[0].split("=")[0].strip().lstrip("*")
            if name:
                names.append(name)
            cur = ""
        else:
            cur += ch
    return names


@dataclasses.dataclass(frozen=True)
class Capabilities:
    available: bool
    reason: str = ""  # why not available ('' when it is)
    version: str | None = None
    masked_name: str | None = None  # the masked GEMM's exported name
    theoretical_alignment_args: int = 0  # 2: (expected_m, num_groups); 1: (expected_m); 0: absent
    paged_mqa: bool = False
    mqa_logits: bool = False
    module: object = dataclasses.field(default=None, repr=False, compare=False)


def probe(module) -> Capabilities:
    """What `module` (an imported deep_gemm, or None) offers; no GEMM is called."""
    if module is None:
        return Capabilities(False, "deep_gemm is not installed (optional accelerator, not on PyPI)")
    version = getattr(module, "__version__", None)
    if version is None:
        return Capabilities(False, "deep_gemm has no __version__", module=module)
    try:
        if parse_version(version) < parse_version(MIN_VERSION):
            return Capabilities(False, f"deep_gemm {version} is older than the minimum {MIN_VERSION} "
                                       "(deps/toolchains.toml [accelerators.deep_gemm])", version, module=module)
    except ValueError as exc:
        return Capabilities(False, f"deep_gemm version: {exc}", version, module=module)
    missing = [n for n in REQUIRED if not callable(getattr(module, n, None))]
    masked = next((n for n in MASKED_NAMES if callable(getattr(module, n, None))), None)
    if masked is None:
        missing.append(MASKED_NAMES[0])
    if missing:
        return Capabilities(False, f"deep_gemm {version} lacks {', '.join(missing)}", version, module=module)
    for name in ("fp8_gemm_nt", "m_grouped_fp8_gemm_nt_contiguous", masked):
        params = parameters(getattr(module, name))
        if params is not None and "disable_ue8m0_cast" not in params:
            return Capabilities(False, f"deep_gemm {version}: {name} has no disable_ue8m0_cast parameter", version,
                                module=module)
    theo = getattr(module, "get_theoretical_mk_alignment_for_contiguous_layout", None)
    theo_args = 0
    if callable(theo):
        params = parameters(theo)
        theo_args = 2 if params is not None and len(params) >= 2 else 1
    paged = all(callable(getattr(module, n, None)) for n in ("get_paged_mqa_logits_metadata", "fp8_paged_mqa_logits"))
    return Capabilities(True, "", version, masked, theo_args, paged, callable(getattr(module, "fp8_mqa_logits", None)),
                        module=module)


def _import():
    if importlib.util.find_spec("deep_gemm") is None:
        return None
    return importlib.import_module("deep_gemm")


@functools.lru_cache(maxsize=1)
def capabilities() -> Capabilities:
    """Probed once per process; an unavailable backend's reason is logged once."""
    try:
        caps = probe(_import())
    except ImportError as exc:  # installed but broken (e.g. built for another torch/CUDA)
        caps = Capabilities(False, f"deep_gemm failed to import: {exc}")
    if not caps.available:
        log.info("rtp_fp8: DeepGEMM backend not selected: %s", caps.reason)
    return caps


def device_reason(arch: A.Arch, device) -> str:
    """'' when DeepGEMM's kernels for `arch` can run on `device`, else why not (naming both).

    DeepGEMM compiles its kernels for the Arch's family (SM90: FP32 scales, SM100: packed UE8M0)
    and asserts in C++ when they meet another GPU: Arch(10, 0) operands on an SM90 device must
    never reach it. Triton kernels have no such limit (they run any Arch's format anywhere)."""
    device = torch.device(device)
    if device.type != "cuda":
        return f"DeepGEMM runs on CUDA tensors, got a {device.type} tensor"
    dev = A.detect(device)
    if dev.major != arch.major:
        return (f"DeepGEMM's {arch} kernels cannot run on this GPU ({dev}): arch={arch} needs a {arch.family} "
                f"device; pass arch={dev} or another backend")
    return ""


def supports(arch: A.Arch, caps: Capabilities | None = None, device=None) -> tuple[bool, str]:
    """Whether DeepGEMM can serve `arch` here (on `device`, when given), and why not."""
    caps = capabilities() if caps is None else caps
    if not caps.available:
        return False, caps.reason
    if "deepgemm" not in arch.gemm_backends:
        return False, f"DeepGEMM mainline has no kernels for {arch}"
    why = "" if device is None else device_reason(arch, device)
    return not why, why


def _dg(caps: Capabilities | None):
    caps = capabilities() if caps is None else caps
    if not caps.available:
        raise RuntimeError(f"DeepGEMM backend unavailable: {caps.reason}")
    return caps.module, caps


@contextlib.contextmanager
def pdl_launches(caps: Capabilities | None = None):
    """DeepGEMM's kernels launched as programmatic dependents of the stream's previous kernel within the
    block (deep_gemm.set_pdl(True); off by default in 2.6.1), its setting restored after; a RuntimeError
    where this DeepGEMM has no set_pdl. For timing it as it is best launched beside ours."""
    dg, _ = _dg(caps)
    if not (hasattr(dg, "set_pdl") and hasattr(dg, "get_pdl")):
        raise RuntimeError("this DeepGEMM has no set_pdl")
    before = dg.get_pdl()
    dg.set_pdl(True)
    try:
        yield
    finally:
        dg.set_pdl(before)


def disable_ue8m0_cast(arch: A.Arch) -> bool:
    """DeepGEMM's flag from the Arch's scale format: FP32 scales must not be cast to UE8M0."""
    return arch.scale_format != "ue8m0"


# ----------------------------------------------------------------------------- mk-alignment


@contextlib.contextmanager
def mk_alignment(value: int, caps: Capabilities | None = None):
    """Set DeepGEMM's contiguous-layout mk-alignment for the body, then restore it.

    Process-wide lock (held for the body: concurrent callers serialize, so no thread runs a
    GEMM under another's alignment); the value is read back after the set and a mismatch
    fails fast; the original is restored in `finally`, also when the set or the body raises.
    """
    if not isinstance(value, int) or value < 1:
        raise ValueError(f"value must be a positive int mk-alignment, got {value!r}")
    dg, _ = _dg(caps)
    with _MK_LOCK:
        original = dg.get_mk_alignment_for_contiguous_layout()
        try:
            dg.set_mk_alignment_for_contiguous_layout(value)
            got = dg.get_mk_alignment_for_contiguous_layout()
            if got != value:
                raise RuntimeError(f"DeepGEMM mk-alignment read back {got} after setting {value}")
            yield value
        finally:
            dg.set_mk_alignment_for_contiguous_layout(original)


def theoretical_mk_alignment(expected_m: int, num_groups: int, caps: Capabilities | None = None) -> int:
    """DeepGEMM's smallest mk-alignment for `expected_m` rows spread over `num_groups` experts."""
    dg, caps = _dg(caps)
    if caps.theoretical_alignment_args == 0:  # no heuristic exported: the current alignment
        return int(dg.get_mk_alignment_for_contiguous_layout())
    fn = dg.get_theoretical_mk_alignment_for_contiguous_layout
    if caps.theoretical_alignment_args == 2:
        return int(fn(expected_m, num_groups))
    return int(fn(-(-expected_m // max(num_groups, 1))))  # older form: rows per group


# ----------------------------------------------------------------------------- GEMMs


def fp8_gemm_nt(a, sa, b, sb, out, arch: A.Arch, caps: Capabilities | None = None):
    dg, _ = _dg(caps)
    dg.fp8_gemm_nt((a, sa), (b, sb), out, disable_ue8m0_cast=disable_ue8m0_cast(arch))
    return out


def m_grouped_fp8_gemm_nt_contiguous(a, sa, b, sb, m_indices, out, arch: A.Arch, caps: Capabilities | None = None):
    """Rows grouped by expert (m_indices, -1 = padding), segments padded to the current mk-alignment."""
    dg, _ = _dg(caps)
    # positional: the 4th parameter was renamed m_indices -> grouped_layout in 2.2
    dg.m_grouped_fp8_gemm_nt_contiguous((a, sa), (b, sb), out, m_indices,
                                        disable_ue8m0_cast=disable_ue8m0_cast(arch))
    return out


def m_grouped_fp8_gemm_nt_masked(a, sa, b, sb, masked_m, expected_m: int, out, arch: A.Arch,
                                 caps: Capabilities | None = None):
    dg, caps = _dg(caps)
    getattr(dg, caps.masked_name)((a, sa), (b, sb), out, masked_m, int(expected_m),
                                  disable_ue8m0_cast=disable_ue8m0_cast(arch))
    return out


def transform_sf(sf, mn: int, k: int, recipe: tuple[int, ...], arch: A.Arch, num_groups: int | None = None,
                 is_sfa: bool | None = None, caps: Capabilities | None = None):
    """Our scales -> the layout DeepGEMM's kernels consume (transform_sf_into_required_layout)."""
    dg, _ = _dg(caps)
    return dg.transform_sf_into_required_layout(sf, mn, k, recipe, num_groups=num_groups, is_sfa=is_sfa,
                                                disable_ue8m0_cast=disable_ue8m0_cast(arch))


# ----------------------------------------------------------------------------- MQA logits


def context_lens_for(context_lens: torch.Tensor, next_n: int, version: str) -> torch.Tensor:
    """Paged-MQA context lengths in the shape this DeepGEMM version takes (1-D [B] or 2-D [B, next_n])."""
    if context_lens.dtype != torch.int32 or context_lens.dim() not in (1, 2):
        raise ValueError(f"context_lens must be int32 [B] or [B, next_n], got {context_lens.dtype} "
                         f"{tuple(context_lens.shape)}")
    if context_lens.dim() == 2 and context_lens.shape[1] != next_n:
        raise ValueError(f"context_lens must be [B, next_n={next_n}], got {tuple(context_lens.shape)}")
    if parse_version(version) < (2, 2):
        if next_n != 1 and context_lens.dim() == 2:
            raise ValueError(f"deep_gemm {version} takes 1-D context_lens only (next_n == 1)")
        return context_lens.reshape(-1).contiguous()
    if context_lens.dim() == 1:  # one length per sequence, shared by its next_n query positions
        context_lens = context_lens[:, None].expand(-1, next_n)
    return context_lens.contiguous()


def kv_scale_for(kv_scale: torch.Tensor, version: str) -> torch.Tensor:
    """Ragged-MQA KV scale in the shape this version takes: [N, 1] before 2.5.0, [N] from 2.5.0."""
    if kv_scale.dim() == 2 and kv_scale.shape[1] != 1 or kv_scale.dim() not in (1, 2):
        raise ValueError(f"kv_scale must be [N] or [N, 1], got {tuple(kv_scale.shape)}")
    flat = kv_scale.reshape(-1).contiguous()
    return flat if parse_version(version) >= (2, 5) else flat[:, None]


def paged_mqa_logits_metadata(context_lens, next_n: int, block_kv: int, num_sms: int,
                              caps: Capabilities | None = None):
    dg, caps = _dg(caps)
    if not caps.paged_mqa:
        raise RuntimeError(f"deep_gemm {caps.version} has no paged MQA logits")
    return dg.get_paged_mqa_logits_metadata(context_lens_for(context_lens, next_n, caps.version), block_kv, num_sms)


def fp8_paged_mqa_logits(q, kv_cache, weights, context_lens, block_table, schedule_meta, max_context_len: int,
                         caps: Capabilities | None = None):
    """q [B, next_n, H, D]; clean_logits False (2-D context_lens reject it from 2.4)."""
    dg, caps = _dg(caps)
    if not caps.paged_mqa:
        raise RuntimeError(f"deep_gemm {caps.version} has no paged MQA logits")
    lens = context_lens_for(context_lens, q.shape[1], caps.version)
    return dg.fp8_paged_mqa_logits(q, kv_cache, weights, lens, block_table, schedule_meta, max_context_len,
                                   clean_logits=False)


def fp8_mqa_logits(q, kv, kv_scale, weights, ks, ke, caps: Capabilities | None = None):
    dg, caps = _dg(caps)
    if not caps.mqa_logits:
        raise RuntimeError(f"deep_gemm {caps.version} has no fp8_mqa_logits")
    return dg.fp8_mqa_logits(q, (kv, kv_scale_for(kv_scale, caps.version)), weights, ks, ke)
