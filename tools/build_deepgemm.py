"""Build DeepGEMM from its pinned source archive for the running Python and torch.

    python3 tools/build_deepgemm.py [--archive PATH | --source DIR] [--out DIR] [--env-file FILE]

DeepGEMM is an optional accelerator that no package registry serves. deps/toolchains.toml
[accelerators.deep_gemm.source] pins one source archive (version, upstream commits,
sha256); this command refuses any archive whose sha256 differs, unpacks it into a folder
outside the source tree (default: $XDG_CACHE_HOME/rtp_fp8/deep_gemm/<version>-<sha12>/<py>-
torch<version>, reused while its stamp matches), runs upstream's own `develop.sh` there
(`python setup.py build` and a symlink of the extension into the package) with this Python,
checks that `import deep_gemm` gives the pinned version, and prints what a process needs to
use it:

    export PYTHONPATH=<out>/src:$PYTHONPATH        # the package, built in place
    export LD_PRELOAD=<libstdc++.so.6 of g++>      # its include parser segfaults in std::regex otherwise
    export DG_JIT_CACHE_DIR=<out>/jit-cache        # where its kernels are JIT-compiled (3-8 s each)

`--source DIR` builds an unpacked tree instead (no digest to check: the caller vouches for it;
the version it reports must still be >= the minimum). The archive is looked for, in order, at
--archive, $RTP_FP8_DEEPGEMM_ARCHIVE, <repo>/.accel/<archive>, <repo>/../shared/third_party/
deep_gemm/<archive> (<repo>: $BUILD_WORKSPACE_DIRECTORY under
`bazel run //tools:build_deepgemm`). Exit status: 0 built (or reused), 1 the build or the check failed, 2 usage
(no archive found, digest mismatch, bad path).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tarfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tools import toolchains as tcmod  # noqa: E402

ARCHIVE_ENV = "RTP_FP8_DEEPGEMM_ARCHIVE"
STAMP = "rtp_fp8_build.json"


class BuildError(Exception):
    """A refusal or failure; the message says what and how to fix it. `code` is the exit status."""

    def __init__(self, msg: str, code: int = 1):
        super().__init__(msg)
        self.code = code


def pin(root: pathlib.Path = ROOT) -> dict:
    src = tcmod.load(root).accelerators["deep_gemm"].get("source")
    if not src:
        raise BuildError(f"{tcmod.TOOLCHAINS_TOML} has no [accelerators.deep_gemm.source] pin", 2)
    return src


def candidates(src: dict, root: pathlib.Path = ROOT, explicit: str | None = None) -> list[pathlib.Path]:
    """Where the archive is looked for, first match wins."""
    if explicit:
        return [pathlib.Path(explicit)]
    out = [pathlib.Path(os.environ[ARCHIVE_ENV])] if os.environ.get(ARCHIVE_ENV) else []
    # `bazel run` starts in the runfiles; BUILD_WORKSPACE_DIRECTORY names the checkout then
    root = pathlib.Path(os.environ.get("BUILD_WORKSPACE_DIRECTORY") or root)
    shared = root.parent / "shared" / "third_party" / "deep_gemm"
    return out + [root / ".accel" / src["archive"], shared / src["archive"]]


def find_archive(src: dict, root: pathlib.Path = ROOT, explicit: str | None = None) -> pathlib.Path | None:
    return next((p for p in candidates(src, root, explicit) if p.is_file()), None)


def sha256(path: pathlib.Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def verify(archive: pathlib.Path, src: dict) -> None:
    got = sha256(archive)
    if got != src["sha256"]:
        raise BuildError(f"{archive}: sha256 {got} does not match the pin {src['sha256']} "
                         f"({tcmod.TOOLCHAINS_TOML} [accelerators.deep_gemm.source]); refusing to build it", 2)


def unpack(archive: pathlib.Path, dest: pathlib.Path) -> pathlib.Path:
    """Extract into dest (data filter: no absolute paths, no '..', no device files); the one top folder."""
    with tarfile.open(archive, "r:*") as tar:
        tops = {m.name.split("/", 1)[0] for m in tar.getmembers()}
        if len(tops) != 1:
            raise BuildError(f"{archive}: expected one top-level folder, got {sorted(tops)[:5]}", 2)
        tar.extractall(dest, filter="data")
    return dest / tops.pop()


def default_out(src: dict) -> pathlib.Path:
    import torch

    base = pathlib.Path(os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache")
    tag = f"py{sys.version_info[0]}{sys.version_info[1]}-torch{torch.__version__}"
    return base / "rtp_fp8" / "deep_gemm" / f"{src['version']}-{src['sha256'][:12]}" / tag


def libstdcxx() -> str | None:
    """The system libstdc++ (g++'s), which DeepGEMM's include parser needs preloaded."""
    gxx = shutil.which("g++")
    if not gxx:
        return None
    path = subprocess.run([gxx, "-print-file-name=libstdc++.so.6"], capture_output=True, text=True).stdout.strip()
    return path if os.path.isabs(path) and os.path.exists(path) else None


def use_env(out: pathlib.Path) -> dict[str, str]:
    """The variables a process sets to import this build."""
    env = {"PYTHONPATH": str(out / "src"), "DG_JIT_CACHE_DIR": str(out / "jit-cache")}
    lib = libstdcxx()
    if lib:
        env["LD_PRELOAD"] = lib
    return env


def apply_env(env: dict[str, str], base: dict[str, str]) -> dict[str, str]:
    """base with env's variables set; PYTHONPATH and LD_PRELOAD are prepended, not replaced."""
    merged = dict(base)
    for key, value in env.items():
        sep = os.pathsep if key == "PYTHONPATH" else " "
        merged[key] = value + (sep + base[key] if key in ("PYTHONPATH", "LD_PRELOAD") and base.get(key) else "")
    return merged


def _probe_version(out: pathlib.Path) -> str:
    env = apply_env(use_env(out), {k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    (out / "jit-cache").mkdir(parents=True, exist_ok=True)
    proc = subprocess.run([sys.executable, "-c", "import deep_gemm; print(deep_gemm.__version__)"],
                          env=env, capture_output=True, text=True, cwd=out)
    if proc.returncode != 0:
        raise BuildError(f"import deep_gemm from {out / 'src'} failed (exit {proc.returncode}):\n"
                         + (proc.stdout + proc.stderr)[-2000:])
    return proc.stdout.strip().splitlines()[-1]


def build(archive: pathlib.Path | None, source: pathlib.Path | None, out: pathlib.Path, src: dict,
          log=sys.stderr) -> dict[str, str]:
    """Build (or reuse) DeepGEMM in out; returns the environment to use it."""
    from rtp_fp8 import accel
    from rtp_fp8.gemm.deepgemm import parse_version

    out = out.resolve()
    if out == ROOT or ROOT in out.parents:
        raise BuildError(f"--out {out} is inside the source tree {ROOT}; build outside it", 2)
    if archive is not None:
        verify(archive, src)
        identity = {"archive_sha256": src["sha256"]}
    else:
        identity = {"source": str(source.resolve())}
    import torch

    identity.update(python=sys.version.split()[0], torch=torch.__version__, cuda=str(torch.version.cuda))
    stamp = out / STAMP
    if stamp.exists() and json.loads(stamp.read_text()).get("identity") == identity and (out / "src").exists():
        print(f"build_deepgemm: reusing {out}", file=log)
    else:
        if out.exists():
            shutil.rmtree(out)
        out.mkdir(parents=True)
        if archive is not None:
            tree = unpack(archive, out)
            tree.rename(out / "src")
        else:
            shutil.copytree(source, out / "src", symlinks=True)
        # develop.sh calls `python`: give it this interpreter (the one whose torch the build must match).
        # A script, not a symlink: a symlinked venv interpreter would lose its venv (pyvenv.cfg).
        shim = out / "bin"
        shim.mkdir()
        (shim / "python").write_text(f"#!/bin/sh\nexec {sys.executable} \"$@\"\n")
        (shim / "python").chmod(0o755)
        env = dict(os.environ, PATH=f"{shim}{os.pathsep}{os.environ.get('PATH', '')}")
        with open(out / "build.log", "w") as f:
            proc = subprocess.run(["bash", "develop.sh"], cwd=out / "src", env=env, stdout=f, stderr=subprocess.STDOUT)
        if proc.returncode != 0:
            tail = (out / "build.log").read_text(errors="replace")[-3000:]
            raise BuildError(f"DeepGEMM build failed (exit {proc.returncode}); log {out / 'build.log'}:\n{tail}")
        stamp.write_text(json.dumps({"identity": identity}, indent=1) + "\n")
    version = _probe_version(out)
    if archive is not None and parse_version(version) != parse_version(src["version"]):
        raise BuildError(f"built deep_gemm reports {version}, the pin says {src['version']}")
    if parse_version(version) < parse_version(accel.MIN_VERSIONS["deep_gemm"]):
        raise BuildError(f"built deep_gemm {version} is older than the minimum {accel.MIN_VERSIONS['deep_gemm']}")
    print(f"build_deepgemm: deep_gemm {version} ready in {out}", file=log)
    return use_env(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="build_deepgemm", description=__doc__.split("\n\n")[0])
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--archive", help="the pinned source archive (sha256 checked)")
    g.add_argument("--source", help="an unpacked DeepGEMM tree (no digest check)")
    ap.add_argument("--out", help="build folder, outside the source tree (default: a cache folder)")
    ap.add_argument("--env-file", help="also write the exports to this file (sourceable)")
    try:
        args = ap.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    try:
        src = pin()
        archive = source = None
        if args.source:
            source = pathlib.Path(args.source)
            if not (source / "develop.sh").is_file():
                raise BuildError(f"--source {source}: no develop.sh there (not a DeepGEMM tree)", 2)
        else:
            archive = find_archive(src, explicit=args.archive)
            if archive is None:
                where = ", ".join(str(p) for p in candidates(src, explicit=args.archive))
                raise BuildError(f"no DeepGEMM source archive {src['archive']} found (looked at: {where}); "
                                 f"pass --archive PATH or set {ARCHIVE_ENV}", 2)
        out = pathlib.Path(args.out) if args.out else default_out(src)
        env = build(archive, source, out, src)
    except BuildError as exc:
        print(f"build_deepgemm: {exc}", file=sys.stderr)
        return exc.code
    exports = "".join(f"export {k}={v}{(':$' + k) if k == 'PYTHONPATH' else ''}\n" for k, v in env.items())
    if args.env_file:
        pathlib.Path(args.env_file).write_text(exports)
    print(exports, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
