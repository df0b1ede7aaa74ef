"""Load and validate deps/toolchains.toml, the single source of truth for toolchains.

Stdlib only: the lock tool, the dev entry point, the wheel builder and the tests all
read the file through this module, so a malformed file fails the same way everywhere.
"""

from __future__ import annotations

import dataclasses
import pathlib
import re
import tomllib

REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent
TOOLCHAINS_TOML = "deps/toolchains.toml"

_NAME_RE = re.compile(r"^[a-z][a-z0-9_]*$")
_PY_RE = re.compile(r"^3\.\d+$")
_ARCH_RE = re.compile(r"^sm_\d+a?$")


class ToolchainError(Exception):
    """A problem with toolchains.toml or a file it names; the message names the key."""


@dataclasses.dataclass(frozen=True)
class LockSet:
    """One hash-locked requirement set: a toolchain, or the lock tool's own set."""

    name: str
    python: str
    input: str  # repo-relative .in path
    lock: str  # repo-relative lock path
    index_url: str
    extra_index_urls: tuple[str, ...] = ()
    torch: str | None = None
    triton: str | None = None
    cuda: str = ""
    nvcc_archs: tuple[str, ...] = ()

    @property
    def update_command(self) -> str:
        return f"bazel run //deps:{self.name}.update"

    @property
    def is_toolchain(self) -> bool:
        return self.torch is not None


@dataclasses.dataclass(frozen=True)
class Config:
    toolchains: dict[str, LockSet]
    lock_tool: LockSet
    pip_version: str
    pip_tools_version: str
    accelerators: dict[str, dict]

    @property
    def lock_sets(self) -> dict[str, LockSet]:
        out = dict(self.toolchains)
        out[self.lock_tool.name] = self.lock_tool
        return out


_HEX40 = re.compile(r"^[0-9a-f]{40}$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


def _check_source(src: dict, min_version: str, where: str) -> None:
    """A pinned source archive: full 40-hex commits, a 64-hex sha256, a version >= min_version."""
    for key in ("version", "commit", "archive", "sha256"):
        _req(src, key, where, str)
    for key in [k for k in src if k == "commit" or k.endswith("_commit")]:
        if not _HEX40.match(_req(src, key, where, str)):
            raise ToolchainError(f"{TOOLCHAINS_TOML}: '{where}.{key}' must be a full 40-hex commit, got {src[key]!r}")
    if not _HEX64.match(src["sha256"]):
        raise ToolchainError(f"{TOOLCHAINS_TOML}: '{where}.sha256' must be 64 lowercase hex, got {src['sha256']!r}")
    if "/" in src["archive"] or src["archive"].startswith("."):
        raise ToolchainError(f"{TOOLCHAINS_TOML}: '{where}.archive' must be a bare file name, got {src['archive']!r}")

    def vt(v):
        return tuple(int(p) for p in re.findall(r"\d+", v)[:3])

    if vt(src["version"]) < vt(min_version):
        raise ToolchainError(f"{TOOLCHAINS_TOML}: '{where}.version' {src['version']} is older than min_version "
                             f"{min_version}")


def _req(table: dict, key: str, where: str, typ: type):
    if key not in table:
        raise ToolchainError(f"{TOOLCHAINS_TOML}: missing key '{where}.{key}'")
    value = table[key]
    if not isinstance(value, typ):
        raise ToolchainError(
            f"{TOOLCHAINS_TOML}: '{where}.{key}' must be {typ.__name__}, got {type(value).__name__}"
        )
    return value


def _str_list(table: dict, key: str, where: str) -> tuple[str, ...]:
    value = _req(table, key, where, list)
    if not all(isinstance(v, str) for v in value):
        raise ToolchainError(f"{TOOLCHAINS_TOML}: '{where}.{key}' must be a list of strings")
    return tuple(value)


def _check_python(value: str, where: str) -> str:
    if not _PY_RE.match(value):
        raise ToolchainError(f"{TOOLCHAINS_TOML}: '{where}.python' must look like '3.11', got {value!r}")
    return value


def ptx_arch(archs) -> str:
    """The plain PTX target builds add for forward compatibility: compute_<newest of archs>."""
    return f"compute_{max(int(re.sub(r'[^0-9]', '', a)) for a in archs)}"


def load(root: pathlib.Path | str | None = None) -> Config:
    root = pathlib.Path(root) if root else REPO_ROOT
    path = root / TOOLCHAINS_TOML
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ToolchainError(f"{TOOLCHAINS_TOML}: file not found under {root}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ToolchainError(f"{TOOLCHAINS_TOML}: malformed TOML: {exc}") from None

    lt = _req(data, "lock_tool", "", dict)
    lock_tool = LockSet(
        name="tools",
        python=_check_python(_req(lt, "python", "lock_tool", str), "lock_tool"),
        input=_req(lt, "input", "lock_tool", str),
        lock=_req(lt, "lock", "lock_tool", str),
        index_url=_req(lt, "index_url", "lock_tool", str),
    )
    pip_version = _req(lt, "pip", "lock_tool", str)
    pip_tools_version = _req(lt, "pip_tools", "lock_tool", str)

    tcs = _req(data, "toolchains", "", dict)
    if not tcs:
        raise ToolchainError(f"{TOOLCHAINS_TOML}: '[toolchains]' defines no toolchain")
    toolchains: dict[str, LockSet] = {}
    for name, tc in tcs.items():
        where = f"toolchains.{name}"
        if not _NAME_RE.match(name) or name == "tools":
            raise ToolchainError(f"{TOOLCHAINS_TOML}: bad toolchain name {name!r} (lower_snake, not 'tools')")
        if not isinstance(tc, dict):
            raise ToolchainError(f"{TOOLCHAINS_TOML}: '{where}' must be a table")
        archs = _str_list(tc, "nvcc_archs", where)
        for arch in archs:
            if not _ARCH_RE.match(arch):
                raise ToolchainError(f"{TOOLCHAINS_TOML}: '{where}.nvcc_archs' has bad arch {arch!r}")
        cuda = _req(tc, "cuda", where, str)
        if bool(cuda) != bool(archs):
            raise ToolchainError(f"{TOOLCHAINS_TOML}: '{where}': cuda and nvcc_archs must both be set or both empty")
        toolchains[name] = LockSet(
            name=name,
            python=_check_python(_req(tc, "python", where, str), where),
            input=_req(tc, "input", where, str),
            lock=_req(tc, "lock", where, str),
            index_url=_req(tc, "index_url", where, str),
            extra_index_urls=_str_list(tc, "extra_index_urls", where),
            torch=_req(tc, "torch", where, str),
            triton=_req(tc, "triton", where, str),
            cuda=cuda,
            nvcc_archs=archs,
        )

    accels = _req(data, "accelerators", "", dict)
    for name, acc in accels.items():
        for key in ("min_version", "upstream", "commit"):
            _req(acc, key, f"accelerators.{name}", str)
        if not _HEX40.match(acc["commit"]):
            raise ToolchainError(f"{TOOLCHAINS_TOML}: 'accelerators.{name}.commit' must be a full 40-hex commit, "
                                 f"got {acc['commit']!r}")
        if "source" in acc:
            _check_source(_req(acc, "source", f"accelerators.{name}", dict), acc["min_version"],
                          f"accelerators.{name}.source")
    return Config(toolchains, lock_tool, pip_version, pip_tools_version, accels)
