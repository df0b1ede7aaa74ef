"""tools/build_ext.py's guard on ptxas serializing wgmmas: the notes it reads, the build failing with the
kernel named (a real ptxas on a kernel that reads its accumulators while its wgmma is in flight, where
nvcc is installed), --allow-serialized-wgmma, and the CLI's one-line errors."""

import shutil
import subprocess

import pytest

from tools import build_ext

# What ptxas (CUDA 13.0) printed for such a kernel, k(float*, unsigned long, unsigned long, int).
NOTES = """ptxas info    : (C7517) warpgroup.wait is injected in around line 100 by compiler to allow use of \
registers defined by GMMA in function '_Z1kPfmmi'
ptxas info    : (C7514) Potential Performance Loss: wgmma.mma_async instructions are serialized due to non \
wgmma instructions reading accumulator registers of  a wgmma between start and end of the pipeline stage in \
the function '_Z1kPfmmi'
"""

# Reads d while the wgmma that writes it is in flight: ptxas must wait, so it serializes.
SERIALIZING = r"""
#include <cstdint>
__global__ void k(float* out, uint64_t da, uint64_t db, int n) {
  float d[16];
  for (int i = 0; i < 16; ++i) d[i] = out[i];
  for (int j = 0; j < n; ++j) {
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n32k32.f32.e4m3.e4m3 "
                 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, %16, %17, p, 1, 1;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
                   "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
                   "+f"(d[14]), "+f"(d[15])
                 : "l"(da), "l"(db));
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
    out[j] = d[j % 16];
    asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
  }
  for (int i = 0; i < 16; ++i) out[i] += d[i];
}
"""


def test_notes_name_each_serialized_kernel_once():
    assert build_ext.serialized_wgmma(NOTES) == ["_Z1kPfmmi"]
    clean = "ptxas info    : Used 215 registers, used 2 barriers\nptxas info    : Compiling entry function 'x'\n"
    assert build_ext.serialized_wgmma(clean) == []
    two = NOTES + NOTES.replace("_Z1kPfmmi", "_Z1jv")
    assert build_ext.serialized_wgmma(two) == ["_Z1kPfmmi", "_Z1jv"]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc (CUDA toolkit) to run ptxas")
def test_a_serializing_kernel_fails_the_compile_unless_allowed(tmp_path, capsys):
    (tmp_path / "k.cu").write_text(SERIALIZING)
    cmd = [build_ext.nvcc(), "-arch=sm_90a", "-cubin", "k.cu", "-o", "k.cubin"]
    with pytest.raises(build_ext.SerializedWgmma, match=r"1 kernel\(s\): _Z1kPfmmi .*--allow-serialized-wgmma"):
        build_ext._nvcc(cmd, tmp_path, allow_serialized=False)
    assert "(C7514)" in capsys.readouterr().err  # ptxas's own notes are passed through
    build_ext._nvcc(cmd, tmp_path, allow_serialized=True)
    assert (tmp_path / "k.cubin").stat().st_size > 0


def test_cli_reports_serialization_and_compile_errors_in_one_line(monkeypatch, capsys):
    def serialized(*_):
        raise build_ext.SerializedWgmma("ptxas serialized the wgmmas of 1 kernel(s): _Z1kPfmmi")

    monkeypatch.setattr(build_ext, "build", serialized)
    assert build_ext.main(["--archs", "sm_90a"]) == 1
    assert capsys.readouterr().err == "build_ext: ptxas serialized the wgmmas of 1 kernel(s): _Z1kPfmmi\n"

    def failed(*_):
        raise subprocess.CalledProcessError(2, ["nvcc", "-c", "x.cu"])

    monkeypatch.setattr(build_ext, "build", failed)
    assert build_ext.main(["--archs", "sm_90a"]) == 1
    assert capsys.readouterr().err == "build_ext: nvcc exited with 2 (its output above)\n"

    seen = []
    monkeypatch.setattr(build_ext, "build", lambda archs, out, jobs, allow: seen.append(allow) or [])
    assert build_ext.main(["--archs", "sm_90a", "--allow-serialized-wgmma"]) == 0
    assert seen == [True]
