"""tools/lock: the offline check passes on main, catches every kind of hand edit, and
`update` is deterministic and refuses bad input without touching a lock."""

import os
import pathlib
import shutil
import subprocess
import sys
import time

import pytest

from tools import locktool
from tools import toolchains as tcmod

ROOT = tcmod.REPO_ROOT
LOCK = "deps/requirements_lock_cpu.txt"


@pytest.fixture
def repo(tmp_path):
    """A copy of what the lock tool reads, so mutations never touch the checkout."""
    shutil.copytree(ROOT / "deps", tmp_path / "deps", ignore=shutil.ignore_patterns("BUILD.bazel", ".*"))
    (tmp_path / "rtp_fp8").mkdir()
    shutil.copy(ROOT / locktool.ACCEL_CONSTANTS, tmp_path / locktool.ACCEL_CONSTANTS)
    for p in [tmp_path, *tmp_path.rglob("*")]:  # copies of Bazel's read-only runfiles keep their modes
        p.chmod(p.stat().st_mode | 0o200)
    return tmp_path


def run(root, *args):
    return subprocess.run(
        [sys.executable, str(ROOT / "tools" / "lock_main.py"), "--root", str(root), *args],
        capture_output=True, text=True, cwd="/",
    )


def edit(path: pathlib.Path, old: str, new: str, count: int = 1):
    text = path.read_text()
    assert old in text, f"{old!r} not in {path}"
    path.write_text(text.replace(old, new, count))


def test_check_passes_on_main_quickly():
    t0 = time.monotonic()
    proc = run(ROOT, "check")
    elapsed = time.monotonic() - t0
    assert proc.returncode == 0, proc.stdout + proc.stderr
    names = tcmod.load(ROOT).lock_sets
    assert proc.stdout.count("ok   ") == len(names)
    assert elapsed < 5.0, f"offline check took {elapsed:.1f}s"


def test_every_toolchain_has_input_and_lock():
    cfg = tcmod.load(ROOT)
    assert set(cfg.toolchains) >= {"cpu", "cuda12_8", "cuda13_0"}
    for ls in cfg.lock_sets.values():
        assert (ROOT / ls.input).is_file() and (ROOT / ls.lock).is_file()


def _expect_fail(repo, *needles, fix="fix: tools/lock update cpu"):
    proc = run(repo, "check", "cpu")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    for n in needles:
        assert n in proc.stdout, proc.stdout
    assert fix in proc.stdout
    if fix == "fix: tools/lock update cpu":
        assert "bazel run //deps:cpu.update" in proc.stdout
    return proc.stdout


def test_copy_passes_before_mutation(repo):
    assert run(repo, "check").returncode == 0


def test_changed_top_level_version_fails(repo):
    edit(repo / LOCK, "\ntorch==2.13.0+cpu", "\ntorch==2.13.1+cpu")
    _expect_fail(repo, "torch==2.13.1+cpu but deps/requirements_cpu.in", "toolchains.cpu.torch = 2.13.0+cpu")


def test_changed_transitive_version_fails(repo):
    text = (repo / LOCK).read_text()
    entries = locktool.parse_lock(text)
    dep = next(e for e in entries.values() if all(not v.startswith("-r") for v in e["via"]))
    edit(repo / LOCK, f"\n{dep['name']}=={dep['version']} ", f"\n{dep['name']}=={dep['version']}.post9 ")
    _expect_fail(repo, "edited after `tools/lock update cpu` wrote it")


def test_removed_hash_fails(repo):
    text = (repo / LOCK).read_text()
    entries = locktool.parse_lock(text)
    e = entries["numpy"]
    block_start = text.index("\nnumpy==")
    block_end = text.index("    # via", block_start)
    block = text[block_start:block_end]
    (repo / LOCK).write_text(text.replace(block, f"\nnumpy=={e['version']}\n"))
    _expect_fail(repo, "numpy==2.4.6 has no --hash=sha256")


def test_rewritten_annotation_fails(repo):
    edit(repo / LOCK, "# via -r deps/requirements_base.in", "# via -r requirements_base.in")
    _expect_fail(repo, "annotation '-r requirements_base.in' is not a repo-relative input")


def test_absolute_annotation_fails(repo):
    edit(repo / LOCK, "# via -r deps/requirements_base.in", "# via -r /home/me/rtp_fp8/deps/requirements_base.in")
    _expect_fail(repo, "machine-local path or file:// URL '/home/me/rtp_fp8/deps/requirements_base.in'")


@pytest.mark.parametrize("line", ["--find-links /opt/wheels", "--extra-index-url file:///opt/pypi/simple"])
def test_added_local_path_fails(repo, line):
    edit(repo / LOCK, "--extra-index-url https://download.pytorch.org/whl/cpu",
         f"--extra-index-url https://download.pytorch.org/whl/cpu\n{line}")
    _expect_fail(repo, "machine-local path or file:// URL")


def test_unpinned_input_fails(repo):
    edit(repo / "deps/requirements_base.in", "numpy==2.4.6", "numpy>=2")
    _expect_fail(repo, "requirement 'numpy>=2' is not pinned with '=='",
                 fix="fix: pin it in deps/requirements_base.in:3 as NAME==VERSION, then tools/lock update cpu")


def test_input_changed_without_update_fails(repo):
    with open(repo / "deps/requirements_base.in", "a") as f:
        f.write("# a comment changes the inputs digest\n")
    _expect_fail(repo, "changed after the lock was generated")


def test_toolchain_pin_drift_fails(repo):
    edit(repo / "deps/toolchains.toml", 'triton = "3.7.1"', 'triton = "3.7.0"')
    _expect_fail(repo, "triton pins ['3.7.1'] but toolchains.cpu.triton = 3.7.0",
                 fix="fix: make deps/requirements_cpu.in say triton==3.7.0")


def test_accelerator_constant_drift_fails(repo):
    edit(repo / locktool.ACCEL_CONSTANTS, '"deep_gemm": "2.2.0"', '"deep_gemm": "2.1.1"')
    proc = run(repo, "check", "cpu")
    assert proc.returncode == 1
    assert "MIN_VERSIONS" in proc.stdout and "[accelerators]" in proc.stdout


# ----------------------------------------------------------------------------- bad input


def test_unknown_toolchain(repo):
    before = (repo / LOCK).read_bytes()
    for cmd in ("check", "update"):
        proc = run(repo, cmd, "cuda99")
        assert proc.returncode == 2
        assert "unknown toolchain 'cuda99'" in proc.stderr and "cpu" in proc.stderr
    assert (repo / LOCK).read_bytes() == before


def test_missing_input_file(repo):
    before = (repo / LOCK).read_bytes()
    (repo / "deps/requirements_base.in").unlink()
    proc = run(repo, "update", "cpu")
    assert proc.returncode == 2
    assert "deps/requirements_base.in: input file not found" in proc.stderr
    assert (repo / LOCK).read_bytes() == before


@pytest.mark.parametrize(
    "old,new,needle",
    [
        ('triton = "3.7.1"', 'triton = "3.7.1', "malformed TOML"),
        ('triton = "3.7.1"', "triton = 3.7", "'toolchains.cpu.triton' must be str, got float"),
        ('python = "3.11"\ncuda = ""', 'cuda = ""', "missing key 'toolchains.cpu.python'"),
        ('nvcc_archs = ["sm_90a", "sm_100a", "sm_120a"]', 'nvcc_archs = ["90a"]', "bad arch '90a'"),
        ('commit = "9af0e0d0e74f3577af1979c9b9e1ac2cad0104ee"', 'commit = "9af0e0d"',
         "'accelerators.deep_ep.commit' must be a full 40-hex commit, got '9af0e0d'"),
    ],
)
def test_malformed_toolchains_toml(repo, old, new, needle):
    edit(repo / "deps/toolchains.toml", old, new)
    proc = run(repo, "check")
    assert proc.returncode == 2
    assert "deps/toolchains.toml" in proc.stderr and needle in proc.stderr


def test_unreachable_index_rewrites_nothing(repo):
    edit(repo / "deps/toolchains.toml", 'index_url = "https://pypi.org/simple"\n# PyTorch',
         'index_url = "http://127.0.0.1:9/simple"\n# PyTorch')
    before = (repo / LOCK).read_bytes()
    stamps = (repo / "deps/lock_stamps.json").read_bytes()
    proc = run(repo, "update", "cpu")
    assert proc.returncode == 2
    assert "toolchains.cpu.index_url http://127.0.0.1:9/simple is unreachable" in proc.stderr
    assert (repo / LOCK).read_bytes() == before
    assert (repo / "deps/lock_stamps.json").read_bytes() == stamps
    assert not list((repo / "deps").glob(".*tmp*"))


def test_unreachable_extra_index_without_local_wheels(repo, monkeypatch):
    edit(repo / "deps/toolchains.toml", "https://download.pytorch.org/whl/cpu", "http://127.0.0.1:9/whl/cpu")
    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)
    before = (repo / LOCK).read_bytes()
    env = {k: v for k, v in os.environ.items() if k != "PIP_FIND_LINKS"}
    proc = subprocess.run([sys.executable, str(ROOT / "tools/lock_main.py"), "--root", str(repo), "update", "cpu"],
                          capture_output=True, text=True, env=env)
    assert proc.returncode == 2
    assert "extra_index_urls entry http://127.0.0.1:9/whl/cpu is unreachable" in proc.stderr
    assert (repo / LOCK).read_bytes() == before
