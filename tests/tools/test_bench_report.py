"""bench/report.py: a missing file is refused by name (exit 2, no traceback); a gemm run whose rows
timed DeepGEMM with set_pdl too shows both DeepGEMM times and says the ratio is to the faster,
and a run without them says nothing of it; a run without memory-bound rows renders (it raised before)."""

import json
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
ENV = {"gpu": "NVIDIA H200", "arch": "sm90", "torch": "2.11.0+cu130", "cuda": "13.0", "triton": "3.6.0",
       "driver": "580", "python": "3.12.3", "deep_gemm": "2.6.1", "rotated": True}


def _row(kind, shape, kernel, us, dg_us, dg_pdl_us=None):
    m, n, k = shape
    tflops = 2 * m * n * k / (us * 1e-6) / 1e12
    r = {"kind": kind, "shape": list(shape), "ms": us / 1e3, "tflops": tflops, "eager_ms": 0.02, "kernel": kernel,
         "operand_sets": 8, "ratio": tflops / 1300, "dg_tflops": 2 * m * n * k / (dg_us * 1e-6) / 1e12, "same": "bit"}
    if dg_pdl_us is not None:
        r["dg_pdl_tflops"] = 2 * m * n * k / (dg_pdl_us * 1e-6) / 1e12
    r["ours_over_dg"] = tflops / max(r["dg_tflops"], r.get("dg_pdl_tflops", 0.0))
    return r


def _report(*args):
    return subprocess.run([sys.executable, str(ROOT / "bench" / "report.py"), *args], capture_output=True,
                          text=True, cwd=ROOT)


def test_a_missing_file_is_refused_by_name():
    r = _report("nope.json")
    assert r.returncode == 2 and "no such file: nope.json" in r.stderr and "Traceback" not in r.stderr
    r = _report()
    assert r.returncode == 2 and "run.json" in r.stderr and "Traceback" not in r.stderr


def test_deepgemm_with_pdl_is_shown_and_the_ratio_named(tmp_path):
    rows = [_row("dense", (4096, 7168, 2048), "cluster 2x128x256", 110.0, 108.0),
            _row("dense", (1, 7168, 2048), "swap 16x64/1", 6.0, 8.0, 6.4)]
    run = tmp_path / "run.json"
    run.write_text(json.dumps({"env": ENV, "cublaslt_fp8_tflops": 1300.0, "copy_gbs": 4200.0, "results": rows[:1]}))
    plain = _report(str(run))
    assert plain.returncode == 0 and "set_pdl" not in plain.stdout, plain.stderr
    run.write_text(json.dumps({"env": ENV, "cublaslt_fp8_tflops": 1300.0, "copy_gbs": 4200.0, "results": rows}))
    out = _report(str(run))
    assert out.returncode == 0 and "deep_gemm.set_pdl" in out.stdout, out.stderr
    line = next(ln for ln in out.stdout.splitlines() if "(1, 7168, 2048)" in ln)
    dg, pdl = rows[1]["dg_tflops"], rows[1]["dg_pdl_tflops"]
    assert f"| {dg:.0f} / {pdl:.0f} pdl | {6.4 / 6.0:.2f} |" in line  # to the faster launch, not the plain one
