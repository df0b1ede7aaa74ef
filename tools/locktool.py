"""The one lock tool: `tools/lock update [name...]` and `tools/lock check [--online] [name...]`.

`update` writes byte for byte what rules_python's `compile_pip_requirements` writes:
pip-compile (the pip-tools/pip versions of deps/toolchains.toml [lock_tool]) run from
the repo root on repo-relative inputs with `--resolver=backtracking --allow-unsafe
--generate-hashes`, `PIP_CONFIG_FILE=/dev/null`, `LC_ALL=C.UTF-8` and
`CUSTOM_COMPILE_COMMAND="bazel run //deps:<name>.update"`. It writes a temp file and
renames it, so a failed run never leaves a half-written lock, and records the sha256 of
inputs and output in deps/lock_stamps.json so a later hand edit is detected offline.

`check` is offline and fast; `check --online` also re-resolves into a temp copy and
diffs, as rules_python's `.test` target does.
"""

from __future__ import annotations

import argparse
import difflib
import hashlib
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request

from tools import toolchains as tcmod

ROOT = tcmod.REPO_ROOT
STAMPS = "deps/lock_stamps.json"
TOOLS_VENV = ".venv-lock"
# Python files whose constants must mirror toolchains.toml [accelerators].
ACCEL_CONSTANTS = "rtp_fp8/accel.py"

_PIN_RE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(\[[A-Za-z0-9,._-]+\])?==([A-Za-z0-9.+!_-]+)\s*(;.*)?$")
_LOCK_PIN_RE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(\[[A-Za-z0-9,._-]+\])?==(\S+)(?: \\)?$")
_HASH_RE = re.compile(r"^    --hash=sha256:[0-9a-f]{64}(?: \\)?$")


def local_path_token(line: str) -> str | None:
    """A token of a lock line that names a machine-local path or a file:// URL, if any."""
    for tok in re.split(r"[\s=]+", line):
        if tok.startswith("//"):  # a Bazel label (header command)
            continue
        if tok.startswith(("/", "~/", "../", "./")) or re.match(r"^(file:.+|[A-Za-z]:\\)", tok):
            return tok
    return None


class LockError(Exception):
    """Fatal problem; the message names the file or key and, where one exists, the fix."""


def canon(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


# ----------------------------------------------------------------------------- parsing


def parse_in(rel: str, root: pathlib.Path, _seen: tuple = ()) -> list[tuple[str, str, str, int]]:
    """Requirements of a .in file and its `-r` includes: (name, version|None, file, line)."""
    path = root / rel
    if not path.is_file():
        raise LockError(f"{rel}: input file not found")
    if rel in _seen:
        raise LockError(f"{rel}: recursive -r include")
    out: list[tuple[str, str | None, str, int]] = []
    for lineno, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith(("-r ", "--requirement ")):
            inc = line.split(None, 1)[1].strip()
            inc_rel = os.path.normpath(os.path.join(os.path.dirname(rel), inc))
            out += parse_in(inc_rel, root, _seen + (rel,))
            continue
        if line.startswith("-"):
            raise LockError(
                f"{rel}:{lineno}: option {line!r} not allowed in .in files; indexes live in deps/toolchains.toml"
            )
        m = _PIN_RE.match(line)
        out.append((canon(m.group(1)) if m else line, m.group(3) if m else None, rel, lineno))
    return out


def parse_lock(text: str) -> dict[str, dict]:
    """Entries of a pip-compile lock: name -> {version, hashes, via, line}."""
    entries: dict[str, dict] = {}
    cur: dict | None = None
    in_via = False
    for lineno, line in enumerate(text.splitlines(), 1):
        m = _LOCK_PIN_RE.match(line)
        if m:
            cur = {"name": canon(m.group(1)), "version": m.group(3), "hashes": [], "via": [], "line": lineno}
            entries[cur["name"]] = cur
            in_via = False
            continue
        if cur is None:
            continue
        if line.startswith("    --hash="):
            cur["hashes"].append(line.strip().rstrip(" \\"))
        elif line.startswith("    # via"):
            rest = line[len("    # via") :].strip()
            in_via = not rest
            if rest:
                cur["via"].append(rest)
        elif in_via and line.startswith("    #   "):
            cur["via"].append(line[len("    #   ") :].strip())
        else:
            in_via = False
    return entries


# ----------------------------------------------------------------------------- stamps


def _inputs_digest(ls: tcmod.LockSet, root: pathlib.Path) -> str:
    h = hashlib.sha256()
    files = sorted({f for _, _, f, _ in parse_in(ls.input, root)} | {ls.input})
    for f in files:
        h.update(f.encode() + b"\0" + (root / f).read_bytes() + b"\0")
    h.update(json.dumps(ls.__dict__, sort_keys=True, default=list).encode())
    return h.hexdigest()


def _read_stamps(root: pathlib.Path) -> dict:
    p = root / STAMPS
    if not p.exists():
        return {}
    try:
        return json.loads(p.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise LockError(f"{STAMPS}: malformed JSON: {exc}") from None


def _write_atomic(path: pathlib.Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _write_stamp(ls: tcmod.LockSet, root: pathlib.Path) -> None:
    stamps = _read_stamps(root)
    stamps[ls.name] = {
        "inputs_sha256": _inputs_digest(ls, root),
        "lock_sha256": hashlib.sha256((root / ls.lock).read_bytes()).hexdigest(),
    }
    _write_atomic(root / STAMPS, (json.dumps(stamps, indent=2, sort_keys=True) + "\n").encode())


# ----------------------------------------------------------------------------- offline check


def _accel_constants(root: pathlib.Path) -> dict[str, str] | None:
    import ast

    p = root / ACCEL_CONSTANTS
    if not p.exists():
        return None
    tree = ast.parse(p.read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "MIN_VERSIONS" for t in node.targets):
            return ast.literal_eval(node.value)
    raise LockError(f"{ACCEL_CONSTANTS}: no MIN_VERSIONS dict found")


def check_offline(ls: tcmod.LockSet, cfg: tcmod.Config, root: pathlib.Path) -> list[str]:
    """Problems of one lock set, each naming the file (and line) at fault."""
    problems: list[str] = []
    reqs = parse_in(ls.input, root)
    for name, version, f, line in reqs:
        if version is None:
            problems.append(f"{f}:{line}: requirement {name!r} is not pinned with '=='")
    lock_path = root / ls.lock
    if not lock_path.is_file():
        return problems + [f"{ls.lock}: lock file missing"]
    text = lock_path.read_text(encoding="utf-8")
    lines = text.splitlines()
    entries = parse_lock(text)

    # Header: generated by pip-compile under the toolchain's Python, with the update command.
    want_py = f"# This file is autogenerated by pip-compile with Python {ls.python}"
    if want_py not in lines[:4]:
        problems.append(f"{ls.lock}: header must say {want_py!r}")
    if f"#    {ls.update_command}" not in lines[:8]:
        problems.append(f"{ls.lock}: header must name the update command '{ls.update_command}'")

    for i, line in enumerate(lines, 1):
        tok = local_path_token(line)
        if tok:
            problems.append(f"{ls.lock}:{i}: machine-local path or file:// URL {tok!r}")
        if line.startswith("    --hash=") and not _HASH_RE.match(line):
            problems.append(f"{ls.lock}:{i}: malformed hash line {line.strip()!r}")
        if line.startswith(("--find-links", "-f ", "--trusted-host")):
            problems.append(f"{ls.lock}:{i}: {line.split()[0]} must not be in a lock")
    want_idx = [f"--extra-index-url {u}" for u in ls.extra_index_urls]
    got_idx = [ln for ln in lines if ln.startswith(("--index-url", "--extra-index-url", "-i "))]
    if ls.index_url != "https://pypi.org/simple":
        want_idx.insert(0, f"--index-url {ls.index_url}")
    if got_idx != want_idx:
        problems.append(f"{ls.lock}: index lines {got_idx} differ from deps/toolchains.toml {want_idx}")

    in_files = {f for _, _, f, _ in reqs}
    for name, e in entries.items():
        where = f"{ls.lock}:{e['line']}"
        if not e["hashes"]:
            problems.append(f"{where}: {name}=={e['version']} has no --hash=sha256")
        if not e["via"]:
            problems.append(f"{where}: {name} has no '# via' annotation")
        for via in e["via"]:
            if via.startswith("-r "):
                if via[3:] not in in_files:
                    problems.append(f"{where}: annotation '{via}' is not a repo-relative input of {ls.input}")
            elif via.startswith("-c "):
                problems.append(f"{where}: unexpected constraint annotation '{via}'")
            elif canon(via.split("[")[0]) not in entries:
                problems.append(f"{where}: annotation '{via}' names a package missing from the lock")
    for name, version, f, line in reqs:
        if version is None:
            continue
        e = entries.get(name)
        if e is None:
            problems.append(f"{ls.lock}: {name} (required by {f}:{line}) is missing")
        elif e["version"] != version:
            problems.append(f"{ls.lock}:{e['line']}: {name}=={e['version']} but {f}:{line} pins {version}")
        elif not any(v == f"-r {f}" for v in e["via"]):
            problems.append(f"{ls.lock}:{e['line']}: {name} lacks the annotation '-r {f}'")

    if ls.is_toolchain:
        for pkg in ("torch", "triton"):
            want = getattr(ls, pkg)
            got_in = {v for n, v, _, _ in reqs if n == pkg}
            if got_in != {want}:
                problems.append(f"{ls.input}: {pkg} pins {sorted(got_in)} but toolchains.{ls.name}.{pkg} = {want}")
            e = entries.get(pkg)
            if e is None or e["version"] != want:
                problems.append(
                    f"{ls.lock}: {pkg}=={e['version'] if e else None} but toolchains.{ls.name}.{pkg} = {want}"
                )
    else:
        for pkg, want in (("pip", cfg.pip_version), ("pip-tools", cfg.pip_tools_version)):
            e = entries.get(pkg)
            if e is None or e["version"] != want:
                problems.append(f"{ls.lock}: {pkg} must be {want} (deps/toolchains.toml [lock_tool])")

    stamp = _read_stamps(root).get(ls.name)
    if not problems:
        if stamp is None:
            problems.append(f"{STAMPS}: no stamp for {ls.name!r}; the lock was not written by the lock tool")
        else:
            if stamp.get("inputs_sha256") != _inputs_digest(ls, root):
                problems.append(
                    f"{ls.input} (or its -r includes, or toolchains.{ls.name}) changed after the lock was generated"
                )
            if stamp.get("lock_sha256") != hashlib.sha256(lock_path.read_bytes()).hexdigest():
                problems.append(f"{ls.lock}: edited after `tools/lock update {ls.name}` wrote it")
    return problems


def check_accelerators(cfg: tcmod.Config, root: pathlib.Path) -> list[str]:
    consts = _accel_constants(root)
    if consts is None:
        return []
    want = {k: v["min_version"] for k, v in cfg.accelerators.items()}
    if consts != want:
        return [f"{ACCEL_CONSTANTS}: MIN_VERSIONS {consts} != deps/toolchains.toml [accelerators] {want}"]
    return []


def _git_diff(root: pathlib.Path, rel: str) -> str:
    try:
        return subprocess.run(
            ["git", "diff", "--no-color", "HEAD", "--", rel], cwd=root, capture_output=True, text=True, timeout=10
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


# ----------------------------------------------------------------------------- pip-compile


def _python_for(version: str) -> str:
    if f"{sys.version_info[0]}.{sys.version_info[1]}" == version:
        return sys.executable
    exe = shutil.which(f"python{version}")
    if exe is None:
        raise LockError(f"deps/toolchains.toml: python {version} is required but python{version} is not on PATH")
    return exe


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1", LC_ALL="C.UTF-8", LANG="C.UTF-8")
    env.pop("PYTHONPATH", None)
    return env


def ensure_tools_venv(cfg: tcmod.Config, root: pathlib.Path) -> pathlib.Path:
    """The lock tool's venv, installed from its own hash-locked set (bootstrapped once)."""
    venv = root / TOOLS_VENV
    lock = root / cfg.lock_tool.lock
    stamp = venv / ".installed"
    want = hashlib.sha256(lock.read_bytes()).hexdigest() if lock.exists() else "bootstrap"
    if stamp.exists() and stamp.read_text() == want:
        return venv
    py = _python_for(cfg.lock_tool.python)
    if not (venv / "bin" / "python").exists():
        subprocess.run([py, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--index-url", cfg.lock_tool.index_url]
    env = _clean_env()
    if lock.exists():
        cmd = pip + ["--require-hashes", "--no-deps", "-r", str(lock)]
    else:  # bootstrap: the tools lock does not exist yet
        cmd = pip + [f"pip=={cfg.pip_version}", f"pip-tools=={cfg.pip_tools_version}"]
    if subprocess.run(cmd, env=env).returncode != 0:
        raise LockError(f"could not install the lock tool from {cfg.lock_tool.lock} (is the index reachable?)")
    stamp.write_text(want)
    return venv


def _reachable(url: str, timeout: float = 15.0) -> bool:
    req = urllib.request.Request(url.rstrip("/") + "/", method="HEAD")
    try:
        urllib.request.urlopen(req, timeout=timeout).close()
        return True
    except urllib.error.HTTPError:
        return True  # the server answered
    except (urllib.error.URLError, OSError, ValueError):
        return False


def preflight_indexes(ls: tcmod.LockSet, find_links: list[str]) -> list[str]:
    """Fail on an unreachable index unless a local wheel folder stands in for it.

    Returns extra pip-compile arguments: with an index down, pip's retries (with
    back-off, for every project it looks up) would cost minutes, so they are turned off.
    """
    down = []
    if not _reachable(ls.index_url):
        raise LockError(f"deps/toolchains.toml: toolchains.{ls.name}.index_url {ls.index_url} is unreachable")
    for url in ls.extra_index_urls:
        if _reachable(url):
            continue
        if not find_links:
            raise LockError(
                f"deps/toolchains.toml: toolchains.{ls.name}.extra_index_urls entry {url} is unreachable "
                "(give a local wheel folder with --find-links or PIP_FIND_LINKS for what it serves)"
            )
        print(f"lock: note: {url} unreachable; its packages must come from {find_links}", file=sys.stderr)
        down.append(url)
    return ["--pip-args=--retries 0"] if down else []


def pip_compile(ls: tcmod.LockSet, cfg: tcmod.Config, root: pathlib.Path, out: pathlib.Path,
                find_links: list[str], extra: list[str] = ()) -> None:
    venv = ensure_tools_venv(cfg, root)
    args = [str(venv / "bin" / "pip-compile"), "--quiet", "--resolver=backtracking", "--allow-unsafe",
            "--generate-hashes", "--no-emit-find-links", f"--index-url={ls.index_url}"]
    args += [f"--extra-index-url={u}" for u in ls.extra_index_urls]
    args += [f"--find-links={f}" for f in find_links]
    args += [f"--output-file={out}", *extra, ls.input]
    env = _clean_env()
    env["CUSTOM_COMPILE_COMMAND"] = ls.update_command
    proc = subprocess.run(args, cwd=root, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout + proc.stderr)
        raise LockError(f"{ls.input}: pip-compile failed (exit {proc.returncode}); {ls.lock} left unchanged")
    # pip-compile relativizes against the cwd (the repo root); strip anything absolute
    # that would make the bytes depend on where the repo lives, as rules_python does.
    text = out.read_text(encoding="utf-8").replace(str(root) + os.sep, "")
    out.write_text(text, encoding="utf-8")


def update(names: list[str], cfg: tcmod.Config, root: pathlib.Path, find_links: list[str], extra: list[str]) -> None:
    sets = cfg.lock_sets
    for name in names:
        ls = sets[name]
        parse_in(ls.input, root)  # fail early on a missing or malformed input
        extra = preflight_indexes(ls, find_links) + list(extra)
        lock = root / ls.lock
        fd, tmp = tempfile.mkstemp(prefix=f".{lock.name}.tmp", dir=lock.parent)
        os.close(fd)
        tmp_path = pathlib.Path(tmp)
        try:
            if lock.exists():  # existing pins are preferred, as in rules_python's .update
                shutil.copyfile(lock, tmp_path)
            pip_compile(ls, cfg, root, tmp_path, find_links, extra)
            os.chmod(tmp_path, 0o644)
            os.replace(tmp_path, lock)
        finally:
            if tmp_path.exists():
                tmp_path.unlink()
        _write_stamp(ls, root)
        print(f"lock: wrote {ls.lock}")


def check(names: list[str], cfg: tcmod.Config, root: pathlib.Path, online: bool, find_links: list[str]) -> int:
    failed = False
    for problem in check_accelerators(cfg, root):
        print(f"FAIL {problem}")
        failed = True
    for name in names:
        ls = cfg.lock_sets[name]
        problems = check_offline(ls, cfg, root)
        if online and not problems:
            extra = preflight_indexes(ls, find_links)
            with tempfile.TemporaryDirectory() as td:
                out = pathlib.Path(td) / pathlib.Path(ls.lock).name
                shutil.copyfile(root / ls.lock, out)
                pip_compile(ls, cfg, root, out, find_links, extra)
                old = (root / ls.lock).read_text(encoding="utf-8").splitlines(keepends=True)
                new = out.read_text(encoding="utf-8").splitlines(keepends=True)
                if old != new:
                    sys.stdout.writelines(difflib.unified_diff(old, new, ls.lock, "re-resolved"))
                    problems.append(f"{ls.lock}: differs from a fresh re-resolution (diff above)")
        if problems:
            failed = True
            for p in problems:
                print(f"FAIL {p}")
            diff = _git_diff(root, ls.lock)
            if diff:
                print(f"--- changes to {ls.lock} against HEAD:\n{diff}")
            print(f"fix: tools/lock update {name}   (same bytes as: {ls.update_command})")
        else:
            print(f"ok   {ls.lock}" + (" (re-resolved)" if online else ""))
    return 1 if failed else 0


def _find_links(opt: list[str] | None) -> list[str]:
    if opt:
        return opt
    env = os.environ.get("PIP_FIND_LINKS", "")
    return [p for p in env.split() if p]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="tools/lock", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("update", help="regenerate locks (all when no name is given)")
    up.add_argument("names", nargs="*")
    up.add_argument("--find-links", action="append", help="local wheel folder (never written to the lock)")
    up.add_argument("--upgrade-package", action="append", default=[], help="passed to pip-compile")
    ck = sub.add_parser("check", help="verify locks (offline unless --online)")
    ck.add_argument("names", nargs="*")
    ck.add_argument("--online", action="store_true", help="also re-resolve and diff (needs the index)")
    ck.add_argument("--find-links", action="append")
    ap.add_argument("--root", default=os.environ.get("BUILD_WORKSPACE_DIRECTORY") or str(ROOT), help=argparse.SUPPRESS)
    ns = ap.parse_args(argv)
    root = pathlib.Path(ns.root).resolve()
    try:
        cfg = tcmod.load(root)
        names = ns.names or list(cfg.lock_sets)
        for n in names:
            if n not in cfg.lock_sets:
                raise LockError(
                    f"unknown toolchain {n!r}: deps/toolchains.toml defines {', '.join(cfg.lock_sets)}"
                )
        if ns.cmd == "update":
            extra = [f"--upgrade-package={p}" for p in ns.upgrade_package]
            update(names, cfg, root, _find_links(ns.find_links), extra)
            return 0
        return check(names, cfg, root, ns.online, _find_links(ns.find_links))
    except (LockError, tcmod.ToolchainError) as exc:
        print(f"lock: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
