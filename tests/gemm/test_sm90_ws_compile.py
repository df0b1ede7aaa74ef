"""The warp-specialized Gluon GEMM experiment (bench/sm90_ws_gemm.py), dense and m-grouped
contiguous, compiles for sm_90a without a GPU: three partitions (two consumer warpgroups, one
producer warp), async m64n128k32 FP8 wgmma, no spills, and none of ptxas's wgmma
serialization warnings (C7514, which an MMA result carried across the loop edge causes). Its
numbers come from the GPU (bench/gemm_ws_gluon.py); this only keeps it buildable.

The compile runs in a child process without TRITON_INTERPRET (this suite sets it, and under it
Triton's and Gluon's @jit library functions become interpreter objects a compiled kernel
cannot call)."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

pytest.importorskip("triton.experimental.gluon", reason="needs Triton with Gluon")

from triton.backends.nvidia.compiler import get_ptxas  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]


# (unroll, wgmma sites per consumer: the K loop body x unroll + the odd-nk tail, mode, TMA epilogue,
# B scales by TMA)
CASES = [(1, 1, 0, 0, 1), (2, 3, 0, 0, 1), (2, 3, 1, 0, 1), (2, 3, 1, 1, 1), (2, 3, 0, 0, 0)]


@pytest.mark.parametrize("unroll,sites,mode,epi_tma,sb_tma", CASES,
                         ids=[f"u{u}-{'contiguous' if m else 'dense'}{'-tma_store' if t else ''}"
                              f"{'' if b else '-sb_ldg'}" for u, _, m, t, b in CASES])
def test_ws_gemm_compiles_for_sm90a(tmp_path, unroll, sites, mode, epi_tma, sb_tma):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT)
    subprocess.run([sys.executable, "-m", "bench.sm90_ws_gemm", str(tmp_path), "4", str(unroll), str(mode),
                    str(epi_tma), str(sb_tma)], check=True, cwd=ROOT, env=env)
    ptx = (tmp_path / "kernel.ptx").read_text()
    # per K step the producer copies A and B (2-D) and the A-row scales (+ B's scale with sb_tma) (1-D)
    assert ptx.count("cp.async.bulk.tensor.1d.shared::cta.global") == 1 + sb_tma
    # the TMA epilogue: one 64-row store per consumer and tile
    assert ptx.count("cp.async.bulk.tensor.2d.global.shared") == (2 if epi_tma else 0)
    assert json.loads((tmp_path / "meta.json").read_text())["num_warps"] == 12  # 4 + 4 + 1, by warpgroups
    # 2 consumers x wgmma sites x 4 (K = 128 in k32 steps)
    assert ptx.count("wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3") == 2 * sites * 4
    assert "setmaxnreg.inc" in ptx and "setmaxnreg.dec" in ptx
    res = subprocess.run([get_ptxas(90).path, "-arch=sm_90a", "-v", str(tmp_path / "kernel.ptx"), "-o",
                          str(tmp_path / "check.cubin")], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert "0 bytes spill stores, 0 bytes spill loads" in res.stderr, res.stderr
    assert "C7514" not in res.stderr and "serializ" not in res.stderr.lower(), res.stderr
