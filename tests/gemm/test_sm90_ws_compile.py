"""The warp-specialized Gluon GEMM experiment (bench/sm90_ws_gemm.py) compiles for sm_90a
without a GPU: three partitions (two consumer warpgroups, one producer warp), async
m64n128k32 FP8 wgmma, no spills, and none of ptxas's wgmma serialization warnings (C7514,
which an MMA result carried across the loop edge causes). Its numbers come from the GPU
(bench/gemm_ws_gluon.py); this only keeps it buildable."""

import subprocess

import pytest

gluon = pytest.importorskip("triton.experimental.gluon", reason="needs Triton with Gluon")

from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.backends.nvidia.compiler import get_ptxas  # noqa: E402
from triton.experimental.gluon import language as gl  # noqa: E402
from triton.experimental.gluon._runtime import GluonASTSource  # noqa: E402

from bench import sm90_ws_gemm as W  # noqa: E402


def _compile(stages, unroll):
    op = gl.NVMMASharedLayout.get_default_for([W.BM, W.BK], gl.float8e4nv)
    sl = gl.NVMMASharedLayout.get_default_for([W.BM], gl.float32)
    sig = {"a_desc": f"tensordesc<fp8e4nv[128, 128],{op!r}>", "b_desc": f"tensordesc<fp8e4nv[128, 128],{op!r}>",
           "sa_desc": f"tensordesc<fp32[128],{sl!r}>", "d_ptr": "*bf16", "sb_ptr": "*fp32", "M": "i32", "N": "i32",
           "K": "i32", "TILES_M": "i32", "stride_dm": "i32", "stride_sbn": "i32", "stride_sbk": "constexpr",
           "m_pad": "i32", "GROUP_M": "constexpr", "STAGES": "constexpr", "UNROLL": "constexpr",
           "num_warps": "constexpr"}
    const = {"stride_sbk": 1, "GROUP_M": 8, "STAGES": stages, "UNROLL": unroll, "num_warps": 4}
    import triton

    return triton.compile(GluonASTSource(W._ws_gemm_kernel, sig, const), target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": 4, "maxnreg": 168})


@pytest.mark.parametrize("unroll,sites", [(1, 1), (2, 3)])  # K loop body (x unroll) + the odd-nk tail
def test_ws_gemm_compiles_for_sm90a(tmp_path, unroll, sites):
    k = _compile(stages=4, unroll=unroll)
    ptx = k.asm["ptx"]
    assert k.metadata.num_warps == 12  # 4 (consumer 0) + 4 (consumer 1) + 1 (producer), by warpgroups
    # 2 consumers x wgmma sites x 4 (K = 128 in k32 steps)
    assert ptx.count("wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3") == 2 * sites * 4
    assert "setmaxnreg.inc" in ptx and "setmaxnreg.dec" in ptx
    src = tmp_path / "k.ptx"
    src.write_text(ptx)
    res = subprocess.run([get_ptxas(90).path, "-arch=sm_90a", "-v", str(src), "-o", str(tmp_path / "k.cubin")],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert "0 bytes spill stores, 0 bytes spill loads" in res.stderr, res.stderr
    assert "C7514" not in res.stderr and "serializ" not in res.stderr.lower(), res.stderr
