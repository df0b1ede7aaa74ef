"""The dev entry point behind ./dev: set-up and the project's commands.

    ./dev smoke [args]      main job: the smoke suite on the embedded default model
    ./dev test [pytest args] every test that runs on this machine (CPU: Triton interpreter)
    ./dev lint              ruff over the tree
    ./dev gpu-test OUTDIR   every gpu-marked test, with the machine's own python3 (no venv),
                            junit + log written to OUTDIR
    ./dev lock ...          tools/lock
    ./dev wheel --toolchain NAME [--out DIR]   byte-reproducible wheel (tools/wheel.py)

`smoke`, `test` and `lint` first make .venv from the cpu lock with
`pip install --require-hashes`; a second run reinstalls nothing.
"""

from __future__ import annotations

import hashlib
import os
import pathlib
import subprocess
import sys
import time

from tools import locktool
from tools import toolchains as tcmod

ROOT = tcmod.REPO_ROOT
VENV = ROOT / ".venv"
DEV_TOOLCHAIN = "cpu"


def _say(msg: str) -> None:
    print(f"dev: {msg}", file=sys.stderr, flush=True)


def ensure_venv(venv: pathlib.Path = VENV, toolchain: str = DEV_TOOLCHAIN) -> pathlib.Path:
    """A virtualenv at `venv` holding exactly the toolchain's lock (reused while the lock is unchanged)."""
    cfg = tcmod.load(ROOT)
    ls = cfg.toolchains[toolchain]
    lock = ROOT / ls.lock
    want = hashlib.sha256(lock.read_bytes()).hexdigest()
    stamp = venv / ".lock-sha256"
    py = venv / "bin" / "python"
    if py.exists() and stamp.exists() and stamp.read_text().strip() == want:
        return py
    t0 = time.time()
    _say(f"installing {venv.name} from {ls.lock} (toolchain {ls.name}, python {ls.python})")
    if not py.exists():
        subprocess.run([locktool._python_for(ls.python), "-m", "venv", str(venv)], check=True)
    cmd = [str(py), "-m", "pip", "install", "-q", "--require-hashes", "--no-deps", "-r", str(lock)]
    # An unreachable extra index (PyTorch's CPU index behind a closed network, with a
    # local wheel folder in pip's config instead) would cost pip's retries per project.
    if not all(locktool._reachable(u, timeout=10) for u in ls.extra_index_urls):
        cmd += ["--retries", "0"]
    if subprocess.run(cmd).returncode != 0:
        sys.exit(f"dev: pip install from {ls.lock} failed")
    stamp.write_text(want + "\n")
    _say(f"installed in {time.time() - t0:.0f}s")
    return py


def _env(cpu: bool) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    if cpu:
        env["TRITON_INTERPRET"] = "1"
    return env


def cmd_test(args: list[str]) -> int:
    py = ensure_venv()
    jobs = ["-n", "2"] if (os.cpu_count() or 1) >= 2 and "-n" not in args else []
    return subprocess.run([str(py), "-m", "pytest", *jobs, *args], cwd=ROOT, env=_env(cpu=True)).returncode


def cmd_smoke(args: list[str]) -> int:
    py = ensure_venv()
    return subprocess.run([str(py), "-m", "smoke.run", *args], cwd=ROOT, env=_env(cpu=True)).returncode


def cmd_lint(args: list[str]) -> int:
    py = ensure_venv()
    return subprocess.run([str(py), "-m", "ruff", "check", *(args or ["."])], cwd=ROOT).returncode


def cmd_gpu_test(args: list[str]) -> int:
    if not args:
        sys.exit("dev: usage: ./dev gpu-test OUTDIR [pytest args]")
    out = pathlib.Path(args[0]).resolve()
    out.mkdir(parents=True, exist_ok=True)
    env = _env(cpu=False)
    env.pop("TRITON_INTERPRET", None)
    cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "-p", "no:cacheprovider",
           f"--junitxml={out / 'gpu-junit.xml'}", "-rs", *args[1:]]
    with open(out / "gpu-test.log", "w") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for line in proc.stdout:
            sys.stdout.write(line)
            log.write(line)
        return proc.wait()


def _wheel(args: list[str]) -> int:
    from tools import wheel

    return wheel.main(args)


def main(argv: list[str]) -> int:
    cmds = {"test": cmd_test, "smoke": cmd_smoke, "lint": cmd_lint, "gpu-test": cmd_gpu_test,
            "lock": lambda a: locktool.main(a), "wheel": _wheel}
    if not argv or argv[0] not in cmds:
        print(__doc__)
        return 2
    return cmds[argv[0]](argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
