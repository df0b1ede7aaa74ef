"""The cpu wheel: built twice in different directories it is byte-identical, its metadata
comes from the toolchain's pins, its version changes with the source (never two different
wheels under one name), and once installed it reports its build info."""

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile

import pytest
from scratch import copy_checkout as _copy_sources
from scratch import git

from tools import toolchains as tcmod
from tools import wheel

ROOT = tcmod.REPO_ROOT


def _wheel_version(path):
    return path.name.split("-")[1]


def test_cpu_wheel_is_byte_identical_across_directories(tmp_path, monkeypatch):
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1764633600")
    a = _copy_sources(tmp_path / "one" / "src")
    b = _copy_sources(tmp_path / "two" / "elsewhere" / "src")
    wa = wheel.build("cpu", tmp_path / "out_a", a)
    wb = wheel.build("cpu", tmp_path / "out_b", b)
    sha = git(a, "rev-parse", "HEAD")
    assert sha == git(b, "rev-parse", "HEAD")
    ver = f"0.1.0.dev1+g{sha[:12]}"
    assert wa.name == wb.name == f"rtp_fp8-{ver}-py3-none-any.whl"
    assert wa.read_bytes() == wb.read_bytes()
    for w in (wa, wb):
        assert str(tmp_path).encode() not in w.read_bytes()

    dist = f"rtp_fp8-{ver}.dist-info"
    with zipfile.ZipFile(wa) as zf:
        names = zf.namelist()
        # the package first (sorted), .dist-info last, RECORD at the very end
        assert names == sorted(n for n in names if not n.startswith(dist)) + [
            f"{dist}/METADATA", f"{dist}/WHEEL", f"{dist}/RECORD"]
        infos = zf.infolist()
        assert {i.date_time for i in infos} == {(2025, 12, 2, 0, 0, 0)}
        assert {i.external_attr >> 16 for i in infos} == {0o100644}
        meta = zf.read(f"{dist}/METADATA").decode()
        info = json.loads(zf.read("rtp_fp8/_build_info.json"))
    requires = [ln.split(": ", 1)[1] for ln in meta.splitlines() if ln.startswith("Requires-Dist: ")]
    assert "torch==2.13.0+cpu" in requires and "triton==3.7.1" in requires
    assert info["requires"] == requires  # one source for both
    assert info["version"] == ver and info["source_revision"] == sha
    assert info["toolchain"] == "cpu" and info["extension"] is False and info["archs"] == []
    assert not any(n.endswith(".so") for n in names)


def test_version_changes_with_the_source(tmp_path, monkeypatch):
    """Dev versions from the commit, a digest of any difference anywhere in the tree, release
    versions from a tag; a stale __version__ after a release is refused."""
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1764633600")
    src = _copy_sources(tmp_path / "src")
    cpu = tcmod.load(src).toolchains["cpu"]
    sha = git(src, "rev-parse", "HEAD")
    clean = wheel.wheel_version(src, cpu)
    assert clean == f"0.1.0.dev1+g{sha[:12]}"

    (src / "tests" / "notes.txt").write_text("an untracked file outside rtp_fp8/\n")
    one = wheel.wheel_version(src, cpu)
    assert re.fullmatch(rf"0\.1\.0\.dev1\+g{sha[:12]}\.d[0-9a-f]{{10}}", one)
    (src / "tests" / "notes.txt").write_text("other content\n")
    two = wheel.wheel_version(src, cpu)
    assert two != one and two.startswith(clean + ".d")
    w1 = wheel.build("cpu", tmp_path / "d", src)
    assert _wheel_version(w1) == two and json.loads(
        zipfile.ZipFile(w1).read("rtp_fp8/_build_info.json"))["source_revision"] == sha + "-dirty"

    (src / "tests" / "notes.txt").unlink()
    git(src, "tag", "v0.1.0")
    assert wheel.wheel_version(src, cpu) == "0.1.0"
    assert wheel.wheel_version(src, tcmod.load(src).toolchains["cuda13_0"]) == "0.1.0+cu130"
    assert _wheel_version(wheel.build("cpu", tmp_path / "r", src)) == "0.1.0"
    (src / "README.md").write_text("edited\n")
    with pytest.raises(wheel.WheelError, match="HEAD is the release v0.1.0 but the tree differs from it"):
        wheel.wheel_version(src, cpu)
    git(src, "commit", "-q", "-am", "after the release")
    with pytest.raises(wheel.WheelError, match="still says 0.1.0, released as tag v0.1.0 1 commits ago"):
        wheel.wheel_version(src, cpu)
    git(src, "tag", "v0.2.0")
    with pytest.raises(wheel.WheelError, match="HEAD is tagged v0.2.0 but rtp_fp8/__init__.py says 0.1.0"):
        wheel.wheel_version(src, cpu)


def test_a_copy_without_git_is_refused(tmp_path):
    src = _copy_sources(tmp_path / "src")
    shutil.rmtree(src / ".git")
    with pytest.raises(wheel.WheelError, match="is not the top of a git checkout"):
        wheel.build("cpu", tmp_path / "out", src)


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc to build a stand-in shared library")
@pytest.mark.parametrize("needs,tag", [("c10", "manylinux_"), ("foo", "linux_x86_64")])
def test_extension_wheel_tag_comes_from_auditwheel(tmp_path, monkeypatch, needs, tag):
    """A stand-in _C.so linking torch's libc10.so gets auditwheel's symbol-versioning tag (torch
    provides libc10 at run time); one linking any other library gets auditwheel's overall verdict."""
    pytest.importorskip("auditwheel",
                        reason="auditwheel is not installed in this Python (every toolchain's lock has it)")
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1764633600")
    src = _copy_sources(tmp_path / "src")
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "dep.c").write_text("int dep_fn(void) { return 1; }\n")
    (lib / "ext.c").write_text("#include <math.h>\nint dep_fn(void);\nint f(double x) { return dep_fn() + "
                               "(int)sqrt(x); }\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(lib / f"lib{needs}.so"), str(lib / "dep.c")], check=True)
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(src / wheel.EXTENSION), str(lib / "ext.c"), f"-L{lib}",
                    f"-l{needs}", "-lm"], check=True)
    w = wheel.build("cuda13_0", tmp_path / "out", src)
    plat = w.name[:-4].split("-")[-1]
    assert plat.startswith(tag), w.name
    so = hashlib.sha256((src / wheel.EXTENSION).read_bytes()).hexdigest()
    assert _wheel_version(w).endswith(f".cu130.x{so[:10]}")  # the .so is not fixed by the commit


def test_installed_wheel_reports_build_info(tmp_path, monkeypatch):
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1764633600")
    w = wheel.build("cpu", tmp_path / "dist", _copy_sources(tmp_path / "src"))
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target",
                    str(target), str(w)], check=True)
    env = {**os.environ, "PYTHONPATH": str(target)}
    out = subprocess.run([sys.executable, "-c", "import json, rtp_fp8; print(json.dumps(rtp_fp8.build_info()))"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, check=True).stdout
    info = json.loads(out)
    assert info["toolchain"] == "cpu" and info["extension_loaded"] is False



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
    status.write_text(f"STABLE_RTP_FP8_VERSION_{toolchain} 0.1.0.dev7+gabc123\nSTABLE_RTP_FP8_REVISION abc123\n"
                      "STABLE_SOURCE_DATE_EPOCH 1764633600\n")
    assert wheel.main(["--emit", "build-info", "--toolchain", toolchain, "--status-file", str(status),
                       "--output", str(tmp_path / "info.json")]) == 0
    assert wheel.main(["--emit", "requires", "--toolchain", toolchain, "--output", str(tmp_path / "req.txt")]) == 0
    tc = tcmod.load(ROOT).toolchains[toolchain]
    info = json.loads((tmp_path / "info.json").read_text())
    assert info == json.loads(wheel.build_info(tc, "0.1.0.dev7+gabc123", "abc123", 1764633600,
                                               wheel.requires(tc, ROOT)))
    assert info["archs"] == list(tc.nvcc_archs) and info["extension"] is bool(tc.cuda)
    assert (tmp_path / "req.txt").read_text().splitlines() == wheel.requires(tc, ROOT)
    assert wheel.main(["--emit", "requires", "--toolchain", "nope", "--output", str(tmp_path / "x")]) == 2
