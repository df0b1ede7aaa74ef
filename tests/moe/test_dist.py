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

from helpers import DEVICES, EP_T, EP_TOPK, ep_check_rank, ep_inputs, ep_weights, rel_l2
from rtp_fp8.arch import Arch
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


class _StandInBuffer:
    """deep_ep.Buffer's V1 low-latency contract (v1.2.1 docstrings) for one rank: a test double of
    the layout and semantics the adapter relies on, not evidence about DeepEP itself."""

    made = []

    def __init__(self, group, num_nvl_bytes=0, num_rdma_bytes=0, low_latency_mode=False, num_qps_per_rank=24):
        assert low_latency_mode and num_rdma_bytes > 0
        self.num_qps_per_rank = num_qps_per_rank
        _StandInBuffer.made.append(self)

    @staticmethod
    def get_low_latency_rdma_size_hint(max_tokens, hidden, num_ranks, num_experts):
        return 2 * max_tokens * num_ranks * num_experts * hidden

    def dispatch(self, *a, **k):
        raise AssertionError("normal mode is not adapted")

    combine = dispatch

    def low_latency_dispatch(self, x, topk_idx, max_tokens, num_experts, use_fp8=True, round_scale=False,
                             use_ue8m0=False, **kw):
        from rtp_fp8.quant import reference as QR
        from rtp_fp8.quant import ue8m0

        assert use_fp8 and topk_idx.dtype == torch.int64 and x.dtype == torch.bfloat16
        h, groups = x.shape[1], x.shape[1] // 128
        q, s = QR.per_token_group_quant_ref(x, 128, pow2=round_scale)
        q, s = q.to(x.device), s.to(x.device)
        recv_q = torch.zeros(num_experts, max_tokens, h, dtype=torch.float8_e4m3fn, device=x.device)
        cols = -(-groups // 4) if use_ue8m0 else groups
        dtype = torch.int32 if use_ue8m0 else torch.float32
        recv_s = torch.zeros(num_experts, cols, max_tokens, dtype=dtype, device=x.device).transpose(1, 2)
        count = torch.zeros(num_experts, dtype=torch.int32, device=x.device)
        where = []
        for e in range(num_experts):
            rows = (topk_idx == e).any(1).nonzero().flatten()
            recv_q[e, :len(rows)] = q[rows]
            recv_s[e, :len(rows)] = ue8m0.pack(s[rows]) if use_ue8m0 else s[rows]
            count[e] = len(rows)
            where.append(rows)
        return (recv_q, recv_s), count, where, None, None

    def low_latency_combine(self, x, topk_idx, topk_weights, handle, **kw):
        out = torch.zeros(topk_idx.shape[0], x.shape[2], dtype=torch.float32, device=x.device)
        for e, rows in enumerate(handle):
            w = (topk_weights * (topk_idx == e)).sum(1)[rows]
            out[rows] += w[:, None] * x[e, :len(rows)].float()
        return out.to(torch.bfloat16), None, None


def _stand_in_deep_ep():
    import types

    m = types.ModuleType("deep_ep")
    m.__version__ = "1.2.1"
    m.Buffer = _StandInBuffer
    return m


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("arch", [Arch(9, 0), Arch(10, 0)], ids=["fp32", "ue8m0"])
def test_deepep_adapter_against_a_stand_in(device, arch, tmp_path, monkeypatch):
    """The DeepEP low-latency adapter (one rank): the stand-in's receive tensor and counts feed the
    masked GEMMs, combine reduces with the weights; against the single-process FP8 MoE."""
    import sys

    monkeypatch.setitem(sys.modules, "deep_ep", _stand_in_deep_ep())
    assert D.deepep_capabilities() == (True, "")
    backend = "gloo" if device == "cpu" else "nccl"
    dist.init_process_group(backend, init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        w_gate, w_up, w_down = ep_weights(1, device)
        experts = X.QuantizedExperts.from_bf16(w_gate, w_up, w_down, arch)  # either format on any device
        if device == "cpu":  # DeepEP needs CUDA: forcing it here is refused, naming why
            with pytest.raises(ValueError, match="backend 'deepep' was forced but cannot run: DeepEP needs CUDA"):
                D.EPMoE(experts, max_tokens=EP_T, topk=EP_TOPK, backend="deepep")
            ep = D.EPMoE(experts, max_tokens=EP_T, topk=EP_TOPK, backend="torch")
            ep.deepep = D._DeepEPLowLatency(ep)
        else:
            ep = D.EPMoE(experts, max_tokens=EP_T, topk=EP_TOPK, backend="deepep")
            assert ep.backend == "deepep"
        assert _StandInBuffer.made[-1].num_qps_per_rank == experts.num_experts
        x, ids, w = ep_inputs(0, 1, device, "invalid")
        y = ep(x, ids, w)
        want = X.ContiguousExecutor(experts, EP_T, EP_TOPK)(x, ids, w)
        assert rel_l2(y.float(), want.float()) < 1e-2
        assert ep.read_counters()["invalid_ids"] == 2
        with pytest.raises(ValueError, match="its normal mode is not adapted"):
            D.EPMoE(experts, max_tokens=EP_T, topk=EP_TOPK, mode="normal", backend="deepep")
    finally:
        dist.destroy_process_group()


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
    assert D.deepep_capabilities()[1] == "deep_ep 1.2.1: Buffer lacks get_low_latency_rdma_size_hint"
    fake.Buffer.get_low_latency_rdma_size_hint = staticmethod(lambda *a: 1)
    assert D.deepep_capabilities() == (True, "")


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
