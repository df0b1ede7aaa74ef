"""The cpu wheel installed into a fresh virtualenv made from the cpu lock (pip-installs from
the index: `requires_network`)."""

import json
import os
import subprocess

import pytest
from scratch import copy_checkout

from tools import toolchains as tcmod
from tools import wheel

ROOT = tcmod.REPO_ROOT
pytestmark = pytest.mark.requires_network


def test_wheel_in_a_fresh_virtualenv_from_the_lock(tmp_path, monkeypatch):
    """The cpu wheel in a new virtualenv made from the cpu lock: its Requires-Dist are satisfied
    by the lock (pip check) and, imported outside the checkout, it reports its build info."""
    from tools import dev

    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1764633600")
    w = wheel.build("cpu", tmp_path / "dist", copy_checkout(tmp_path / "src"))
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
