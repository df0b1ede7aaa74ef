"""Build the CUDA extension (csrc/) against the running Python's torch.

    python3 tools/build_ext.py                        # -> rtp_fp8/_C.so for the toolchain's archs
    python3 tools/build_ext.py --compile-only DIR     # objects only (CPU CI: syntax/arch check)
    python3 tools/build_ext.py --archs sm_90a         # one arch (faster local builds)

Archs default to deps/toolchains.toml's nvcc_archs of the CUDA toolchain whose CUDA
version matches nvcc (cuda13_0 for nvcc 13.0), each as its own -gencode (sm_90a, sm_100a
and sm_120a need their own compute_XXa), plus PTX for the newest plain arch. The Bazel
target //csrc:per_token_group_quant compiles the same sources with rules_cuda.

The build fails when ptxas reports that it serialized a kernel's wgmmas or injected a wait
on them (C7514, C7517 and kin): the kernel would still be correct, but its MMAs would no
longer overlap, a slowdown no test sees. --allow-serialized-wgmma builds anyway.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tools import toolchains as tcmod  # noqa: E402

SOURCES = ["csrc/per_token_group_quant_8bit.cu", "csrc/fp8_gemm_sm90.cu"]
OUTPUT = "rtp_fp8/_C.so"


def nvcc() -> str:
    exe = shutil.which("nvcc") or (os.path.join(os.environ["CUDA_HOME"], "bin", "nvcc")
                                   if os.environ.get("CUDA_HOME") else None)
    if not exe:
        sys.exit("build_ext: nvcc not found (PATH or CUDA_HOME)")
    return exe


def nvcc_version(exe: str) -> str:
    out = subprocess.run([exe, "--version"], capture_output=True, text=True).stdout
    m = re.search(r"release (\d+\.\d+)", out)
    return m.group(1) if m else ""


def cuda_library_dir(exe: str) -> str:
    """Where nvcc links libcudart from (its LIBRARIES line; nvcc may be a wrapper script)."""
    out = subprocess.run([exe, "--dryrun", "-c", "x.cu", "-o", "x.o"], capture_output=True, text=True)
    dirs = re.findall(r'-L"?([^"\s]+)"?', "".join(ln for ln in (out.stdout + out.stderr).splitlines(True)
                                                   if "LIBRARIES=" in ln))
    for d in dirs:
        if "stubs" not in d and os.path.exists(os.path.join(d, "libcudart.so")):
            return os.path.normpath(d)
    sys.exit(f"build_ext: libcudart.so not found in nvcc's library dirs {dirs}")


def default_archs(version: str) -> list[str]:
    cfg = tcmod.load(ROOT)
    for tc in cfg.toolchains.values():
        if tc.cuda == version:
            return list(tc.nvcc_archs)
    cuda = [tc for tc in cfg.toolchains.values() if tc.cuda]
    return list(cuda[-1].nvcc_archs)


def gencode_flags(archs: list[str]) -> list[str]:
    flags = []
    for a in archs:
        n = a.removeprefix("sm_")
        flags.append(f"-gencode=arch=compute_{n},code=sm_{n}")
    ptx = tcmod.ptx_arch(archs)
    flags.append(f"-gencode=arch={ptx},code={ptx}")  # plain PTX: forward compatible
    return flags


def torch_flags() -> tuple[list[str], list[str]]:
    import torch
    from torch.utils import cpp_extension

    inc = [f"-I{p}" for p in cpp_extension.include_paths()]
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    site = os.path.dirname(os.path.dirname(torch.__file__))
    # __FILE__ of torch's headers (TORCH_CHECK messages) must not carry this machine's path.
    cflags = inc + [f"-D_GLIBCXX_USE_CXX11_ABI={abi}", "-Xcompiler", f"-ffile-prefix-map={site}=site-packages"]
    lib = os.path.join(os.path.dirname(torch.__file__), "lib")
    ldflags = [f"-L{lib}", "-lc10", "-lc10_cuda", "-ltorch", "-ltorch_cpu", "-ltorch_cuda"]
    return cflags, ldflags


def _cpu_torch_shims(out: pathlib.Path) -> list[str]:
    """A CPU build of torch ships c10/cuda headers without the one CMake generates for
    CUDA builds; compile-only checks supply it (same content as a CUDA build's: shared libs)."""
    import torch

    if torch.version.cuda:
        return []
    shim = out / "shim" / "c10" / "cuda" / "impl"
    shim.mkdir(parents=True, exist_ok=True)
    (shim / "cuda_cmake_macros.h").write_text("#pragma once\n#define C10_CUDA_BUILD_SHARED_LIBS\n")
    return [f"-I{out / 'shim'}"]


COMMON = ["-std=c++20", "-O3", "-Xcompiler", "-fPIC", "--expt-relaxed-constexpr", "-DNDEBUG"]


@contextlib.contextmanager
def staged_sources():
    """The sources copied to a path that depends only on their bytes.

    cudafe++ derives the ids of internal entities from the source's absolute path
    (--orig_src_path_name), so compiling in place makes two checkouts' builds differ;
    compiling a content-addressed copy makes them byte-identical.
    """
    h = hashlib.sha256()
    for src in SOURCES:
        h.update(src.encode() + b"\0" + (ROOT / src).read_bytes())
    stage = pathlib.Path(tempfile.gettempdir()) / f"rtp_fp8-ext-{h.hexdigest()[:16]}"
    stage.parent.mkdir(parents=True, exist_ok=True)
    with open(str(stage) + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for src in SOURCES:
            dst = stage / src
            dst.parent.mkdir(parents=True, exist_ok=True)
            if not dst.exists() or dst.read_bytes() != (ROOT / src).read_bytes():
                shutil.copyfile(ROOT / src, dst)
        yield stage


# ptxas's notes that a kernel's wgmmas lost their asynchrony, e.g. "(C7514) Potential Performance Loss:
# wgmma.mma_async instructions are serialized due to ..." and "(C7517) warpgroup.wait is injected ...".
_SERIALIZED = re.compile(r"wgmma\.mma_async instructions are serialized|warpgroup\.wait is injected")
_FUNCTION = re.compile(r"in (?:the )?function '([^']+)'")


class SerializedWgmma(RuntimeError):
    """ptxas serialized the wgmmas of some kernel (the build's output names them)."""


def serialized_wgmma(log: str) -> list[str]:
    """The kernels (mangled names, in order, each once) whose wgmmas ptxas serialized, from its output."""
    names: list[str] = []
    for line in log.splitlines():
        if _SERIALIZED.search(line):
            m = _FUNCTION.search(line)
            name = m.group(1) if m else line.strip()
            if name not in names:
                names.append(name)
    return names


def _nvcc(cmd: list[str], cwd: pathlib.Path, allow_serialized: bool) -> None:
    """Runs one nvcc compile, its output (stdout and stderr as one stream) passed through to stderr line by
    line as it comes (a compile takes minutes); SerializedWgmma if ptxas serialized wgmmas."""
    lines = []
    with subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
        for line in proc.stdout:
            sys.stderr.write(line)
            sys.stderr.flush()
            lines.append(line)
    text = "".join(lines)
    if proc.returncode:
        raise subprocess.CalledProcessError(proc.returncode, cmd, text)
    bad = serialized_wgmma(text)
    if bad and not allow_serialized:
        raise SerializedWgmma(
            f"ptxas serialized the wgmmas of {len(bad)} kernel(s): {', '.join(bad)} (its notes above). Their MMAs "
            "would no longer overlap; mend the kernel, or pass --allow-serialized-wgmma to build anyway")


def build(archs: list[str], compile_only: pathlib.Path | None, jobs: int = 0,
          allow_serialized: bool = False) -> list[pathlib.Path]:
    with staged_sources() as stage:
        return _build(archs, compile_only, jobs, stage, allow_serialized)


def _build(archs: list[str], compile_only: pathlib.Path | None, jobs: int, stage: pathlib.Path,
           allow_serialized: bool) -> list[pathlib.Path]:
    exe = nvcc()
    cflags, ldflags = torch_flags()
    gen = gencode_flags(archs)
    par = ["--threads", str(jobs or min(4, len(gen))), "-Xcompiler", f"-ffile-prefix-map={stage}=."]
    if compile_only:
        compile_only.mkdir(parents=True, exist_ok=True)
        cflags = cflags + _cpu_torch_shims(compile_only)
        outs = []
        for src in SOURCES:
            obj = compile_only / (pathlib.Path(src).stem + ".o")
            cmd = [exe, *COMMON, *par, *gen, *cflags, "--frandom-seed", src, "-c", src, "-o", str(obj.resolve())]
            print(" ".join(cmd), flush=True)
            _nvcc(cmd, stage, allow_serialized)
            outs.append(obj)
        return outs
    # Compile (parallel over archs), then link in a second step: nvcc --threads with
    # -shared in one step raced on its temp files (nvlink: could not read ..._dlink.reg.c).
    out = ROOT / OUTPUT
    objdir = ROOT / "build" / "ext"
    objdir.mkdir(parents=True, exist_ok=True)
    objs = []
    for src in SOURCES:
        obj = objdir / (pathlib.Path(src).stem + ".o")
        # --frandom-seed: cudafe++/cicc name internal entities with random ids otherwise
        cmd = [exe, *COMMON, *par, *gen, *cflags, "--frandom-seed", src, "-c", src, "-o", str(obj)]
        print(" ".join(cmd), flush=True)
        _nvcc(cmd, stage, allow_serialized)
        objs.append(str(obj.relative_to(ROOT)))
    # Link with the host compiler (no -rdc, so no device link): nvcc's link step embeds the
    # nvlink command line, -L paths included, in the fatbin. -s drops the symbol table,
    # which would carry nvcc's PID-named temp file (tmpxft_<pid>_...) and break byte identity.
    tmp = out.with_suffix(".so.tmp")
    cuda_lib = cuda_library_dir(exe)
    cmd = ["g++", "-shared", "-s", *objs, *ldflags, f"-L{cuda_lib}", "-lcudart", "-o", str(tmp.relative_to(ROOT))]
    print(" ".join(cmd), flush=True)
    subprocess.run(cmd, cwd=ROOT, check=True)
    os.replace(tmp, out)
    return [out]


def toolkit_nvcc() -> str:
    """The nvcc of the toolkit rules_cuda v0.3.0 would take: $CUDA_PATH/bin, else PATH."""
    if os.environ.get("CUDA_PATH"):
        return os.path.join(os.environ["CUDA_PATH"], "bin", "nvcc")
    return nvcc()


def check_toolkit(toolchain: str) -> int:
    tcs = tcmod.load(ROOT).toolchains
    if toolchain not in tcs or not tcs[toolchain].cuda:
        print(f"build_ext: --check-toolkit {toolchain!r} is not a CUDA toolchain of deps/toolchains.toml "
              f"({sorted(n for n, t in tcs.items() if t.cuda)})", file=sys.stderr)
        return 2
    exe = toolkit_nvcc()
    got = nvcc_version(exe) if os.path.exists(exe) or shutil.which(exe) else ""
    want = tcs[toolchain].cuda
    if got != want:
        print(f"build_ext: toolchain {toolchain} needs CUDA {want}, but the toolkit found ({exe}) is "
              f"{got or 'missing'}: set CUDA_PATH to a CUDA {want} toolkit", file=sys.stderr)
        return 1
    print(f"build_ext: {exe} is CUDA {got}, as toolchain {toolchain} needs")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--compile-only", type=pathlib.Path, help="write objects to this folder; no link")
    ap.add_argument("--archs", help="comma-separated, e.g. sm_90a,sm_100a,sm_120a")
    ap.add_argument("--jobs", type=int, default=0)
    ap.add_argument("--allow-serialized-wgmma", action="store_true",
                    help="build even where ptxas serialized a kernel's wgmmas (C7514, C7517, ...)")
    ap.add_argument("--check-toolkit", metavar="TOOLCHAIN",
                    help="only check that the toolkit found (CUDA_PATH/bin/nvcc, else nvcc on PATH: what rules_cuda "
                         "takes) is TOOLCHAIN's CUDA version in deps/toolchains.toml")
    a = ap.parse_args(argv)
    if a.check_toolkit:
        return check_toolkit(a.check_toolkit)
    archs = a.archs.split(",") if a.archs else default_archs(nvcc_version(nvcc()))
    for arch in archs:
        if not re.fullmatch(r"sm_\d+a?", arch):
            sys.exit(f"build_ext: --archs entry {arch!r} is not like sm_90a")
    try:
        built = build(archs, a.compile_only, a.jobs, a.allow_serialized_wgmma)
    except SerializedWgmma as e:
        print(f"build_ext: {e}", file=sys.stderr)
        return 1
    except subprocess.CalledProcessError as e:
        print(f"build_ext: {e.cmd[0]} exited with {e.returncode} (its output above)", file=sys.stderr)
        return 1
    for p in built:
        print(f"build_ext: wrote {p.relative_to(ROOT) if p.is_relative_to(ROOT) else p}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
