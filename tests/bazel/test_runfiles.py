"""Each py_test run from the runfiles tree rules_python would make for it (tools/bazel_runfiles.py):
only its transitive srcs and data, read only, explicit __init__.py, TEST_TMPDIR for scratch. A file
missing from a target's deps or data, or a test writing into the source tree, fails here as it
would under `bazel test`. Every test target is collected from its tree; a few run whole."""

import pytest

pytest.importorskip("starlark", reason="needs starlark-pyo3 (in the cpu lock; not on this machine)")

from tools import bazel_graph as BG  # noqa: E402
from tools import bazel_runfiles as RF  # noqa: E402

ROOT = BG.tcmod.REPO_ROOT
GRAPH = BG.evaluate(ROOT)
TESTS = sorted(label for label, t in GRAPH.targets.items() if t.package == "tests" and t.kind == "py_test")


def _ok(proc):
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    return out


@pytest.mark.parametrize("label", TESTS)
def test_collects_from_its_runfiles(label):
    out = _ok(RF.run(label, collect_only=True))
    assert "error" not in out.splitlines()[-1].lower()


@pytest.mark.parametrize("label,extra", [
    ("//smoke:smoke_cpu", ["--task", "tp4_reference"]),  # writes its checkpoint under TEST_TMPDIR, not the tree
    ("//tests:tools_test_lock_tool", []),
    ("//tests:tools_test_dev_cli", []),
    ("//tests:loader_test_online_fp8", []),
])
def test_runs_from_its_runfiles(label, extra):
    _ok(RF.run(label, extra=extra))


def test_runfiles_hold_only_the_closure():
    files = RF.runfiles(GRAPH, ROOT, "//tests:loader_test_online_fp8")
    assert "tests/loader/test_online_fp8.py" in files and "rtp_fp8/loader/online_fp8.py" in files
    assert "tests/helpers.py" in files and "suites/pytest_main.py" in files
    assert not any(f.startswith(("tools/", "smoke/", "bench/")) for f in files)
    assert not any(f.endswith("__init__.py") and f.startswith("tests/") for f in files)


def test_a_missing_data_file_fails(tmp_path):
    """Mutation: the test macro without tests/helpers.py in its data -> ModuleNotFoundError in runfiles."""
    import shutil

    copy = tmp_path / "r"
    shutil.copytree(ROOT, copy, ignore=shutil.ignore_patterns(".git", ".venv", "node_modules", "__pycache__",
                                                                ".*cache*", ".accel"))
    defs = copy / "suites/defs.bzl"
    defs.chmod(0o644)
    defs.write_text(defs.read_text().replace('            "//tests:helpers.py",\n', ""))
    proc = RF.run("//tests:loader_test_online_fp8", root=copy, collect_only=True)
    assert proc.returncode != 0 and "No module named 'helpers'" in proc.stdout + proc.stderr
