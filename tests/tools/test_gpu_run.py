"""bench/gpu_run.sh's arguments, run against stand-in commands on PATH (nvidia-smi, python3 and ./dev log
what they were asked and do nothing): which steps run and in what order, the card guard, refusals.
The script's real commands run on the GPU machine (docs/perf.md names the calls that used it)."""

import os
import pathlib
import shutil
import stat
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _exe(path: pathlib.Path, body: str) -> None:
    path.write_text("#!/usr/bin/env bash\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


@pytest.fixture
def sandbox(tmp_path):
    """A work dir with the script, a stand-in ./dev and a bin dir of stand-ins; returns run(args, gpu)."""
    work, fake = tmp_path / "work", tmp_path / "bin"
    (work / "bench").mkdir(parents=True)
    fake.mkdir()
    shutil.copy(ROOT / "bench" / "gpu_run.sh", work / "bench" / "gpu_run.sh")
    calls = tmp_path / "calls.log"
    _exe(fake / "python3", f'echo "python3 $*" >> {calls}\n'
         '[[ "$1" == tools/build_ext.py ]] && mkdir -p rtp_fp8 && : > rtp_fp8/_C.so\nexit 0\n')
    _exe(work / "dev", f'echo "dev $*" >> {calls}\necho "1 passed"\n')
    # every other tool the script uses, from the system
    for tool in ("bash", "env", "mkdir", "stat", "tail", "grep", "head", "tar", "rm", "timeout", "gzip"):
        found = shutil.which(tool)
        if found:
            os.symlink(found, fake / tool)

    def run(args, gpu="NVIDIA H100 80GB HBM3"):
        if gpu is not None:
            _exe(fake / "nvidia-smi", f'echo "{gpu}, 580.159.04, 1980 MHz, 3201 MHz"\n')
        elif (fake / "nvidia-smi").exists():
            (fake / "nvidia-smi").unlink()
        if calls.exists():
            calls.unlink()
        proc = subprocess.run(["bash", "bench/gpu_run.sh", str(tmp_path / "out"), *args], cwd=work,
                              env={"PATH": str(fake)}, capture_output=True, text=True, timeout=60)
        logged = calls.read_text().splitlines() if calls.exists() else []
        return proc, logged

    return run


def _steps(logged):
    names = {"bench/quant.py": "quant", "bench/gemm.py": "gemm", "bench/moe.py": "moe",
             "bench/ws_tiles.py": "ws_tiles"}
    seen = []
    for line in logged:
        if line.startswith("dev gpu-test"):
            seen.append("gpu-test")
        for script, name in names.items():
            if line.startswith(f"python3 {script}"):
                seen.append(name)
    return seen


def test_default_runs_every_step_in_order(sandbox):
    proc, logged = sandbox([])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("NVIDIA H100 80GB HBM3, 580.159.04, ")  # the card's line, printed first
    assert logged[0] == "python3 tools/build_ext.py"
    assert logged[1].startswith("python3 tools/build_deepgemm.py --env-file ")
    assert _steps(logged) == ["gpu-test", "quant", "gemm", "moe", "ws_tiles"]
    dev = [x for x in logged if x.startswith("dev ")]
    assert len(dev) == 1 and dev[0].startswith("dev gpu-test ") and dev[0].endswith("/logs/gpu -q")


def test_steps_select_and_keep_the_fixed_order(sandbox):
    proc, logged = sandbox(["--steps", "gemm,gpu-test", "--archs", "sm_90a", "--workers", "4", "-k", "narrow"])
    assert proc.returncode == 0, proc.stderr
    assert logged[0] == "python3 tools/build_ext.py --archs sm_90a"
    assert _steps(logged) == ["gpu-test", "gemm"]
    dev = [x for x in logged if x.startswith("dev ")]
    assert len(dev) == 1 and dev[0].endswith(" -q -n 4 -k narrow")


def test_bare_second_argument_is_the_k_expression(sandbox):
    proc, logged = sandbox(["cluster", "--steps", "gpu-test"])
    assert proc.returncode == 0, proc.stderr
    dev = [x for x in logged if x.startswith("dev ")]
    assert len(dev) == 1 and dev[0].endswith(" -q -k cluster")
    assert _steps(logged) == ["gpu-test"]


def test_gpu_guard_refuses_another_card_before_any_build(sandbox):
    proc, logged = sandbox(["--gpu", "H200", "--steps", "gemm"])
    assert proc.returncode == 3
    assert "--gpu H200" in proc.stderr and "NVIDIA H100 80GB HBM3" in proc.stderr
    assert logged == []
    proc, logged = sandbox(["--gpu", "H200", "--steps", "gemm"], gpu="NVIDIA H200")
    assert proc.returncode == 0, proc.stderr
    assert _steps(logged) == ["gemm"]
    proc, logged = sandbox(["--gpu", "H200"], gpu=None)
    assert proc.returncode == 3 and "none found" in proc.stderr and logged == []


@pytest.mark.parametrize("args, named", [
    (["--steps", "gemm,bogus"], "unknown step 'bogus'"),
    (["--workers", "0"], "--workers: '0'"),
    (["--workers", "four"], "--workers: 'four'"),
    (["--frobnicate", "1"], "unknown argument --frobnicate"),
    (["--steps"], "--steps needs a value"),
])
def test_bad_arguments_are_named_and_nothing_runs(sandbox, args, named):
    proc, logged = sandbox(args)
    assert proc.returncode == 2
    assert named in proc.stderr and proc.stderr.startswith("bench/gpu_run.sh: ")
    assert logged == []
