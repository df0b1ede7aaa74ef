"""Byte-reproducible wheel of rtp_fp8 for one toolchain.

    ./dev wheel --toolchain cpu [--out dist]        # pure Python: py3-none-any
    ./dev wheel --toolchain cuda13_0 [--out dist]   # with rtp_fp8/_C.so (build it first with
                                                    # that toolchain's torch: tools/build_ext.py)

Reproducible: every timestamp is SOURCE_DATE_EPOCH (default: the last commit's time),
entries are sorted, permissions fixed (0644, 0755 for the extension), no absolute path is
written (build_ext maps the source root to '.'), RECORD is derived from the bytes.
Metadata: version from rtp_fp8/__init__.py; Requires-Dist = the toolchain's runtime pins
(torch, triton, numpy, safetensors) from deps/toolchains.toml and its .in files; a
rtp_fp8/_build_info.json records toolchain, torch, CUDA, archs and source revision.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import io
import json
import os
import pathlib
import re
import subprocess
import sys
import zipfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tools import locktool  # noqa: E402
from tools import toolchains as tcmod  # noqa: E402

RUNTIME = ("torch", "triton", "numpy", "safetensors")
EXTENSION = "rtp_fp8/_C.so"


class WheelError(Exception):
    pass


def version(root: pathlib.Path) -> str:
    m = re.search(r'^__version__ = "([^"]+)"$', (root / "rtp_fp8/__init__.py").read_text(), re.M)
    if not m:
        raise WheelError("rtp_fp8/__init__.py: no __version__")
    return m.group(1)


def source_revision(root: pathlib.Path) -> str:
    try:
        rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True,
                             check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "rtp_fp8", "csrc"], cwd=root,
                               capture_output=True, text=True).stdout.strip()
        return rev + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def source_date_epoch(root: pathlib.Path) -> int:
    env = os.environ.get("SOURCE_DATE_EPOCH")
    if env:
        return int(env)
    try:
        return int(subprocess.run(["git", "log", "-1", "--format=%ct"], cwd=root, capture_output=True, text=True,
                                  check=True).stdout.strip())
    except (OSError, subprocess.CalledProcessError, ValueError):
        raise WheelError("set SOURCE_DATE_EPOCH (no git history to take the last commit's time from)") from None


def requires(tc: tcmod.LockSet, root: pathlib.Path) -> list[str]:
    pins = {name: v for name, v, _, _ in locktool.parse_in(tc.input, root) if v}
    out = []
    for name in RUNTIME:
        if name not in pins:
            raise WheelError(f"{tc.input}: no == pin for runtime dependency {name}")
        out.append(f"{name}=={pins[name]}")
    return out


def _files(root: pathlib.Path, with_ext: bool) -> list[tuple[str, bytes, int]]:
    files = []
    paths = list((root / "rtp_fp8").rglob("*.py")) + list((root / "rtp_fp8").rglob("*.json"))
    for path in sorted(paths):
        rel = path.relative_to(root).as_posix()
        if "__pycache__" in rel or rel == "rtp_fp8/_build_info.json":  # package data; build info is generated
            continue
        files.append((rel, path.read_bytes(), 0o644))
    if with_ext:
        so = root / EXTENSION
        if not so.exists():
            raise WheelError(f"{EXTENSION} missing: build it with this toolchain's torch (tools/build_ext.py)")
        data = so.read_bytes()
        if str(root).encode() in data:
            raise WheelError(f"{EXTENSION} contains the absolute source path {root}")
        files.append((EXTENSION, data, 0o755))
    return files


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _toolchain(name: str, root: pathlib.Path) -> tcmod.LockSet:
    cfg = tcmod.load(root)
    if name not in cfg.toolchains:
        raise WheelError(f"unknown toolchain {name!r}: deps/toolchains.toml defines {', '.join(cfg.toolchains)}")
    return cfg.toolchains[name]


def build_info(tc: tcmod.LockSet, ver: str, revision: str, epoch: int) -> bytes:
    """rtp_fp8/_build_info.json (what `rtp_fp8.build_info()` reports once installed)."""
    with_ext = bool(tc.cuda)
    info = {"toolchain": tc.name, "version": ver, "torch": tc.torch, "triton": tc.triton,
            "cuda": tc.cuda or None, "archs": list(tc.nvcc_archs) if with_ext else [],
            "extension": with_ext, "source_revision": revision, "source_date_epoch": epoch}
    return (json.dumps(info, indent=2, sort_keys=True) + "\n").encode()


def _status(path: pathlib.Path) -> dict[str, str]:
    """Bazel's stable-status.txt (KEY VALUE lines; tools/workspace_status.sh)."""
    out = {}
    for line in path.read_text().splitlines():
        key, _, value = line.partition(" ")
        out[key] = value
    return out


def emit(what: str, toolchain: str, output: pathlib.Path, root: pathlib.Path, status: pathlib.Path | None) -> None:
    """One wheel input for the Bazel wheel (//:wheel): the build info or the Requires-Dist lines."""
    tc = _toolchain(toolchain, root)
    if what == "requires":
        data = "".join(r + "\n" for r in requires(tc, root)).encode()
    else:
        st = _status(status) if status else {}
        epoch = int(st.get("STABLE_SOURCE_DATE_EPOCH") or source_date_epoch(root))
        data = build_info(tc, version(root), st.get("STABLE_RTP_FP8_REVISION") or source_revision(root), epoch)
    output.write_bytes(data)


def build(toolchain: str, out_dir: pathlib.Path, root: pathlib.Path = ROOT) -> pathlib.Path:
    tc = _toolchain(toolchain, root)
    with_ext = bool(tc.cuda)
    ver = version(root)
    py = "cp" + tc.python.replace(".", "")
    tag = f"{py}-{py}-manylinux_2_28_x86_64" if with_ext else "py3-none-any"
    name = f"rtp_fp8-{ver}-{tag}.whl"
    epoch = max(source_date_epoch(root), 315532800)  # zip cannot store dates before 1980
    import time

    stamp = time.gmtime(epoch)[:6]
    dist = f"rtp_fp8-{ver}.dist-info"

    files = _files(root, with_ext)
    files.append(("rtp_fp8/_build_info.json", build_info(tc, ver, source_revision(root), epoch), 0o644))
    meta = [
        "Metadata-Version: 2.1", "Name: rtp_fp8", f"Version: {ver}",
        "Summary: FP8 inference kernels for Hopper and Blackwell: quantization, GEMM, MoE EP",
        f"Requires-Python: >={tc.python}",
    ] + [f"Requires-Dist: {r}" for r in requires(tc, root)]
    files.append((f"{dist}/METADATA", ("\n".join(meta) + "\n").encode(), 0o644))
    wheel_meta = ["Wheel-Version: 1.0", "Generator: rtp_fp8 tools/wheel.py",
                  f"Root-Is-Purelib: {'false' if with_ext else 'true'}", f"Tag: {tag}"]
    files.append((f"{dist}/WHEEL", ("\n".join(wheel_meta) + "\n").encode(), 0o644))
    files.sort(key=lambda f: f[0])
    record = "".join(f"{p},{_record_hash(d)},{len(d)}\n" for p, d, _ in files) + f"{dist}/RECORD,,\n"
    files.append((f"{dist}/RECORD", record.encode(), 0o644))

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for path, data, mode in files:
            info = zipfile.ZipInfo(path, date_time=stamp)
            info.external_attr = (0o100000 | mode) << 16
            info.create_system = 3
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, data, compresslevel=9)
    out_dir.mkdir(parents=True, exist_ok=True)
    dest = out_dir / name
    tmp = dest.with_suffix(".whl.tmp")
    tmp.write_bytes(buf.getvalue())
    os.replace(tmp, dest)
    return dest


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="./dev wheel", description=__doc__.split("\n\n")[0])
    ap.add_argument("--toolchain", default="cpu")
    ap.add_argument("--out", default="dist", type=pathlib.Path)
    ap.add_argument("--emit", choices=["build-info", "requires"],
                    help="write only this wheel input to --output (the Bazel wheel's genrules)")
    ap.add_argument("--output", type=pathlib.Path, help="with --emit: the file to write")
    ap.add_argument("--status-file", type=pathlib.Path, help="with --emit build-info: Bazel's stable-status.txt")
    ap.add_argument("--root", type=pathlib.Path, default=ROOT, help="source root (default: this checkout)")
    a = ap.parse_args(argv)
    try:
        if a.emit:
            if a.output is None:
                raise WheelError("--emit needs --output")
            emit(a.emit, a.toolchain, a.output, a.root, a.status_file)
            return 0
        path = build(a.toolchain, a.out if a.out.is_absolute() else pathlib.Path.cwd() / a.out, a.root)
    except (WheelError, tcmod.ToolchainError, locktool.LockError) as exc:
        print(f"wheel: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # an --out/--output that cannot be made or written: one line, no traceback
        print(f"wheel: error: {exc.filename or ''}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    print(f"{path}  sha256={hashlib.sha256(path.read_bytes()).hexdigest()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
