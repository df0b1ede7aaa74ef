"""Expert parallelism across processes (rtp_fp8.moe.dist): gloo on the CPU with world sizes 2 and
4 (kernels under the interpreter), each rank's output compared with a single-process MoE over all
experts (same routing, same weights); invalid ids and overflow counted on the rank that saw them.
NCCL with world size 1 on a GPU, captured in a CUDA graph. Multi-GPU runs: `gpu_multi` tests."""

import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from helpers import EP_T, EP_TOPK, ep_check_rank, ep_inputs, ep_weights
from rtp_fp8.moe import dist as D
from rtp_fp8.moe import executors as X


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank, world, port, mode, case, capacity):
    os.environ.setdefault("TRITON_INTERPRET", "1")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        ep_check_rank(rank, world, mode, case, "cpu", capacity)
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world,mode,case,capacity", [
    (2, "low_latency", "plain", None),
    (2, "normal", "invalid", None),
    (4, "low_latency", "invalid", None),
    (4, "normal", "plain", None),
    (2, "low_latency", "overflow", 2),
])
def test_ep_across_gloo_processes(world, mode, case, capacity):
    mp.spawn(_worker, args=(world, _free_port(), mode, case, capacity), nprocs=world, join=True)


def test_bad_arguments_are_named():
    with pytest.raises(RuntimeError, match="torch.distributed is not initialized"):
        D.EPMoE(None, max_tokens=4, topk=2)
    os.environ[D.MODE_ENV] = "fast"
    try:
        with pytest.raises(ValueError, match=r"mode \(RTP_FP8_EP_MODE\) must be one of \('low_latency', 'normal'\)"):
            D._check_mode(None)
    finally:
        del os.environ[D.MODE_ENV]


def test_deepep_detection_with_stand_ins(monkeypatch):
    import sys
    import types

    monkeypatch.setitem(sys.modules, "deep_ep", None)
    assert D.deepep_capabilities() == (False, "deep_ep is not installed (optional accelerator, not on PyPI)")
    fake = types.ModuleType("deep_ep")
    fake.__version__ = "1.1.0"
    monkeypatch.setitem(sys.modules, "deep_ep", fake)
    assert D.deepep_capabilities()[1] == "deep_ep 1.1.0 is older than the minimum 1.2.1 (or reports no version)"
    fake.__version__ = "1.2.1"
    fake.Buffer = type("Buffer", (), {"dispatch": lambda self: None, "combine": lambda self: None})
    assert D.deepep_capabilities()[1] == "deep_ep 1.2.1: Buffer lacks low_latency_dispatch, low_latency_combine"
    fake.Buffer.low_latency_dispatch = fake.Buffer.low_latency_combine = lambda self: None
    assert D.deepep_capabilities() == (False, "deep_ep 1.2.1 found; rtp_fp8's DeepEP adapter is not written yet")


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["low_latency", "normal"])
def test_nccl_world_size_one(mode, tmp_path):
    """NCCL with one rank: the same comparisons; the low-latency forward captured in a CUDA graph
    replays bit-identically to eager calls."""
    dist.init_process_group("nccl", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        torch.cuda.set_device(0)
        ep_check_rank(0, 1, mode, "plain", "cuda")
        if mode != "low_latency":
            return
        w_gate, w_up, w_down = ep_weights(1, "cuda")
        ep = D.EPMoE(X.QuantizedExperts.from_bf16(w_gate, w_up, w_down), max_tokens=EP_T, topk=EP_TOPK)
        x, ids, w = ep_inputs(0, 1, "cuda", "plain")
        ep(x, ids, w)  # warm-up: JIT, workspaces
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.stream(stream), torch.cuda.graph(graph):
            y_static = ep(x, ids, w)
        torch.cuda.current_stream().wait_stream(stream)
        x2, ids2, w2 = ep_inputs(5, 1, "cuda", "plain")
        x.copy_(x2)
        ids.copy_(ids2)
        w.copy_(w2)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(y_static, ep(x2, ids2, w2))
    finally:
        dist.destroy_process_group()


def test_byte_model_functions():
    """docs/ep.md's table comes from these: exact on small cases."""
    assert D.row_bytes(7168, 8, "fp32") == 7168 + 56 * 4 + 64
    assert D.row_bytes(7168, 8, "ue8m0") == 7168 + 14 * 4 + 64
    assert D.expected_destinations(1, 8, 4) == 1.0
    assert abs(D.expected_destinations(2, 2, 2) - 2 * (1 - 1 / 6)) < 1e-12
    assert abs(D.expected_destinations(64, 4, 8) - 7.68) < 5e-3
