"""The dev entry point behind ./dev: set-up and the project's commands.

    ./dev smoke [args]      main job: the smoke suite on the embedded default model
    ./dev test [pytest args] every test that runs on this machine (CPU: Triton interpreter)
    ./dev lint              ruff over the tree
    ./dev gpu-test OUTDIR [--deepgemm-archive PATH | --no-deepgemm] [pytest args]
                            every gpu-marked test, with the machine's own python3 (no venv),
                            junit + log written to OUTDIR; DeepGEMM is first built from its
                            pinned archive when one is at hand (tools/build_deepgemm.py), so
                            its tests run against the real library
    ./dev lock ...          tools/lock
    ./dev wheel --toolchain NAME [--out DIR]   byte-reproducible wheel (tools/wheel.py)

`smoke`, `test` and `lint` first make .venv from the cpu lock with
`pip install --require-hashes --only-binary=:all:` (Linux x86_64 only, as the lock); a second run reinstalls nothing.
"""

from __future__ import annotations

import hashlib
import os
import pathlib
import platform
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
    if not lock.is_file():
        sys.exit(f"dev: the {toolchain} lock {ls.lock} is missing: restore it (git checkout -- {ls.lock}) or "
                 f"regenerate it (tools/lock update {toolchain})")
    here = f"{platform.system()} {platform.machine()}"
    if here != locktool.PLATFORM or platform.python_implementation() != "CPython":
        sys.exit(f"dev: {ls.lock} is a {locktool.PLATFORM} CPython {ls.python} resolution (its header says so) and "
                 f"this is {here} {platform.python_implementation()}: its wheels would not install here")
    want = hashlib.sha256(lock.read_bytes()).hexdigest()
    stamp = venv / ".lock-sha256"
    py = venv / "bin" / "python"
    if py.exists() and stamp.exists() and stamp.read_text().strip() == want:
        return py
    t0 = time.time()
    _say(f"installing {venv.name} from {ls.lock} (toolchain {ls.name}, python {ls.python})")
    if not py.exists():
        subprocess.run([locktool._python_for(ls.python), "-m", "venv", str(venv)], check=True)
    # Wheels only: an sdist would be built with build dependencies no lock hashes. Dependencies
    # are resolved (no --no-deps): in hash-checking mode pip then refuses a dependency the lock lacks.
    cmd = [str(py), "-m", "pip", "install", "-q", "--require-hashes", "--only-binary=:all:", "-r", str(lock)]
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
    """Offline by default (what `bazel test //... --config=cpu` runs: network tests are manual
    there); `./dev test -m requires_network` runs the network tests (CI does, as its own stage)."""
    py = ensure_venv()
    jobs = ["-n", "2"] if (os.cpu_count() or 1) >= 2 and "-n" not in args else []
    select = [] if any(a == "-m" or a.startswith("-m") and len(a) > 2 for a in args) else ["-m",
                                                                                           "not requires_network"]
    return subprocess.run([str(py), "-m", "pytest", *jobs, *select, *args], cwd=ROOT,
                          env=_env(cpu=True)).returncode


def cmd_smoke(args: list[str]) -> int:
    py = ensure_venv()
    return subprocess.run([str(py), "-m", "smoke.run", *args], cwd=ROOT, env=_env(cpu=True)).returncode


def cmd_lint(args: list[str]) -> int:
    py = ensure_venv()
    return subprocess.run([str(py), "-m", "ruff", "check", *(args or ["."])], cwd=ROOT).returncode


EXPECT_DEEPGEMM_ENV = "RTP_FP8_EXPECT_DEEPGEMM"


def _deepgemm_env(archive: str | None, log) -> dict[str, str]:
    """Build DeepGEMM from the pinned archive when one is at hand; the variables to use it, or {}."""
    from tools import build_deepgemm as bd

    try:
        src = bd.pin()
        path = bd.find_archive(src, explicit=archive)
        if path is None:
            where = ", ".join(str(p) for p in bd.candidates(src, explicit=archive))
            log(f"deepgemm: no source archive (looked at: {where}); its real-library tests skip")
            return {}
        t0 = time.time()
        env = bd.build(path, None, bd.default_out(src), src)
    except bd.BuildError as exc:
        if exc.code == 2:  # a refused archive is an error of the caller, not a reason to skip
            raise SystemExit(f"dev: {exc}") from None
        log(f"deepgemm: build failed, its real-library tests skip: {exc}")
        return {}
    log(f"deepgemm: {src['version']} from {path.name} ready in {time.time() - t0:.0f}s")
    return {**env, EXPECT_DEEPGEMM_ENV: src["version"]}


def cmd_gpu_test(args: list[str]) -> int:
    """./dev gpu-test OUTDIR [--deepgemm-archive PATH | --no-deepgemm] [pytest args]"""
    if not args or args[0].startswith("-"):
        _say("usage: ./dev gpu-test OUTDIR [--deepgemm-archive PATH | --no-deepgemm] [pytest args]")
        return 2
    out = pathlib.Path(args[0]).resolve()
    rest, archive, want_dg = list(args[1:]), None, True
    if "--no-deepgemm" in rest:
        rest.remove("--no-deepgemm")
        want_dg = False
    if "--deepgemm-archive" in rest:
        i = rest.index("--deepgemm-archive")
        if i + 1 >= len(rest):
            _say("--deepgemm-archive needs a PATH")
            return 2
        archive = rest[i + 1]
        del rest[i:i + 2]
    out.mkdir(parents=True, exist_ok=True)
    env = _env(cpu=False)
    env.pop("TRITON_INTERPRET", None)
    with open(out / "gpu-test.log", "w") as log:
        def say(msg):
            _say(msg)
            log.write(f"dev: {msg}\n")

        if want_dg:
            from tools import build_deepgemm as bd

            env = bd.apply_env(_deepgemm_env(archive, say), env)
        cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "-p", "no:cacheprovider",
               f"--junitxml={out / 'gpu-junit.xml'}", "-rs", *rest]
        log.flush()
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
        if argv:
            _say(f"unknown command {argv[0]!r}; the commands are {', '.join(sorted(cmds))}")
        return 2
    return cmds[argv[0]](argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
