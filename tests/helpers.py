"""Shared test helpers: devices, poison, comparisons."""

import pytest
import torch

DEVICES = [
    pytest.param("cpu", id="cpu"),
    pytest.param("cuda", id="cuda", marks=[pytest.mark.gpu]),
]


def poison_(t: torch.Tensor) -> torch.Tensor:
    """Fill with a value no kernel writes: NaN for floats, 0x7B7B... bytes otherwise."""
    if t.dtype.is_floating_point and t.element_size() > 1:
        t.fill_(float("nan"))
    else:
        t.view(torch.uint8).fill_(0x7B) if t.is_contiguous() else t.fill_(0x7B)
    return t


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[t.element_size()])


def assert_bits_equal(got: torch.Tensor, want: torch.Tensor, what: str = ""):
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} != {want.dtype}"
    g, w = bits(got.contiguous().cpu()), bits(want.contiguous().cpu())
    bad = g != w
    assert not bad.any(), f"{what}: {int(bad.sum())} of {bad.numel()} differ; first at {bad.nonzero()[:3].tolist()}"


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))
