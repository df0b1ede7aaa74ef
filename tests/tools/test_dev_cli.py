"""The ./dev entry point and the wheel CLI on bad input: one line naming the problem, exit 2, no traceback."""

import subprocess
import sys

from tools import dev, wheel


def test_unknown_subcommand_is_named(capsys):
    assert dev.main(["nope"]) == 2
    captured = capsys.readouterr()
    assert "unknown command 'nope'; the commands are gpu-test, lint, lock, smoke, test, wheel" in captured.err


def test_gpu_test_usage():
    assert dev.cmd_gpu_test([]) == 2
    assert dev.cmd_gpu_test(["--no-deepgemm"]) == 2


def test_wheel_out_that_cannot_be_made(capsys, monkeypatch):
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")  # hermetic: no git history needed (Bazel runfiles)
    assert wheel.main(["--toolchain", "cpu", "--out", "/dev/null/x"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("wheel: error: ") and "/dev/null" in err and "Traceback" not in err
    assert err.count("\n") == 1


def test_dev_script_prints_no_traceback():
    proc = subprocess.run([sys.executable, "-m", "tools.dev", "bogus"], capture_output=True, text=True)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and "unknown command 'bogus'" in proc.stderr


def test_missing_lock_is_one_line(tmp_path, monkeypatch):
    """A missing lock: one line naming it and both remedies, not a traceback (issue #26, item 4)."""
    import pytest

    cfg = dev.tcmod.load(dev.ROOT)
    monkeypatch.setattr(dev, "ROOT", tmp_path)
    monkeypatch.setattr(dev.tcmod, "load", lambda root: cfg)
    with pytest.raises(SystemExit, match="dev: the cpu lock deps/requirements_lock_cpu.txt is missing: restore it"):
        dev.ensure_venv(tmp_path / "venv")
