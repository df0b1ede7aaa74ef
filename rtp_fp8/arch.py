"""The Arch value: which GPU architecture code runs for, and what follows from it.

Arch is a value, not a global: every function whose behaviour depends on the GPU takes
`arch=` (default: `detect()`), so tests pass Arch(9, 0), Arch(10, 0) or Arch(12, 0)
explicitly and every SM-specific branch runs on any machine. This is the only module
that reads the device capability.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Literal

import torch

ScaleFormat = Literal["fp32", "ue8m0"]


@dataclasses.dataclass(frozen=True)
class Arch:
    major: int
    minor: int = 0

    def __post_init__(self):
        if not (isinstance(self.major, int) and isinstance(self.minor, int)) or self.major < 0 or self.minor < 0:
            raise ValueError(f"Arch: major/minor must be non-negative ints, got {self.major!r}, {self.minor!r}")

    @property
    def is_cuda(self) -> bool:
        return self.major > 0

    @property
    def sm(self) -> int:
        return self.major * 10 + self.minor

    @property
    def name(self) -> str:
        return f"sm{self.sm}" if self.is_cuda else "cpu"

    @property
    def family(self) -> str:
        """'sm90', 'sm100' or 'sm120' (the suites and goldens are keyed on this), else name."""
        return {9: "sm90", 10: "sm100", 12: "sm120"}.get(self.major, self.name)

    @property
    def scale_format(self) -> ScaleFormat:
        """Blackwell GEMMs consume packed UE8M0 scales; Hopper (and CPU) FP32 scales."""
        return "ue8m0" if self.major in (10, 12) else "fp32"

    @property
    def direct_ue8m0_weights(self) -> bool:
        """Quantize BF16 weights straight to power-of-two scales (no FP32 detour).

        Allowed exactly where the scale format is UE8M0; both Blackwell branches are
        exercised by tests with explicit Arch(10, 0) and Arch(12, 0).
        """
        return self.scale_format == "ue8m0"

    @property
    def smem_per_block(self) -> int:
        """Bytes of shared memory one block may opt in to (CUDA's table per compute capability):
        227 KiB on SM90 and SM100, 163 KiB on SM80 / SM87, 99 KiB on SM86 / SM89 and SM120
        (consumer Blackwell); 0 on CPU. Kernels size their pipelines from it."""
        if not self.is_cuda:
            return 0
        if self.major == 12 or self.sm in (86, 89):
            return 99 * 1024
        if self.sm in (80, 87):
            return 163 * 1024
        return 227 * 1024 if self.major >= 9 else 48 * 1024

    @property
    def gemm_backends(self) -> tuple[str, ...]:
        """GEMM backends allowed on this arch, in order of preference.

        DeepGEMM mainline has SM90 and SM100 kernels (SM120 lives on an unmerged branch);
        our Triton kernels run everywhere, CPU included (interpreter); 'reference' is the
        plain-torch oracle.
        """
        if self.major in (9, 10):
            return ("deepgemm", "triton", "reference")
        if self.is_cuda:
            return ("triton", "reference")
        return ("triton", "reference")

    def __str__(self) -> str:
        return self.name


CPU = Arch(0, 0)


@functools.cache
def _detect(index: int) -> Arch:
    major, minor = torch.cuda.get_device_capability(index)
    return Arch(major, minor)


def detect(device: torch.device | str | int | None = None) -> Arch:
    """Arch of `device` (default: the current CUDA device, or CPU), cached per device."""
    if device is None:
        if not torch.cuda.is_available():
            return CPU
        return _detect(torch.cuda.current_device())
    if isinstance(device, int):
        return _detect(device)
    dev = torch.device(device)
    if dev.type != "cuda":
        return CPU
    return _detect(dev.index if dev.index is not None else torch.cuda.current_device())


@functools.cache
def num_sms(index: int) -> int:
    """Streaming multiprocessors of CUDA device `index` (persistent kernels size their grid by it)."""
    return torch.cuda.get_device_properties(index).multi_processor_count


def resolve(arch: Arch | None, device: torch.device | None = None) -> Arch:
    if arch is None:
        return detect(device)
    if not isinstance(arch, Arch):
        raise TypeError(f"arch must be rtp_fp8.arch.Arch, got {type(arch).__name__}")
    return arch
