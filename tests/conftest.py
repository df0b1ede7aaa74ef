"""Test harness: markers, interpreter mode on machines without CUDA, the cast fix.

Tests without a GPU marker run everywhere. `gpu` tests need CUDA; `gpu_sm90`,
`gpu_sm100`, `gpu_sm120` say on which real architectures a test can run, and a test is
skipped (with that reason) where the device is another one.
"""

import os

# Must be decided before any Triton kernel is defined (triton.jit reads it then).
try:
    import torch

    _HAS_CUDA = torch.cuda.is_available()
except ImportError:  # pragma: no cover - torch is in every lock
    _HAS_CUDA = False
if not _HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from rtp_fp8 import triton_env  # noqa: E402,F401  (installs the interpreter cast fix)

ARCH_MARKERS = {"gpu_sm90": (9, 0), "gpu_sm100": (10, 0), "gpu_sm120": (12, 0)}


def pytest_collection_modifyitems(config, items):
    cap = torch.cuda.get_device_capability() if _HAS_CUDA else None
    for item in items:
        names = {m.name for m in item.iter_markers()}
        arch_marks = names & set(ARCH_MARKERS)
        if (arch_marks or "gpu_multi" in names) and "gpu" not in names:
            item.add_marker(pytest.mark.gpu)
            names.add("gpu")
        if "gpu" not in names:
            continue
        if not _HAS_CUDA:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU (none visible)"))
        elif "gpu_multi" in names and torch.cuda.device_count() < 2:
            item.add_marker(pytest.mark.skip(reason=f"needs 2+ GPUs of one host; this machine has "
                                                    f"{torch.cuda.device_count()}"))
        elif arch_marks and tuple(cap) not in {ARCH_MARKERS[m] for m in arch_marks}:
            item.add_marker(
                pytest.mark.skip(reason=f"needs {sorted(arch_marks)}; this GPU is sm_{cap[0]}{cap[1]}")
            )


def pytest_sessionstart(session):
    """`./dev gpu-test` sets RTP_FP8_EXPECT_DEEPGEMM after building DeepGEMM from its pinned
    archive: then a DeepGEMM that does not import is an error, not a quiet skip of its tests."""
    want = os.environ.get("RTP_FP8_EXPECT_DEEPGEMM")
    if want and _HAS_CUDA:
        from rtp_fp8.gemm import deepgemm as D

        caps = D.capabilities()
        if not caps.available or caps.version != want:
            raise pytest.UsageError(f"RTP_FP8_EXPECT_DEEPGEMM={want} but DeepGEMM is {caps.version}: "
                                    f"{caps.reason or 'another version'}")
