"""Expert parallelism across GPUs over NCCL, one process per GPU (up to 4), both modes, against the
single-process MoE over all experts. Runs where a machine has 2+ GPUs (`gpu_multi`; Bazel asks for
resources:gpu:2), skips with the reason elsewhere."""

import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from helpers import ep_check_rank


def _worker(rank, world, port, mode):
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        ep_check_rank(rank, world, mode, "invalid", f"cuda:{rank}")
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.mark.gpu_multi
@pytest.mark.parametrize("mode", ["low_latency", "normal"])
def test_ep_across_gpus(mode):
    world = min(4, torch.cuda.device_count())
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.pop("TRITON_INTERPRET", None)
    mp.spawn(_worker, args=(world, port, mode), nprocs=world, join=True)
