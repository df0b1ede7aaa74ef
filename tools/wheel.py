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
    """The release this source is heading for: rtp_fp8/__init__.py's __version__."""
    m = re.search(r'^__version__ = "([^"]+)"$', (root / "rtp_fp8/__init__.py").read_text(), re.M)
    if not m:
        raise WheelError("rtp_fp8/__init__.py: no __version__")
    return m.group(1)


def _git(root: pathlib.Path, *args: str, binary: bool = False):
    proc = subprocess.run(["git", *args], cwd=root, capture_output=True, text=not binary)
    return proc.stdout if proc.returncode == 0 else None


def source_state(root: pathlib.Path) -> dict:
    """The commit, whether the whole tree differs from it (tracked edits or untracked, unignored
    files anywhere, not only under rtp_fp8/), a digest of that difference, and the release tags."""
    top = _git(root, "rev-parse", "--show-toplevel")
    if top is None or pathlib.Path(top.strip()).resolve() != root.resolve():
        raise WheelError(f"{root} is not the top of a git checkout: the wheel version comes from the commit "
                         "(build from a clone)")
    commit = _git(root, "rev-parse", "HEAD").strip()
    status = _git(root, "status", "--porcelain", "--untracked-files=all") or ""
    dirty = bool(status.strip())
    digest = None
    if dirty:
        h = hashlib.sha256(_git(root, "diff", "--binary", "HEAD", binary=True) or b"")
        for rel in sorted((_git(root, "ls-files", "-o", "--exclude-standard") or "").splitlines()):
            p = root / rel
            h.update(rel.encode() + b"\0" + (p.read_bytes() if p.is_file() else b"") + b"\0")
        digest = h.hexdigest()
    tags = (_git(root, "tag", "--points-at", "HEAD", "--list", "v*") or "").split()
    last = (_git(root, "describe", "--tags", "--match", "v*", "--abbrev=0") or "").strip() or None
    distance = int((_git(root, "rev-list", "--count", f"{last}..HEAD" if last else "HEAD") or "0").strip())
    return {"commit": commit, "dirty": dirty, "dirty_sha256": digest, "tags": tags, "last_tag": last,
            "distance": distance}


def source_revision(root: pathlib.Path, state: dict | None = None) -> str:
    """The commit, with -dirty when the tree differs from it (`state`: source_state(root) when known)."""
    try:
        st = state or source_state(root)
    except WheelError:
        return "unknown"
    return st["commit"] + ("-dirty" if st["dirty"] else "")


def extension_label(tc: tcmod.LockSet) -> str | None:
    return "cu" + tc.cuda.replace(".", "") if tc.cuda else None


def wheel_version(root: pathlib.Path, tc: tcmod.LockSet, ext_sha256: str | None = None,
                  state: dict | None = None) -> str:
    """A version that changes with the source, so two different wheels never share a name.

    - release: HEAD carries the tag v<__version__> and the tree is clean -> '0.2.0';
    - otherwise a dev build of the next release: '0.2.0.dev<commits since the last v* tag>+g<commit 12>';
    - a tree that differs from its commit adds 'd<digest of the difference, 10>';
    - an extension wheel adds the CUDA toolchain ('cu130') and, as its .so is built outside git,
      'x<sha256 of the .so, 10>' (the Bazel wheel, whose .so is an action output, leaves this out).
    """
    base = version(root)
    st = state or source_state(root)  # one walk of the tree serves a whole build
    other = [t for t in st["tags"] if t != f"v{base}"]
    if other:
        raise WheelError(f"HEAD is tagged {', '.join(other)} but rtp_fp8/__init__.py says {base}")
    local = []
    if f"v{base}" in st["tags"] and not st["dirty"]:
        ver = base
    else:
        if f"v{base}" in st["tags"]:
            raise WheelError(f"HEAD is the release v{base} but the tree differs from it: a release is built "
                             "from a clean checkout")
        if st["last_tag"] == f"v{base}":
            raise WheelError(f"rtp_fp8/__init__.py still says {base}, released as tag v{base} "
                             f"{st['distance']} commits ago: raise __version__ to the next release")
        ver = f"{base}.dev{st['distance']}"
        local.append(f"g{st['commit'][:12]}")
        if st["dirty"]:
            local.append(f"d{st['dirty_sha256'][:10]}")
    if extension_label(tc):
        local.append(extension_label(tc))
        if ext_sha256:
            local.append(f"x{ext_sha256[:10]}")
    return ver + ("+" + ".".join(local) if local else "")


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
    """The wheel's Requires-Dist: the toolchain's runtime pins. build_info records the same list."""
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


# Shared libraries the extension may link without bundling them: the Requires-Dist torch wheel
# (and the NVIDIA runtime wheels it depends on) provides them at run time, as for every torch
# extension. Anything else the extension needs keeps the wheel at auditwheel's overall verdict.
PROVIDED_BY_REQUIRES = re.compile(r"^(libc10(_cuda)?|libtorch(_cpu|_cuda|_python)?|libcudart)\.so(\.\d+)*$")


def platform_tag(tc: tcmod.LockSet, files: list[tuple[str, bytes, int]]) -> str:
    """The extension wheel's tag, as auditwheel (PyPI) reads it: a throwaway linux_x86_64 wheel of
    the same files is audited; its symbol-versioning verdict (e.g. manylinux_2_28) is taken when
    every external library is one torch provides, else auditwheel's overall tag (linux_x86_64)."""
    import tempfile

    py = "cp" + tc.python.replace(".", "")
    with tempfile.TemporaryDirectory() as td:
        probe = pathlib.Path(td) / f"rtp_fp8-0-{py}-{py}-linux_x86_64.whl"
        dist = "rtp_fp8-0.dist-info"
        items = [(p, d) for p, d, _ in files] + [
            (f"{dist}/METADATA", b"Metadata-Version: 2.1\nName: rtp_fp8\nVersion: 0\n"),
            (f"{dist}/WHEEL", f"Wheel-Version: 1.0\nRoot-Is-Purelib: false\nTag: {py}-{py}-linux_x86_64\n".encode())]
        record = "".join(f"{p},{_record_hash(d)},{len(d)}\n" for p, d in items) + f"{dist}/RECORD,,\n"
        with zipfile.ZipFile(probe, "w") as zf:
            for p, d in items + [(f"{dist}/RECORD", record.encode())]:
                zf.writestr(p, d)
        proc = subprocess.run([sys.executable, "-m", "auditwheel", "show", "--json", str(probe)],
                              capture_output=True, text=True)
    if proc.returncode != 0:
        if "No module named auditwheel" in proc.stderr:
            raise WheelError("auditwheel is not installed in this Python: the extension wheel's platform tag comes "
                             "from it (it is in every toolchain's lock: deps/requirements_base.in)")
        raise WheelError(f"auditwheel show failed: {proc.stderr.strip().splitlines()[-1:]}")
    report = json.loads(proc.stdout)
    foreign = sorted(lib for lib in report.get("external_libs", {}) if not PROVIDED_BY_REQUIRES.match(lib))
    return f"{py}-{py}-" + (report["overall_tag"] if foreign else report["sym_tag"])


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _toolchain(name: str, root: pathlib.Path) -> tcmod.LockSet:
    cfg = tcmod.load(root)
    if name not in cfg.toolchains:
        raise WheelError(f"unknown toolchain {name!r}: deps/toolchains.toml defines {', '.join(cfg.toolchains)}")
    return cfg.toolchains[name]


def build_info(tc: tcmod.LockSet, ver: str, revision: str, epoch: int, reqs: list[str]) -> bytes:
    """rtp_fp8/_build_info.json (what `rtp_fp8.build_info()` reports once installed). torch and
    triton are read from `reqs`, the list the METADATA's Requires-Dist is written from."""
    with_ext = bool(tc.cuda)
    pins = dict(r.split("==", 1) for r in reqs)
    info = {"toolchain": tc.name, "version": ver, "torch": pins["torch"], "triton": pins["triton"],
            "requires": list(reqs), "cuda": tc.cuda or None, "archs": list(tc.nvcc_archs) if with_ext else [],
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
        ver = st.get(f"STABLE_RTP_FP8_VERSION_{tc.name}") or wheel_version(root, tc)
        data = build_info(tc, ver, st.get("STABLE_RTP_FP8_REVISION") or source_revision(root), epoch,
                          requires(tc, root))
    output.write_bytes(data)


def build(toolchain: str, out_dir: pathlib.Path, root: pathlib.Path = ROOT) -> pathlib.Path:
    tc = _toolchain(toolchain, root)
    out_dir.mkdir(parents=True, exist_ok=True)  # an --out that cannot be made fails first, naming it
    with_ext = bool(tc.cuda)
    files = _files(root, with_ext)
    ext_sha = next((hashlib.sha256(d).hexdigest() for p, d, _ in files if p == EXTENSION), None)
    state = source_state(root)
    ver = wheel_version(root, tc, ext_sha, state)
    tag = platform_tag(tc, files) if with_ext else "py3-none-any"
    name = f"rtp_fp8-{ver.replace('-', '_')}-{tag}.whl"
    epoch = max(source_date_epoch(root), 315532800)  # zip cannot store dates before 1980
    import time

    stamp = time.gmtime(epoch)[:6]
    dist = f"rtp_fp8-{ver}.dist-info"
    reqs = requires(tc, root)

    files.append(("rtp_fp8/_build_info.json", build_info(tc, ver, source_revision(root, state), epoch, reqs),
                  0o644))
    files.sort(key=lambda f: f[0])
    meta = [
        "Metadata-Version: 2.1", "Name: rtp_fp8", f"Version: {ver}",
        "Summary: FP8 inference kernels for Hopper and Blackwell: quantization, GEMM, MoE EP",
        f"Requires-Python: >={tc.python}",
    ] + [f"Requires-Dist: {r}" for r in reqs]
    wheel_meta = ["Wheel-Version: 1.0", "Generator: rtp_fp8 tools/wheel.py",
                  f"Root-Is-Purelib: {'false' if with_ext else 'true'}", f"Tag: {tag}"]
    # .dist-info last (the wheel spec's recommendation: installers may stream the archive), RECORD at the end
    files.append((f"{dist}/METADATA", ("\n".join(meta) + "\n").encode(), 0o644))
    files.append((f"{dist}/WHEEL", ("\n".join(wheel_meta) + "\n").encode(), 0o644))
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
    ap.add_argument("--print-version", action="store_true", help="print the wheel version of --toolchain and exit")
    ap.add_argument("--workspace-status", action="store_true",
                    help="print Bazel's stable status keys (tools/workspace_status.sh)")
    a = ap.parse_args(argv)
    try:
        if a.print_version:
            print(wheel_version(a.root, _toolchain(a.toolchain, a.root)))
            return 0
        if a.workspace_status:
            state = source_state(a.root)
            for name in tcmod.load(a.root).toolchains:
                print(f"STABLE_RTP_FP8_VERSION_{name} {wheel_version(a.root, _toolchain(name, a.root), state=state)}")
            print(f"STABLE_RTP_FP8_REVISION {source_revision(a.root, state)}")
            print(f"STABLE_SOURCE_DATE_EPOCH {source_date_epoch(a.root)}")
            return 0
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
