"""Scratch git repositories for the tool tests: one holding what the lock tool reads (with the
moves of a tamperer: edit a lock, recompute its stamp), and a committed copy of the checkout
(what the wheel builder versions from)."""

import os
import re
import shutil
import subprocess
import sys

from tools import locktool
from tools import toolchains as tcmod

ROOT = tcmod.REPO_ROOT
LOCK = "deps/requirements_lock_cpu.txt"
GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t", "GIT_AUTHOR_DATE": "2026-01-01T00:00:00Z",
           "GIT_COMMITTER_DATE": "2026-01-01T00:00:00Z"}


def make_repo(tmp_path):
    """A git repository holding what the lock tool reads (mutations never touch the checkout)."""
    shutil.copytree(ROOT / "deps", tmp_path / "deps", ignore=shutil.ignore_patterns("BUILD.bazel", ".*"))
    (tmp_path / "rtp_fp8").mkdir()
    shutil.copy(ROOT / locktool.ACCEL_CONSTANTS, tmp_path / locktool.ACCEL_CONSTANTS)
    for p in [tmp_path, *tmp_path.rglob("*")]:
        p.chmod(p.stat().st_mode | 0o200)
    for cmd in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "base"]):
        git(tmp_path, *cmd)
    return tmp_path


def git(root, *args):
    return subprocess.run(["git", *args], cwd=root, check=True, capture_output=True, text=True,
                          env={**os.environ, **GIT_ENV}).stdout.strip()


def copy_checkout(dest):
    """The checkout's files committed into a fresh repository (same content, same dates: same commit)."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True,
                           text=True, check=True).stdout.split()
    for f in files:
        if (ROOT / f).is_file():
            (dest / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / f, dest / f)
    git(dest, "init", "-q")
    git(dest, "add", "-A")
    git(dest, "commit", "-q", "-m", "source")
    return dest


def run(root, *args, env=None):
    return subprocess.run([sys.executable, str(ROOT / "tools" / "lock_main.py"), "--root", str(root), *args],
                          capture_output=True, text=True, cwd="/", env=env)


def edit(path, old, new):
    text = path.read_text()
    assert old in text, f"{old!r} not in {path}"
    path.write_text(text.replace(old, new, 1))


def restamp(repo, name="cpu"):
    """What an attacker does after editing: recompute the stamp (a plain sha256)."""
    ls = tcmod.load(repo).lock_sets[name]
    locktool._write_stamp(ls, repo)


def first_hash(repo, pkg):
    return locktool.parse_lock((repo / LOCK).read_text())[pkg]["hashes"][0].split(":", 1)[1]


def flip(sha):
    return sha[:-1] + ("0" if sha[-1] != "0" else "1")


def fails_with(proc, message, fix):
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert message in out, out
    assert fix in out, out
    return out


def drop(repo, pkg):
    """Remove a package's whole entry from the cpu lock."""
    text = (repo / LOCK).read_text()
    new = re.sub(rf"\n{pkg}==[^\n]*\n(    [^\n]*\n)+", "\n", text, count=1)
    assert new != text
    (repo / LOCK).write_text(new)
