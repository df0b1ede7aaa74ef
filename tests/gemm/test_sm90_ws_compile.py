"""The SM90 warp-specialized Gluon GEMM (rtp_fp8/gemm/triton/sm90_ws.py), dense, m-grouped
contiguous and m-grouped masked, with and without the TMA-store epilogue, compiles for sm_90a
without a GPU: three partitions (two consumer warpgroups, one producer warp; 64-row tiles: one
consumer warpgroup), async m64n128k32 FP8 wgmma (m64n64k32 in
narrow tiles), no spills,
and none of ptxas's wgmma serialization warnings (C7514, which an MMA result carried across the
loop edge causes). Its results and numbers come from the GPU (tests/gemm/test_sm90_ws.py,
bench/gemm.py); this keeps it buildable where CI has no GPU.

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

from rtp_fp8 import arch as A  # noqa: E402
from rtp_fp8.gemm.triton import sm90_ws  # noqa: E402

pytestmark = pytest.mark.skipif(not sm90_ws.LIST_WARP_SPECIALIZE,
                                reason="needs Triton >= 3.6 (gl.warp_specialize taking (function, args) pairs)")

ROOT = pathlib.Path(__file__).resolve().parents[2]
CHILD = """
import json, pathlib, sys
from rtp_fp8.gemm.triton import sm90_ws
out = pathlib.Path(sys.argv[1])
opt = lambda i: int(sys.argv[i]) if len(sys.argv) > i and sys.argv[i] != "-" else None
kernel = sm90_ws.compile_sm90a(int(sys.argv[2]), int(sys.argv[3]), bn=int(sys.argv[4]), split=sys.argv[5] == "1",
                               bm=int(sys.argv[6]), a_rows=int(sys.argv[7]) or None,
                               sb_prefetch=opt(8), sb_k=opt(9), pdl=opt(10) or 0)
(out / "kernel.ptx").write_text(kernel.asm["ptx"])
(out / "meta.json").write_text(json.dumps({"num_warps": kernel.metadata.num_warps, "shared": kernel.metadata.shared}))
"""


H = sm90_ws.HALF_BM


def _compile(tmp_path, *args):
    """CHILD's compile of sm90_ws with these arguments (mode, epi_tma, bn, split, bm, a_rows[, sb_prefetch:
    default launch()'s for bm[, sb_k: the staged B-scale run, default launch()'s for the tile[, pdl]]]; "-": the
    default) -> its PTX."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT)
    subprocess.run([sys.executable, "-c", CHILD, str(tmp_path), *map(str, args)], check=True, cwd=ROOT, env=env)
    return (tmp_path / "kernel.ptx").read_text()


@pytest.mark.parametrize("mode,epi_tma,bn,split,bm,a_rows", [a + (0, ) for a in [
    (0, 0, 128, 0, 128), (0, 1, 128, 0, 128), (1, 0, 128, 0, 128), (1, 1, 128, 0, 128), (2, 0, 128, 0, 128),
    (2, 1, 128, 0, 128), (0, 0, 128, 1, 128),
    (0, 0, sm90_ws.WIDE_BN, 0, 128), (0, 1, sm90_ws.WIDE_BN, 0, 128), (1, 0, sm90_ws.WIDE_BN, 0, 128),
    (2, 1, sm90_ws.WIDE_BN, 0, 128),
    (0, 1, sm90_ws.NARROW_BN, 0, 128), (0, 0, sm90_ws.NARROW_BN, 1, 128), (1, 1, sm90_ws.NARROW_BN, 0, 128),
    (2, 0, sm90_ws.NARROW_BN, 0, 128), (2, 1, sm90_ws.NARROW_BN, 0, 128),
    (0, 1, 128, 0, H), (0, 1, 64, 0, H), (0, 0, 64, 0, H), (0, 0, 128, 1, H), (0, 0, 64, 1, H)]] + [
    (0, 1, 64, 0, H, 16), (0, 0, 128, 1, H, 32)],
    ids=["dense", "dense-tma_store", "contiguous", "contiguous-tma_store", "masked", "masked-tma_store",
         "dense-split_k", "wide-dense", "wide-dense-tma_store", "wide-contiguous", "wide-masked-tma_store",
         "narrow-dense-tma_store", "narrow-dense-split_k", "narrow-contiguous-tma_store", "narrow-masked",
         "narrow-masked-tma_store", "half128-dense-tma_store", "half64-dense-tma_store", "half64-dense",
         "half128-dense-split_k", "half64-dense-split_k", "half64-a16-dense-tma_store", "half128-a32-dense-split_k"])
def test_ws_gemm_compiles_for_sm90a(tmp_path, mode, epi_tma, bn, split, bm, a_rows):
    """Every variant launch() can run (wide contiguous tiles keep pointer stores; 64-row tiles are
    dense only, and may load 16 or 32 rows of A, sm90_ws.a_box_rows)."""
    ptx = _compile(tmp_path, mode, epi_tma, bn, split, bm, a_rows)
    wide = bn == sm90_ws.WIDE_BN
    # launch()'s default, in SB_STAGE_TILES's ring
    staged = (mode, bm, bn) in sm90_ws.SB_STAGE_TILES and (not split or sm90_ws.SB_STAGE_SPLIT)
    # per K step the producer copies A and B (2-D) and the step's A-row scales (1-D); per tile of a
    # staged kernel, its B-scale row (1-D)
    assert ptx.count("cp.async.bulk.tensor.2d.shared::cluster.global") + ptx.count(
        "cp.async.bulk.tensor.2d.shared::cta.global") == 2
    assert ptx.count("cp.async.bulk.tensor.1d.shared::cta.global") + ptx.count(
        "cp.async.bulk.tensor.1d.shared::cluster.global") == (2 if staged else 1)
    consumers = 1 if bm == H else 2  # a 64-row tile's one consumer runs it whole
    # the TMA epilogue: one 64-row store per consumer and 128-column half
    assert ptx.count("cp.async.bulk.tensor.2d.global.shared") == ((4 if wide else consumers) if epi_tma else 0)
    meta = json.loads((tmp_path / "meta.json").read_text())
    # 4 + 4 + 1 by warpgroups; a 64-row tile's 4 + 1
    assert meta["num_warps"] == 4 * consumers + 4
    # the ring (sm90_ws's STAGES*), the epilogue buffers and the barriers fit an SM90 block
    assert 0 < meta["shared"] <= A.Arch(9, 0).smem_per_block
    # 2 consumers x 3 wgmma sites (two per loop trip, the odd-step tail) x 4 (K = 128 in k32 steps);
    # wide: 2 consumers x 2 sites (one per 128-column half) x 4; narrow: m64n64 wgmmas; a 64-row
    # tile's one consumer: m64 x the tile's width
    width = bn if bm == H else min(bn, 128)
    assert ptx.count(f"wgmma.mma_async.sync.aligned.m64n{width}k32.f32.e4m3.e4m3") == (
        2 * 2 * 4 if wide else consumers * 3 * 4)
    assert ptx.count("wgmma.mma_async") == ptx.count(f"wgmma.mma_async.sync.aligned.m64n{width}k32")
    assert "setmaxnreg.inc" in ptx and "setmaxnreg.dec" in ptx
    # launch()'s default: the producer prefetches B-scale rows for the tile heights in SB_PREFETCH_ROWS,
    # unless the tile stages them
    assert ("prefetch.global.L2" in ptx) == (bm in sm90_ws.SB_PREFETCH_ROWS and not staged)
    res = subprocess.run([get_ptxas(90).path, "-arch=sm_90a", "-v", str(tmp_path / "kernel.ptx"), "-o",
                          str(tmp_path / "check.cubin")], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert "0 bytes spill stores, 0 bytes spill loads" in res.stderr, res.stderr
    assert "C7514" not in res.stderr and "serializ" not in res.stderr.lower(), res.stderr


def test_barrier_probe_strips_only_the_consumer_loops_warpgroup_barriers(tmp_path):
    """bench/barrier_probe.py's PTX edit on the 64x64 tile's kernel: the barriers before the three
    K-step waits (two per loop trip and the odd-step tail), then also those before the three
    arrives, and no other; the edited PTX still assembles for sm_90a."""
    from bench.barrier_probe import SYNC, strip_syncs

    def syncs(text):
        return sum(1 for line in text.splitlines() if SYNC.match(line))

    ptx = _compile(tmp_path, 0, 1, 64, 0, H, 0, 1, 0)  # as the probe launches it: without B-scale staging
    no_wait, n_wait = strip_syncs(ptx)
    no_sync, n_all = strip_syncs(ptx, ("mbarrier.try_wait", "mbarrier.arrive.shared"))
    assert (n_wait, n_all) == (3, 6)
    assert syncs(no_sync) == syncs(ptx) - 6
    assert no_wait.count("mbarrier.try_wait") == ptx.count("mbarrier.try_wait")
    (tmp_path / "edited.ptx").write_text(no_sync)
    res = subprocess.run([get_ptxas(90).path, "-arch=sm_90a", str(tmp_path / "edited.ptx"), "-o",
                          str(tmp_path / "edited.cubin")], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


@pytest.mark.parametrize("mode,bn,bm", [(0, 128, 128), (0, sm90_ws.WIDE_BN, 128), (0, sm90_ws.NARROW_BN, H),
                                        (0, 128, H), (1, 128, 128), (2, 128, 128)])
def test_sb_prefetch_variants_compile_without_spills(tmp_path, mode, bn, bm):
    """sb_prefetch (SB_PREFETCH_ROWS): the producer's L2 prefetch of the tile's B-scale row(s), one per
    row in the PTX (two for a wide tile), through ptxas for sm_90a with no spills; with it off the
    kernel has none."""
    ptx = _compile(tmp_path, mode, 0, bn, 0, bm, 0, 1, 0)
    assert ptx.count("prefetch.global.L2") == (2 if bn == sm90_ws.WIDE_BN else 1)
    res = subprocess.run([get_ptxas(90).path, "-arch=sm_90a", "-v", str(tmp_path / "kernel.ptx"), "-o",
                          str(tmp_path / "check.cubin")], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert "0 bytes spill stores, 0 bytes spill loads" in res.stderr, res.stderr
    assert "prefetch.global.L2" not in _compile(tmp_path, mode, 0, bn, 0, bm, 0, 0, 0)


@pytest.mark.parametrize("mode,epi_tma,bn,split,bm,sb_k", [
    (0, 1, 64, 0, H, 64), (0, 1, 128, 0, H, 64), (0, 0, 64, 1, H, 32), (0, 1, 128, 0, 128, 64),
    (0, 0, sm90_ws.NARROW_BN, 1, 128, 32), (1, 1, 128, 0, 128, 64), (2, 1, 128, 0, 128, 32),
    (2, 0, sm90_ws.NARROW_BN, 0, 128, 256)],
    ids=["half64", "half128", "half64-split_k", "dense", "narrow-split_k", "contiguous", "masked", "narrow-masked"])
def test_sb_stage_variants_compile_without_spills(tmp_path, mode, epi_tma, bn, split, bm, sb_k):
    """sb_stage (SB_STAGE_TILES): the producer copies each tile's B-scale row into shared memory with a
    second 1-D TMA, and the consumers read every step's scale there: dense kernels keep no global load at
    all, none prefetches, and ptxas for sm_90a reports no spills."""
    ptx = _compile(tmp_path, mode, epi_tma, bn, split, bm, 0, 1, sb_k)
    assert ptx.count("cp.async.bulk.tensor.1d.shared::cta.global") + ptx.count(
        "cp.async.bulk.tensor.1d.shared::cluster.global") == 2
    assert "prefetch.global.L2" not in ptx
    if mode == 0:  # contiguous / masked modes still read row ids / masked_m
        assert "ld.global" not in ptx
    res = subprocess.run([get_ptxas(90).path, "-arch=sm_90a", "-v", str(tmp_path / "kernel.ptx"), "-o",
                          str(tmp_path / "check.cubin")], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert "0 bytes spill stores, 0 bytes spill loads" in res.stderr, res.stderr
    assert "C7514" not in res.stderr and "serializ" not in res.stderr.lower(), res.stderr


@pytest.mark.parametrize("mode,epi_tma,bn,split,bm", [
    (0, 1, sm90_ws.NARROW_BN, 0, 128), (0, 1, 64, 0, H), (0, 0, 128, 1, 128), (1, 1, 128, 0, 128),
    (2, 0, sm90_ws.WIDE_BN, 0, 128)],
    ids=["narrow-dense", "half64-dense", "dense-split_k", "contiguous", "wide-masked"])
@pytest.mark.parametrize("pdl", [0, 1, 2])
def test_pdl_variants_wait_in_every_partition(tmp_path, mode, epi_tma, bn, split, bm, pdl):
    """launch(pdl=...): a programmatic dependent (1, 2) runs griddepcontrol.wait once in each partition (the
    consumer warpgroups and the producer warp: each reads or writes global memory only after it), 2 also
    griddepcontrol.launch_dependents once (the producer, after its last load); a plain launch (0) neither.
    ptxas for sm_90a reports no spills."""
    ptx = _compile(tmp_path, mode, epi_tma, bn, split, bm, 0, "-", "-", pdl)
    partitions = (1 if bm == H else 2) + 1
    assert ptx.count("griddepcontrol.wait") == (partitions if pdl else 0)
    assert ptx.count("griddepcontrol.launch_dependents") == (1 if pdl == 2 else 0)
    res = subprocess.run([get_ptxas(90).path, "-arch=sm_90a", "-v", str(tmp_path / "kernel.ptx"), "-o",
                          str(tmp_path / "check.cubin")], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert "0 bytes spill stores, 0 bytes spill loads" in res.stderr, res.stderr
