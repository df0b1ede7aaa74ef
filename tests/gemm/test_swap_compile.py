"""The swapped decode kernel (block_scaled._fp8_gemm_swap_kernel) at the ring depth swap_config gives
each architecture fits that architecture's shared memory: compiled without a GPU for sm_90, sm_100 and
sm_120 (whose blocks get 99 KiB, not 227), with Triton's own compiler, its shared-memory size read from
the compiled kernel. A launch past the limit fails with OutOfResources on the user's GPU, so this is
checked where CI has none. Numbers and results come from the GPU (test_decode_gemm.py, bench/).

The compiles run in a child process without TRITON_INTERPRET (this suite sets it)."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

from rtp_fp8 import arch as A
from rtp_fp8.gemm.triton import block_scaled as G

ROOT = pathlib.Path(__file__).resolve().parents[2]
CHILD = """
import json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from rtp_fp8.gemm.triton import block_scaled as G
cap, bn, bt, stages, splits = map(int, sys.argv[1:6])
sig = {"a_desc": f"tensordesc<fp8e4nv[{bt}, 128]>", "b_desc": f"tensordesc<fp8e4nv[{bn}, 128]>",
       "d_ptr": "*fp32" if splits > 1 else "*bf16", "sa_ptr": "*fp32", "sb_ptr": "*fp32", "grp_ptr": "*i32"}
const = dict(SB_ROW_DIV=128, PACKED_A=False, PACKED_B=False, MODE=0, BLOCK_N=bn, BLOCK_T=bt, STAGES=stages,
             SPLIT_K=splits, PDL=False)
sig |= {n: "constexpr" if n in const else "i32" for n in G._fp8_gemm_swap_kernel.arg_names if n not in sig}
k = triton.compile(ASTSource(G._fp8_gemm_swap_kernel, sig, const), target=GPUTarget("cuda", cap, 32),
                   options={"num_warps": 4})
print(json.dumps({"shared": k.metadata.shared}))
"""


def _shared(arch, bn, bt, stages, splits):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT)
    res = subprocess.run([sys.executable, "-c", CHILD, str(arch.sm), str(bn), str(bt), str(stages), str(splits)],
                         capture_output=True, text=True, cwd=ROOT, env=env)
    assert res.returncode == 0, res.stderr[-2000:]
    return json.loads(res.stdout.strip().splitlines()[-1])["shared"]


@pytest.mark.parametrize("arch", [A.Arch(9, 0), A.Arch(10, 0), A.Arch(12, 0)], ids=str)
@pytest.mark.parametrize("rows,n,k,m", [(64, 4096, 7168, 64), (1, 7168, 2048, 1), (64, 7168, 2048, None)],
                         ids=["dense-64x4096x7168", "dense-1x7168x2048", "masked-64x7168x2048"])
def test_swap_ring_fits_the_block(arch, rows, n, k, m):
    bn, bt, stages, splits = G.swap_config(rows, n, k, m, 132, arch.smem_per_block)
    shared = _shared(arch, bn, bt, stages, splits)
    assert 0 < shared <= arch.smem_per_block, (arch, bn, bt, stages, shared)
    if arch.major == 12 and bt == 64 and m is not None:
        # a one-wave dense grid's depth would not fit there: the clamp is what makes the launch possible
        assert stages < G.SWAP_STAGES and _shared(arch, bn, bt, G.SWAP_STAGES, splits) > arch.smem_per_block
