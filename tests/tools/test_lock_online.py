"""The tamper-table rows that need the package index (docs/locks.md): provenance and
completeness (`tools/lock verify`) and a real re-resolution by `update`."""

import os
import pathlib
import subprocess
import sys

import pytest
from scratch import LOCK, ROOT, drop, edit, fails_with, first_hash, flip, make_repo, restamp, run

from tools import locktool

pytestmark = pytest.mark.requires_network


@pytest.fixture
def repo(tmp_path):
    return make_repo(tmp_path)


def test_restamped_hash_is_caught_by_verify(repo):
    """Row 1b."""
    sha = first_hash(repo, "numpy")
    edit(repo / LOCK, sha, flip(sha))
    restamp(repo)
    fails_with(run(repo, "verify", "cpu"), f"--hash=sha256:{flip(sha)[:16]}... is not the digest of any file",
               f"fix: git checkout -- {LOCK}")


def test_restamped_satisfiable_pin_edit_is_caught_by_verify(repo):
    """Row 1c: a transitive pin moved to another real version, its hashes kept, restamped."""
    text = (repo / LOCK).read_text()
    (repo / LOCK).write_text(text.replace("\nsympy==1.14.0 ", "\nsympy==1.13.3 "))
    restamp(repo)
    assert run(repo, "check", "cpu").returncode == 0
    fails_with(run(repo, "verify", "cpu"), "is the digest of sympy-1.14.0", f"fix: git checkout -- {LOCK}")


def test_update_replaces_a_restamped_bad_hash_with_the_index_one(repo):
    """Row 2b: restamped, the edit gets past the refusal; pip-compile runs with --no-reuse-hashes,
    so the hash comes fresh from the index and the lock is back to what main holds."""
    committed = (repo / LOCK).read_bytes()
    sha = first_hash(repo, "numpy")
    edit(repo / LOCK, sha, flip(sha))
    restamp(repo)
    if (ROOT / locktool.TOOLS_VENV).exists():
        os.symlink(ROOT / locktool.TOOLS_VENV, repo / locktool.TOOLS_VENV)
    proc = run(repo, "update", "cpu")
    assert proc.returncode == 0, proc.stderr
    assert (repo / LOCK).read_bytes() == committed


def test_dropped_transitive_dependency_is_caught_by_verify(repo):
    """Row 4c: completeness from the wheels' Requires-Dist for Linux x86_64 CPython 3.11."""
    drop(repo, "filelock")
    restamp(repo)
    fails_with(run(repo, "verify", "cpu"), f"{LOCK}: filelock is missing: torch==2.13.0+cpu requires 'filelock'",
               f"fix: git checkout -- {LOCK}")


def _can_resolve_cpu() -> str | None:
    if not locktool._reachable("https://pypi.org/simple", timeout=10):
        return "needs network access to PyPI"
    links = locktool._find_links(None)
    has_local = any(pathlib.Path(p, "").glob("torch-2.13.0+cpu-*.whl") for p in links if os.path.isdir(p))
    if not has_local and not locktool._reachable("https://download.pytorch.org/whl/cpu", timeout=10):
        return "needs torch==2.13.0+cpu: neither PyTorch's CPU index nor a local wheel folder is reachable"
    return None


@pytest.mark.skipif(_can_resolve_cpu() is not None, reason=str(_can_resolve_cpu()))
def test_update_cpu_is_byte_identical_twice_from_any_cwd(repo):
    """`update` on an untouched lock rewrites the same bytes, from any working directory."""
    if (ROOT / locktool.TOOLS_VENV).exists():
        os.symlink(ROOT / locktool.TOOLS_VENV, repo / locktool.TOOLS_VENV)
    committed = (repo / LOCK).read_bytes()
    outs = []
    for cwd in (repo, pathlib.Path("/"), repo / "deps"):
        proc = subprocess.run([sys.executable, str(ROOT / "tools/lock_main.py"), "--root", str(repo), "update", "cpu"],
                              capture_output=True, text=True, cwd=cwd)
        assert proc.returncode == 0, proc.stderr
        outs.append((repo / LOCK).read_bytes())
    assert outs[0] == outs[1] == outs[2] == committed
    assert run(repo, "check", "cpu").returncode == 0
