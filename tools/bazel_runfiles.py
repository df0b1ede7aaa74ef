"""A py_test's runfiles tree, made the way rules_python lays it out, and the test run from it.

    python3 -m tools.bazel_runfiles //tests:loader_test_online_fp8 [--collect-only]

What `bazel test` gives a py_test (rules_python 2.3.2 with config.explicit_init_py(default = True)
in MODULE.bazel): a runfiles folder whose `_main/` holds the files of the target's transitive
srcs and data, and only those (no generated __init__.py, no other file of the checkout), read
only; the test runs with `_main` as its working directory and on sys.path (the `imports = [".."]`
of //rtp_fp8 and //tools), TEST_TMPDIR and HOME in a scratch folder, no index for pip. The
third-party packages come from the running environment (the hub's wheels). A file missing from
the tree, a test writing into it, or an import that only worked through the checkout fails here
as it would under Bazel. No Bazel is run: the tree comes from tools/bazel_graph's evaluation.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import stat
import subprocess
import sys
import tempfile

from tools import bazel_graph as BG


def runfiles(g: BG.Graph, root: pathlib.Path, label: str, toolchain: str = "cpu") -> set[str]:
    """Repo-relative files in the target's runfiles: srcs and data (files, filegroups, globs) over
    the deps/data closure, the select() branch of `toolchain` taken."""
    want = f"//deps:is_{toolchain}"
    out: set[str] = set()
    seen: set[str] = set()

    def visit(lab: str, pkg: str):
        full = BG.canonical(lab, pkg)
        if full in seen:
            return
        seen.add(full)
        t = g.targets.get(full)
        if t is None:  # a file label
            p, _, name = full[2:].partition(":")
            rel = f"{p}/{name}" if p else name
            if (root / rel).is_file():
                out.add(rel)
            return
        for key in ("srcs", "data", "deps", "main"):
            v = t.attrs.get(key)
            items = v if isinstance(v, list) else [v] if v else []
            for item in items:
                if isinstance(item, dict) and "__select__" in item:
                    branch = item["__select__"].get(want, item["__select__"].get("//conditions:default", []))
                    labs = list(branch)
                else:
                    labs = BG.item_labels(item)
                for lab in labs:
                    if isinstance(lab, str) and not lab.startswith("@"):
                        visit(lab, t.package)

    visit(label, label[2:].split(":")[0])
    return out


def materialize(files: set[str], root: pathlib.Path, dest: pathlib.Path) -> pathlib.Path:
    main = dest / "_main"
    for rel in sorted(files):
        target = main / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(root / rel, target)
    for path in sorted(main.rglob("*"), reverse=True):  # read-only, as Bazel's runfiles are
        mode = path.stat().st_mode
        path.chmod(mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
    return main


def run(label: str, root: pathlib.Path = BG.tcmod.REPO_ROOT, collect_only: bool = False,
        extra: list[str] | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    g = BG.evaluate(root)
    t = g.targets.get(label)
    if t is None or not t.kind.endswith("_test"):
        raise ValueError(f"{label} is not a test target")
    files = runfiles(g, root, label)
    scratch = pathlib.Path(tempfile.mkdtemp(prefix="runfiles-"))
    try:
        main = materialize(files, root, scratch / "runfiles")
        tmp = scratch / "tmp"
        tmp.mkdir()
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PIP_FIND_LINKS")}
        env.update(PYTHONPATH=str(main), TEST_TMPDIR=str(tmp), HOME=str(tmp), PIP_NO_INDEX="1",
                   PYTHONDONTWRITEBYTECODE="1", TRITON_INTERPRET=os.environ.get("TRITON_INTERPRET", "1"))
        args = list(t.attrs.get("args", []))
        src = next(a for a in t.attrs["srcs"] if isinstance(a, str) and not a.startswith("//suites"))
        test_file = f"{t.package}/{src}"
        if any("rootpath" in a for a in args):  # rtp_py_test: suites/pytest_main.py on its file
            cmd = [sys.executable, str(main / "suites" / "pytest_main.py"), test_file, "-q"]
        else:
            main_py = t.attrs.get("main", src)
            main_file = BG.canonical(main_py, t.package)[2:].lstrip(":").replace(":", "/")
            cmd = [sys.executable, str(main / main_file), *args]
        if collect_only:
            cmd.append("--collect-only")
        cmd += extra or []
        return subprocess.run(cmd, cwd=main, env=env, capture_output=True, text=True, timeout=timeout)
    finally:
        for path in scratch.rglob("*"):
            try:
                path.chmod(path.stat().st_mode | stat.S_IWUSR)
            except OSError:
                pass
        shutil.rmtree(scratch, ignore_errors=True)


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    proc = run(argv[0], collect_only="--collect-only" in argv)
    sys.stdout.write(proc.stdout[-4000:])
    sys.stderr.write(proc.stderr[-4000:])
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
