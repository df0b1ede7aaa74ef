"""The Triton kernels with a software-pipelined ring fit each architecture's shared memory at the
depth block_scaled gives them there (ring_stages): the swapped decode kernel (_fp8_gemm_swap_kernel) at
swap_config's depth, and the persistent TMA kernel (_fp8_gemm_tma_kernel: dense, contiguous and masked
calls off SM90's warp-specialized kernel) at every configs.json bucket. Each is compiled without a GPU for
sm_90, sm_100 and sm_120 (whose blocks get 99 KiB, not 227) with Triton's own compiler, and its shared
memory is read from the compiled kernel. A launch past the limit fails with OutOfResources on the
user's GPU, so this is checked where CI has none; the unclamped H200-tuned depths are shown not to fit
sm_120. Numbers and results come from the GPU (test_decode_gemm.py, test_triton_gemm.py, bench/).

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
kind, cap, rows, cols, stages, splits, warps, packed, mode = sys.argv[1], *map(int, sys.argv[2:10])
scale = "*i32" if packed else "*fp32"  # UE8M0: four packed exponents an int32
sig = {"a_desc": f"tensordesc<fp8e4nv[{rows}, 128]>", "b_desc": f"tensordesc<fp8e4nv[{cols}, 128]>",
       "d_ptr": "*fp32" if splits > 1 else "*bf16", "sa_ptr": scale, "sb_ptr": scale, "grp_ptr": "*i32",
       "cnt_ptr": "*i32"}
const = dict(SB_ROW_DIV=128, PACKED_A=bool(packed), PACKED_B=bool(packed), MODE=mode, STAGES=stages, SPLIT_K=splits)
if kind == "swap":  # rows: BLOCK_T (A, the tokens), cols: BLOCK_N (B, the weights)
    fn = G._fp8_gemm_swap_kernel
    const |= dict(BLOCK_N=cols, BLOCK_T=rows, PDL=False)
else:
    fn = G._fp8_gemm_tma_kernel
    const |= dict(BLOCK_M=rows, BLOCK_N=cols, BLOCK_K=128, GROUP_M=8)
sig = {n: sig.get(n, "constexpr" if n in const else "i32") for n in fn.arg_names}
k = triton.compile(ASTSource(fn, sig, const), target=GPUTarget("cuda", cap, 32), options={"num_warps": warps})
print(json.dumps({"shared": k.metadata.shared}))
"""


def _shared(arch, kind, rows, cols, stages, splits=1, warps=4, packed=False, mode=G.DENSE):
    """CHILD's compile of kernel `kind` (swap: rows BLOCK_T, cols BLOCK_N; tma: BLOCK_M, BLOCK_N) in
    mode (DENSE, CONTIGUOUS or MASKED) for arch -> its shared memory in bytes."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT)
    args = [kind, arch.sm, rows, cols, stages, splits, warps, int(packed), mode]
    res = subprocess.run([sys.executable, "-c", CHILD, *map(str, args)], capture_output=True, text=True, cwd=ROOT,
                         env=env)
    assert res.returncode == 0, res.stderr[-2000:]
    return json.loads(res.stdout.strip().splitlines()[-1])["shared"]


@pytest.mark.parametrize("arch", [A.Arch(9, 0), A.Arch(10, 0), A.Arch(12, 0)], ids=str)
@pytest.mark.parametrize("rows,n,k,m", [(64, 4096, 7168, 64), (1, 7168, 2048, 1), (64, 7168, 2048, None)],
                         ids=["dense-64x4096x7168", "dense-1x7168x2048", "masked-64x7168x2048"])
def test_swap_ring_fits_the_block(arch, rows, n, k, m):
    bn, bt, stages, splits = G.swap_config(rows, n, k, m, 132, arch.smem_per_block)
    shared = _shared(arch, "swap", bt, bn, stages, splits, mode=G.DENSE if m is not None else G.MASKED)
    assert 0 < shared <= arch.smem_per_block, (arch, bn, bt, stages, shared)
    if arch.major == 12 and bt == 64 and m is not None:
        # a one-wave dense grid's depth would not fit there: the clamp is what makes the launch possible
        assert stages < G.SWAP_STAGES and _shared(arch, "swap", bt, bn, G.SWAP_STAGES, splits) > arch.smem_per_block


@pytest.mark.parametrize("arch", [A.Arch(9, 0), A.Arch(10, 0), A.Arch(12, 0)], ids=str)
@pytest.mark.parametrize("bucket", range(len(G.config_table())))
@pytest.mark.parametrize("mode", [G.DENSE, G.MASKED], ids=["dense", "masked"])
def test_tma_kernel_ring_fits_the_block(arch, bucket, mode):
    """Every configs.json bucket at ring_stages' depth for arch, with the arch's scale format (SM90:
    FP32; Blackwell: packed UE8M0), dense (contiguous loads alike) and masked. On SM120 the table's
    own depths do not fit: without the clamp every dense GEMM there would fail to launch."""
    bm, bn, bk, warps, stages, _ = G.config_table()[bucket][1]
    packed = arch.scale_format == "ue8m0"
    depth = G.ring_stages(stages, (bm + bn) * bk, arch.smem_per_block)
    shared = _shared(arch, "tma", bm, bn, depth, warps=warps, packed=packed, mode=mode)
    assert 0 < shared <= arch.smem_per_block, (arch, bm, bn, depth, shared)
    if arch.major == 12:
        unclamped = _shared(arch, "tma", bm, bn, stages, warps=warps, packed=packed, mode=mode)
        assert depth < stages and unclamped > arch.smem_per_block
    else:
        assert depth == stages  # the H200-tuned depth is what SM90 and SM100 run
