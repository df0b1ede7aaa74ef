"""The FP8 GEMM backends behind one interface, and the choice among them.

    be = backends.get("triton" | "deepgemm" | "reference", arch)
    be.gemm_nt(a, sa, b, sb, out)
    be.grouped_contiguous(a, sa, b, sb, m_indices, out, alignment)
    be.grouped_masked(a, sa, b, sb, masked_m, expected_m, out)
    name, reason = backends.select(arch, n, k)          # RTP_FP8_GEMM_BACKEND / override win

Operands are in the Arch's formats (rtp_fp8.quant): A float8_e4m3fn [M, K] with 1x128
scales (FP32 MN-major TMA-aligned on SM90, packed UE8M0 on SM100/SM120), B [N, K] with
128x128 FP32 block scales or packed per-row UE8M0. `select` walks the Arch's preference
order (`Arch.gemm_backends`): DeepGEMM when it is importable, new enough, has the
functions, serves the arch and the shape (N % 64 == 0, K % 128 == 0) and, given a device,
that GPU runs the arch's kernels (DeepGEMM's SM100 kernels assert on an SM90 GPU); else
Triton, which on CPU tensors needs the interpreter (else the reference). The choice and every
bypassed backend's reason are logged once.

The grouped contract every backend meets (and all that callers may rely on):
- contiguous: rows of expert e = m_indices[r] hold A[r] @ B[e]^T; -1 (padding) rows are
  unspecified (DeepGEMM leaves them as the buffer held them; Triton writes zeros and counts
  them).
- masked: out[e, :masked_m[e]] holds the product; rows past masked_m[e] are unspecified
  (DeepGEMM writes whole row tiles past it: masked_m 17 wrote 64 rows; Triton leaves them).
The executors never read unspecified rows (tests/moe/test_executors.py poisons them).
"""

from __future__ import annotations

import dataclasses
import logging
import os

import torch

from rtp_fp8 import arch as A
from rtp_fp8 import triton_env
from rtp_fp8._logging import log_once
from rtp_fp8.gemm import deepgemm as D
from rtp_fp8.gemm import reference as R
from rtp_fp8.gemm.triton import block_scaled as G
from rtp_fp8.quant import layout as L

log = logging.getLogger(__name__)
BACKEND_ENV = "RTP_FP8_GEMM_BACKEND"
NAMES = ("deepgemm", "triton", "reference")
_logged: set[str] = set()


def _log_once(msg: str) -> None:
    log_once(log, _logged, msg, "rtp_fp8.gemm: %s", msg)


@dataclasses.dataclass(frozen=True)
class Backend:
    """Every backend validates its arguments the same way (the Triton checks, ValueError naming the
    argument) before it launches anything; DeepGEMM additionally needs the Arch's scale format."""

    name: str
    arch: A.Arch

    def gemm_nt(self, a, sa, b, sb, out=None):
        if self.name == "triton":
            _triton_device(a)
            return G.fp8_gemm_nt(a, sa, b, sb, out=out)
        out, _, _, sb_div = G.check_dense(a, sa, b, sb, out)
        if self.name == "reference":
            return _ref_into(out, R.gemm_nt_ref(a, sa, b, sb))
        _deepgemm_operands(self.arch, a, sa, sb, sb_div, (), (), a.shape[0], b.shape[0], a.shape[1])
        return D.fp8_gemm_nt(a, sa, b, sb, out, self.arch)

    def grouped_contiguous(self, a, sa, b, sb, m_indices, out=None, alignment=128, counters=None):
        if self.name == "triton":
            _triton_device(a)
            return G.m_grouped_fp8_gemm_nt_contiguous(a, sa, b, sb, m_indices, out=out, counters=counters,
                                                      alignment=alignment)
        # counters (padding rows, invalid ids) are counted by the Triton kernel only: validated, left unchanged here
        out, _, _, _, sb_div = G.check_contiguous(a, sa, b, sb, m_indices, out, counters, alignment)
        if self.name == "reference":
            return _ref_into(out, R.grouped_contiguous_ref(a, sa, b, sb, m_indices))
        _deepgemm_operands(self.arch, a, sa, sb, sb_div, (), (b.shape[0],), a.shape[0], b.shape[1], a.shape[1])
        with D.mk_alignment(alignment):
            return D.m_grouped_fp8_gemm_nt_contiguous(a, sa, b, sb, m_indices, out, self.arch)

    def grouped_masked(self, a, sa, b, sb, masked_m, expected_m=None, out=None):
        if self.name == "triton":
            _triton_device(a)
            return G.m_grouped_fp8_gemm_nt_masked(a, sa, b, sb, masked_m, expected_m=expected_m, out=out)
        out, _, _, sb_div = G.check_masked(a, sa, b, sb, masked_m, out)
        G.check_expected_m(expected_m)
        if self.name == "reference":
            return _ref_into(out, R.grouped_masked_ref(a, sa, b, sb, masked_m), masked_m)
        e, mmax, k = a.shape
        _deepgemm_operands(self.arch, a, sa, sb, sb_div, (e,), (e,), mmax, b.shape[1], k)
        return D.m_grouped_fp8_gemm_nt_masked(a, sa, b, sb, masked_m, expected_m or mmax, out, self.arch)


def _triton_device(a) -> None:
    """ValueError unless Triton can read a: CUDA tensors, CPU ones only under the interpreter."""
    if isinstance(a, torch.Tensor) and not triton_env.runs_on(a.device):
        raise ValueError(f"a is on {a.device}: the triton backend needs CUDA tensors, or TRITON_INTERPRET=1 "
                         "(set before import) for CPU ones; the reference backend runs on the CPU")


def _deepgemm_operands(arch, a, sa, sb, sb_div, lead_a, lead_b, rows, n, k):
    """The shapes and scales DeepGEMM consumes for arch, or ValueError naming the argument.

    SM90: FP32, A column-major TMA-aligned ("col_tma"; another layout would be transposed on every
    call), B per 128x128 block and contiguous. SM100: packed UE8M0 ("ue8m0" layout) for both; FP32
    scales given there would be truncated to their exponent without requantizing the FP8 values,
    a silently wrong product, so they are refused. Per-row FP32 B scales are a Triton-only format.
    """
    if n % 64 or k % 128:
        raise ValueError(f"b must have N % 64 == 0 and K % 128 == 0 for DeepGEMM, got N={n}, K={k}")
    groups = L.cdiv(k, G.GRAN)
    if arch.scale_format == "ue8m0":
        for name, s in (("sa", sa), ("sb", sb)):
            if s.dtype != torch.int32:
                raise ValueError(f"{name} must be packed UE8M0 int32 for DeepGEMM on {arch} (its FP32 scales are "
                                 f"truncated to UE8M0 without requantizing the FP8 values), got {s.dtype}")
        L.check_scales(sa, lead_a, rows, groups, "ue8m0", name="sa")
        L.check_scales(sb, lead_b, n, groups, "ue8m0", name="sb")
        return _deepgemm_device(arch, a)
    for name, s in (("sa", sa), ("sb", sb)):
        if s.dtype != torch.float32:
            raise ValueError(f"{name} must be float32 scales for DeepGEMM on {arch} ({arch.scale_format} format), "
                             f"got {s.dtype}")
    L.check_scales(sa, lead_a, rows, groups, "col_tma", name="sa")
    if sb_div != G.GRAN:
        raise ValueError(f"sb must be 128x128 block scales {(*lead_b, L.cdiv(n, G.GRAN), groups)} for DeepGEMM on "
                         f"{arch} (per-row FP32 B scales are Triton-only), got {tuple(sb.shape)}")
    if not sb.is_contiguous():
        raise ValueError(f"sb must be contiguous for DeepGEMM on {arch}, got strides {sb.stride()}")
    _deepgemm_device(arch, a)


def _deepgemm_device(arch, a):
    """Last of the DeepGEMM checks: the tensors' GPU runs the Arch's kernels (else DeepGEMM asserts in C++)."""
    why = D.device_reason(arch, a.device)
    if why:
        raise ValueError(f"a: {why}")


def _ref_into(out, ref, masked_m=None):
    ref = ref.to(out.device if out is not None else ref.device)
    if out is None:
        return ref
    if masked_m is None:
        return out.copy_(ref)
    for e, mm in enumerate(masked_m.tolist()):  # rows past masked_m: unspecified, left as they were
        out[e, :mm].copy_(ref[e, :mm])
    return out


def unavailable_reason(name: str, arch: A.Arch, n: int | None = None, k: int | None = None, device=None) -> str:
    """'' when backend `name` can run for arch (and shape, and tensors on `device` when given), else why not."""
    if name not in NAMES:
        raise ValueError(f"backend must be one of {NAMES}, got {name!r}")
    if name == "triton" and device is not None and not triton_env.runs_on(torch.device(device)):
        return f"Triton kernels need CUDA tensors, or TRITON_INTERPRET=1 for {torch.device(device).type} ones"
    if name != "deepgemm":
        return ""
    ok, why = D.supports(arch, device=device)
    if not ok:
        return why
    if (n is not None and n % 64) or (k is not None and k % 128):
        return f"DeepGEMM needs N % 64 == 0 and K % 128 == 0, got N={n}, K={k}"
    return ""


def select(arch: A.Arch, n: int | None = None, k: int | None = None, override: str | None = None,
           device=None) -> tuple[str, str]:
    """(backend, reason) for arch and shape (and tensors on `device`, when given: DeepGEMM only where that
    GPU runs the Arch's kernels, Triton on the CPU only under the interpreter); an explicit override
    (argument or RTP_FP8_GEMM_BACKEND) wins and must be runnable."""
    forced = override or os.environ.get(BACKEND_ENV) or None
    if forced not in (None, "auto"):
        if forced not in NAMES:
            raise ValueError(f"backend ({BACKEND_ENV}) must be one of {NAMES + ('auto',)}, got {forced!r}")
        why = unavailable_reason(forced, arch, n, k, device)
        if why:
            raise ValueError(f"backend {forced!r} was forced ({'override' if override else BACKEND_ENV}) but cannot "
                             f"run: {why}")
        _log_once(f"{arch}: {forced} forced by {'override' if override else BACKEND_ENV}")
        return forced, "forced"
    if arch.is_cuda and "deepgemm" not in arch.gemm_backends:
        _log_once(f"{arch}: deepgemm bypassed: {D.supports(arch)[1]}")
    where = "" if device is None else f" on {torch.device(device).type}"
    for name in arch.gemm_backends:
        why = unavailable_reason(name, arch, n, k, device)
        if not why:
            _log_once(f"{arch}: {name} GEMM backend{where}")
            return name, "preferred for " + str(arch)
        _log_once(f"{arch}: {name} bypassed{where}: {why}")
    return "reference", "no kernel backend"


def get(name: str, arch: A.Arch, device=None) -> Backend:
    why = unavailable_reason(name, arch, device=device)
    if why:
        raise ValueError(f"backend {name!r} cannot run on {arch}: {why}")
    return Backend(name, arch)
