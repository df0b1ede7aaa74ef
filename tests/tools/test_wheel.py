"""The cpu wheel: built twice in different directories it is byte-identical, its metadata
comes from the toolchain's pins, and once installed it reports its build info."""

import json
import os
import shutil
import subprocess
import sys
import zipfile

import pytest

from tools import toolchains as tcmod
from tools import wheel

ROOT = tcmod.REPO_ROOT


def _copy_sources(dest):
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True,
                           text=True, check=True).stdout.split()
    for f in files:
        if (ROOT / f).is_file():
            (dest / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / f, dest / f)
    return dest


def test_cpu_wheel_is_byte_identical_across_directories(tmp_path, monkeypatch):
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1764633600")
    a = _copy_sources(tmp_path / "one" / "src")
    b = _copy_sources(tmp_path / "two" / "elsewhere" / "src")
    wa = wheel.build("cpu", tmp_path / "out_a", a)
    wb = wheel.build("cpu", tmp_path / "out_b", b)
    assert wa.name == wb.name == "rtp_fp8-0.1.0-py3-none-any.whl"
    assert wa.read_bytes() == wb.read_bytes()
    for w in (wa, wb):
        assert str(tmp_path).encode() not in w.read_bytes()

    with zipfile.ZipFile(wa) as zf:
        names = zf.namelist()
        assert names == sorted(names[:-1]) + ["rtp_fp8-0.1.0.dist-info/RECORD"]
        infos = zf.infolist()
        assert {i.date_time for i in infos} == {(2025, 12, 2, 0, 0, 0)}
        assert {i.external_attr >> 16 for i in infos} == {0o100644}
        meta = zf.read("rtp_fp8-0.1.0.dist-info/METADATA").decode()
        info = json.loads(zf.read("rtp_fp8/_build_info.json"))
    assert "Requires-Dist: torch==2.13.0+cpu" in meta and "Requires-Dist: triton==3.7.1" in meta
    assert info["toolchain"] == "cpu" and info["extension"] is False and info["archs"] == []
    assert not any(n.endswith(".so") for n in names)


def test_installed_wheel_reports_build_info(tmp_path, monkeypatch):
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1764633600")
    w = wheel.build("cpu", tmp_path / "dist", ROOT)
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target",
                    str(target), str(w)], check=True)
    env = {**os.environ, "PYTHONPATH": str(target)}
    out = subprocess.run([sys.executable, "-c", "import json, rtp_fp8; print(json.dumps(rtp_fp8.build_info()))"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, check=True).stdout
    info = json.loads(out)
    assert info["toolchain"] == "cpu" and info["extension_loaded"] is False


@pytest.mark.requires_network
def test_wheel_in_a_fresh_virtualenv_from_the_lock(tmp_path, monkeypatch):
    """The cpu wheel in a new virtualenv made from the cpu lock: its Requires-Dist are satisfied
    by the lock (pip check) and, imported outside the checkout, it reports its build info."""
    from tools import dev

    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1764633600")
    w = wheel.build("cpu", tmp_path / "dist", ROOT)
    py = dev.ensure_venv(tmp_path / "venv", "cpu")
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(w)], check=True)
    check = subprocess.run([str(py), "-m", "pip", "check"], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TRITON_INTERPRET")}
    out = subprocess.run([str(py), "-c", "import json, rtp_fp8; print(json.dumps(rtp_fp8.build_info())); "
                          "print(rtp_fp8.__file__)"], cwd=tmp_path, env=env, capture_output=True, text=True,
                         check=True).stdout.splitlines()
    info = json.loads(out[0])
    assert info["toolchain"] == "cpu" and info["torch"] == "2.13.0+cpu" and info["extension_loaded"] is False
    assert out[1].startswith(str(tmp_path / "venv"))


def test_bad_toolchain_and_missing_extension(tmp_path, monkeypatch):
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1764633600")
    with pytest.raises(wheel.WheelError, match="unknown toolchain 'cuda99'"):
        wheel.build("cuda99", tmp_path, ROOT)
    src = _copy_sources(tmp_path / "src")
    (src / wheel.EXTENSION).unlink(missing_ok=True)
    with pytest.raises(wheel.WheelError, match="rtp_fp8/_C.so missing"):
        wheel.build("cuda13_0", tmp_path / "out", src)


@pytest.mark.parametrize("toolchain", ["cpu", "cuda13_0"])
def test_bazel_wheel_inputs_match_the_cli_wheel(tmp_path, toolchain):
    """//:wheel's genrules run `tools/wheel.py --emit`: same Requires-Dist and build info."""
    status = tmp_path / "stable-status.txt"
    status.write_text("STABLE_RTP_FP8_REVISION abc123\nSTABLE_SOURCE_DATE_EPOCH 1764633600\n")
    assert wheel.main(["--emit", "build-info", "--toolchain", toolchain, "--status-file", str(status),
                       "--output", str(tmp_path / "info.json")]) == 0
    assert wheel.main(["--emit", "requires", "--toolchain", toolchain, "--output", str(tmp_path / "req.txt")]) == 0
    tc = tcmod.load(ROOT).toolchains[toolchain]
    info = json.loads((tmp_path / "info.json").read_text())
    assert info == json.loads(wheel.build_info(tc, wheel.version(ROOT), "abc123", 1764633600))
    assert info["archs"] == list(tc.nvcc_archs) and info["extension"] is bool(tc.cuda)
    assert (tmp_path / "req.txt").read_text().splitlines() == wheel.requires(tc, ROOT)
    assert wheel.main(["--emit", "requires", "--toolchain", "nope", "--output", str(tmp_path / "x")]) == 2
