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
import platform
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
PLATFORM = "Linux x86_64"  # every lock is resolved for this (header line; ./dev refuses others)
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
            extras = [canon(x) for x in m.group(2)[1:-1].split(",")] if m.group(2) else []
            cur = {"name": canon(m.group(1)), "version": m.group(3), "hashes": [], "via": [], "line": lineno,
                   "extras": extras}
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


class Problem(str):
    """A problem (the message) with the one command or edit that fixes it (`.fix`)."""

    fix: str

    def __new__(cls, msg: str, fix: str):
        obj = super().__new__(cls, msg)
        obj.fix = fix
        return obj


PLATFORM_LINE = (f"# Resolved for {PLATFORM}, CPython {{python}} only: dev and tools/lock refuse to install it "
                 "elsewhere.")


def header_lines(ls: tcmod.LockSet) -> list[str]:
    """The lines every lock of `ls` starts with (pip-compile's header plus the platform line)."""
    return ["#", f"# This file is autogenerated by pip-compile with Python {ls.python}", "# by the following command:",
            "#", f"#    {ls.update_command}", "#", PLATFORM_LINE.format(python=ls.python), "#"]


def _lock_grammar(ls: tcmod.LockSet, lines: list[str]) -> list[str]:
    """Lines pip would act on that pip-compile never writes: a strict grammar of the lock body.

    pip honours options anywhere in a requirements file (`-f/path`, `-iURL`, `--trusted-host`,
    `-e`, `name @ URL`, `-r other.txt`, and anything a trailing backslash joins onto a hash
    line), so everything but comments, the index lines, pins and their hash lines is refused.
    """
    problems = []
    state = "top"  # top | pin (after 'name==v \\') | hash (after a hash line ending in a backslash)
    for i, line in enumerate(lines, 1):
        where = f"{ls.lock}:{i}"
        if state in ("pin", "hash"):
            if _HASH_RE.match(line):
                state = "hash" if line.endswith(" \\") else "top"
                continue
            problems.append(f"{where}: {line.strip()!r} continues a requirement; only '    --hash=sha256:<64 hex>' may")
            state = "top"
            continue
        if not line.strip() or line.startswith("#") or line.startswith("    # ") or line == "    #":
            continue
        if re.fullmatch(r"--(extra-)?index-url https://\S+", line):
            continue
        m = _LOCK_PIN_RE.match(line)
        if m and line.endswith(" \\"):
            state = "pin"
            continue
        if m:
            problems.append(f"{where}: {line!r} has no hashes (pip-compile writes 'NAME==V \\' and hash lines)")
            continue
        stripped = line.strip()
        kind = ("a local wheel source" if re.match(r"-f|--find-links", stripped) else
                "an index" if re.match(r"-i|--index-url|--extra-index-url", stripped) else
                "a direct reference (name @ URL)" if "@" in stripped and not stripped.startswith("-") else
                "an editable install" if re.match(r"-e|--editable", stripped) else
                "another requirements file" if re.match(r"-[rc]|--requirement|--constraint", stripped) else
                "an install option" if stripped.startswith("-") else "an unhashed requirement")
        problems.append(f"{where}: {stripped!r} is not something pip-compile writes, and pip would act on it "
                        f"({kind})")
    if state != "top":
        problems.append(f"{ls.lock}: ends inside a requirement (a trailing backslash)")
    return problems


def _differs_from_head(root: pathlib.Path, rel: str) -> bool:
    """Whether a tracked file of a git checkout at `root` differs from HEAD (False outside git)."""
    try:
        top = _git(root, "rev-parse", "--show-toplevel")
        if top.returncode != 0 or pathlib.Path(top.stdout.strip()).resolve() != root.resolve():
            return False
        return _git(root, "diff", "--quiet", "HEAD", "--", rel).returncode == 1
    except (OSError, subprocess.SubprocessError):
        return False


def check_offline(ls: tcmod.LockSet, cfg: tcmod.Config, root: pathlib.Path,
                  inputs_only: bool = False) -> list[Problem]:
    """Problems of one lock set, each naming the file (and line) at fault and its own fix.
    `inputs_only`: just what `update` must refuse (the inputs disagree with toolchains.toml)."""
    update = f"tools/lock update {ls.name}"
    problems: list[Problem] = []
    reqs = parse_in(ls.input, root)
    for name, version, f, line in reqs:
        if version is None:
            problems.append(Problem(f"{f}:{line}: requirement {name!r} is not pinned with '=='",
                                    f"pin it in {f}:{line} as NAME==VERSION, then {update}"))
    if ls.is_toolchain:
        for pkg in ("torch", "triton"):
            want = getattr(ls, pkg)
            got_in = {v for n, v, _, _ in reqs if n == pkg}
            if got_in != {want}:
                problems.append(Problem(f"{ls.input}: {pkg} pins {sorted(got_in)} but toolchains.{ls.name}.{pkg} = "
                                        f"{want}", f"make {ls.input} say {pkg}=={want} (or change "
                                        f"deps/toolchains.toml), then {update}"))
    else:
        for pkg, want in (("pip", cfg.pip_version), ("pip-tools", cfg.pip_tools_version)):
            got_in = {v for n, v, _, _ in reqs if n == pkg}
            if got_in != {want}:
                problems.append(Problem(f"{ls.input}: {pkg} pins {sorted(got_in)} but deps/toolchains.toml "
                                        f"[lock_tool] says {want}",
                                        f"make {ls.input} say {pkg}=={want}, then {update}"))
    if inputs_only:
        return problems
    input_problems = bool(problems)
    lock_path = root / ls.lock
    if not lock_path.is_file():
        return problems + [Problem(f"{ls.lock}: lock file missing", f"git checkout -- {ls.lock}, or {update}")]
    # What fixes a bad lock body: restoring the generated file when it was edited since the
    # last commit (updating would upgrade a hand-edited pin instead of restoring it), else
    # regenerating it.
    restore = (f"git checkout -- {ls.lock} (restores the generated lock; `{update}` would re-resolve the edit, "
               "not undo it)") if _differs_from_head(root, ls.lock) else update
    text = lock_path.read_text(encoding="utf-8")
    lines = text.splitlines()
    entries = parse_lock(text)

    want_header = header_lines(ls)
    if lines[:len(want_header)] != want_header:
        got_py = next((ln for ln in lines[:4] if "pip-compile with Python" in ln), "")
        if got_py and got_py != want_header[1]:
            problems.append(Problem(f"{ls.lock}: header says {got_py[2:]!r}, toolchains.{ls.name}.python is "
                                    f"{ls.python}", f"{update} (runs pip-compile under python{ls.python}, "
                                    f"which must be on PATH)"))
        else:
            problems.append(Problem(f"{ls.lock}: header must be the {len(want_header)} lines tools/lock writes "
                                    f"(pip-compile's, naming '{ls.update_command}', and the platform line)", restore))

    for i, line in enumerate(lines, 1):
        tok = local_path_token(line)
        if tok:
            problems.append(Problem(f"{ls.lock}:{i}: machine-local path or file:// URL {tok!r}", restore))
    problems += [Problem(p, restore) for p in _lock_grammar(ls, lines)]
    want_idx = [f"--extra-index-url {u}" for u in ls.extra_index_urls]
    got_idx = [ln for ln in lines if ln.startswith(("--index-url", "--extra-index-url"))]
    if ls.index_url != "https://pypi.org/simple":
        want_idx.insert(0, f"--index-url {ls.index_url}")
    if got_idx != want_idx:
        problems.append(Problem(f"{ls.lock}: index lines {got_idx} differ from deps/toolchains.toml {want_idx}",
                                restore))

    in_files = {f for _, _, f, _ in reqs}
    for name, e in entries.items():
        where = f"{ls.lock}:{e['line']}"
        if not e["hashes"]:
            problems.append(Problem(f"{where}: {name}=={e['version']} has no --hash=sha256", restore))
        if not e["via"]:
            problems.append(Problem(f"{where}: {name} has no '# via' annotation", restore))
        for via in e["via"]:
            if via.startswith("-r "):
                if via[3:] not in in_files:
                    problems.append(Problem(f"{where}: annotation '{via}' is not a repo-relative input of {ls.input}",
                                            restore))
            elif via.startswith("-c "):
                problems.append(Problem(f"{where}: unexpected constraint annotation '{via}'", restore))
            elif canon(via.split("[")[0]) not in entries:
                problems.append(Problem(f"{where}: annotation '{via}' names a package missing from the lock",
                                        restore))
    for name, version, f, line in reqs:
        if version is None:
            continue
        e = entries.get(name)
        if e is None:
            problems.append(Problem(f"{ls.lock}: {name} (required by {f}:{line}) is missing", restore))
        elif e["version"] != version:
            problems.append(Problem(f"{ls.lock}:{e['line']}: {name}=={e['version']} but {f}:{line} pins {version}",
                                    update if input_problems else restore))
        elif not any(v == f"-r {f}" for v in e["via"]):
            problems.append(Problem(f"{ls.lock}:{e['line']}: {name} lacks the annotation '-r {f}'", restore))

    if ls.is_toolchain:
        for pkg in ("torch", "triton"):
            want = getattr(ls, pkg)
            e = entries.get(pkg)
            if e is None or e["version"] != want:
                problems.append(Problem(f"{ls.lock}: {pkg}=={e['version'] if e else None} but "
                                        f"toolchains.{ls.name}.{pkg} = {want}",
                                        update if input_problems else restore))
    else:
        for pkg, want in (("pip", cfg.pip_version), ("pip-tools", cfg.pip_tools_version)):
            e = entries.get(pkg)
            if e is None or e["version"] != want:
                problems.append(Problem(f"{ls.lock}: {pkg} must be {want} (deps/toolchains.toml [lock_tool])",
                                        f"make {ls.input} say {pkg}=={want}, then {update}"))

    # The stamp catches accidents (an edit, an input changed without update). It is a plain
    # digest anyone can recompute, so it proves nothing about where a hash came from:
    # `tools/lock verify` asks the index for that.
    stamp = _read_stamps(root).get(ls.name)
    if not problems:
        if stamp is None:
            problems.append(Problem(f"{STAMPS}: no stamp for {ls.name!r}; the lock was not written by the lock tool",
                                    update))
        else:
            if stamp.get("inputs_sha256") != _inputs_digest(ls, root):
                problems.append(Problem(f"{ls.input} (or its -r includes, or toolchains.{ls.name}) changed after "
                                        "the lock was generated", update))
            if stamp.get("lock_sha256") != hashlib.sha256(lock_path.read_bytes()).hexdigest():
                problems.append(Problem(f"{ls.lock}: edited after `tools/lock update {ls.name}` wrote it", restore))
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
        raise LockError(f"deps/toolchains.toml: python {version} is required but python{version} is not on PATH "
                        f"(install it, or change the toolchain's python)")
    return exe


def require_lock_platform() -> None:
    """pip-compile resolves for the machine it runs on: only Linux x86_64 writes these locks."""
    here = f"{platform.system()} {platform.machine()}"
    if here != PLATFORM or platform.python_implementation() != "CPython":
        raise LockError(f"the locks are {PLATFORM} CPython resolutions and this is {here} "
                        f"{platform.python_implementation()}: run tools/lock on {PLATFORM}")


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1", LC_ALL="C.UTF-8", LANG="C.UTF-8")
    env.pop("PYTHONPATH", None)
    return env


def tools_venv_dir(cfg: tcmod.Config, python: str) -> str:
    return TOOLS_VENV if python == cfg.lock_tool.python else f"{TOOLS_VENV}-{python}"


def ensure_tools_venv(cfg: tcmod.Config, root: pathlib.Path, python: str | None = None) -> pathlib.Path:
    """The lock tool's venv for one Python (pip-compile writes the Python it runs under into the
    header, so each toolchain's lock is compiled under that toolchain's Python), installed from the
    tool's own hash-locked set: wheels only, dependencies checked (no --no-deps)."""
    python = python or cfg.lock_tool.python
    venv = root / tools_venv_dir(cfg, python)
    lock = root / cfg.lock_tool.lock
    stamp = venv / ".installed"
    want = hashlib.sha256(lock.read_bytes()).hexdigest() if lock.exists() else "bootstrap"
    if stamp.exists() and stamp.read_text() == want:
        return venv
    py = _python_for(python)
    if not (venv / "bin" / "python").exists():
        subprocess.run([py, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--only-binary=:all:", "--index-url",
           cfg.lock_tool.index_url]
    env = _clean_env()
    if lock.exists():
        cmd = pip + ["--require-hashes", "-r", str(lock)]
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


_PIP_COMPILE_HEADER = 6  # '#', 'This file is autogenerated ...', 'by the following command:', '#', command, '#'


def pip_compile(ls: tcmod.LockSet, cfg: tcmod.Config, root: pathlib.Path, out: pathlib.Path,
                find_links: list[str], extra: list[str] = ()) -> None:
    """pip-compile into `out` (seeded with what `out` holds), hashes always fresh from the index
    (--no-reuse-hashes: a hash in the seed is never carried over), plus the platform line."""
    venv = ensure_tools_venv(cfg, root, ls.python)
    args = [str(venv / "bin" / "pip-compile"), "--quiet", "--resolver=backtracking", "--allow-unsafe",
            "--generate-hashes", "--no-reuse-hashes", "--no-emit-find-links", f"--index-url={ls.index_url}"]
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
    lines = out.read_text(encoding="utf-8").replace(str(root) + os.sep, "").splitlines(keepends=True)
    want = [ln + "\n" for ln in header_lines(ls)]
    if lines[:_PIP_COMPILE_HEADER] != want[:_PIP_COMPILE_HEADER]:
        raise LockError(f"{ls.input}: pip-compile wrote an unexpected header: "
                        f"{''.join(lines[:_PIP_COMPILE_HEADER])!r}")
    out.write_text("".join(want + lines[_PIP_COMPILE_HEADER:]), encoding="utf-8")


def update(names: list[str], cfg: tcmod.Config, root: pathlib.Path, find_links: list[str], extra: list[str],
           verify_index: bool = True) -> None:
    """Regenerate locks. Refuses what `check` would refuse in the inputs, refuses to re-resolve a
    lock edited by hand (that would launder the edit), never seeds pip-compile with a lock whose
    body pip-compile would not have written, and checks every new or changed hash against the
    index before the lock is replaced."""
    from tools import lockverify

    require_lock_platform()
    sets = cfg.lock_sets
    for name in names:
        ls = sets[name]
        parse_in(ls.input, root)  # fail early on a missing or malformed input
        bad = check_offline(ls, cfg, root, inputs_only=True)
        if bad:
            raise LockError("; ".join(f"{p} (fix: {p.fix})" for p in bad) + f"; {ls.lock} left unchanged")
        _python_for(ls.python)
        lock = root / ls.lock
        seed = lock.exists()
        if seed:
            stamp = _read_stamps(root).get(ls.name, {})
            if stamp.get("lock_sha256") != hashlib.sha256(lock.read_bytes()).hexdigest():
                raise LockError(f"{ls.lock} was edited after `tools/lock update {name}` wrote it; updating would "
                                f"re-resolve the edit instead of undoing it: git checkout -- {ls.lock} "
                                f"(or delete it to resolve {name} from scratch)")
            body = _lock_grammar(ls, lock.read_text(encoding="utf-8").splitlines())
            if body:
                print(f"lock: note: {ls.lock} holds lines pip-compile never writes ({body[0]}); resolving from "
                      "scratch instead of seeding from it", file=sys.stderr)
                seed = False
        compile_args = preflight_indexes(ls, find_links) + list(extra)
        old = parse_lock(lock.read_text(encoding="utf-8")) if lock.exists() else {}
        fd, tmp = tempfile.mkstemp(prefix=f".{lock.name}.tmp", dir=lock.parent)
        os.close(fd)
        tmp_path = pathlib.Path(tmp)
        try:
            if seed:  # existing pins are preferred, as in rules_python's .update
                shutil.copyfile(lock, tmp_path)
            else:
                tmp_path.write_text("")
            pip_compile(ls, cfg, root, tmp_path, find_links, compile_args)
            if verify_index:
                new = parse_lock(tmp_path.read_text(encoding="utf-8"))
                changed = {n: e for n, e in new.items() if _entry_key(old.get(n)) != _entry_key(e)}
                if changed:
                    finder = lockverify.Finder([ls.index_url, *ls.extra_index_urls], find_links)
                    problems, _ = lockverify.provenance(ls.lock, changed, finder, ls.python, set())
                    if problems:
                        raise LockError("; ".join(problems) + f"; {ls.lock} left unchanged")
            os.chmod(tmp_path, 0o644)
            os.replace(tmp_path, lock)
        finally:
            if tmp_path.exists():
                tmp_path.unlink()
        _write_stamp(ls, root)
        print(f"lock: wrote {ls.lock}")


def _entry_key(e: dict | None):
    return None if e is None else (e["version"], tuple(sorted(e["hashes"])))


def _print_problems(problems: list[Problem], ls: tcmod.LockSet, root: pathlib.Path) -> None:
    for p in problems:
        print(f"FAIL {p}")
    diff = _git_diff(root, ls.lock)
    if diff:
        print(f"--- changes to {ls.lock} against HEAD:\n{diff}")
    fixes = list(dict.fromkeys(getattr(p, "fix", f"tools/lock update {ls.name}") for p in problems))
    for fix in fixes:
        same = f"   (same bytes as: {ls.update_command})" if fix == f"tools/lock update {ls.name}" else ""
        print(f"fix: {fix}{same}")


def check(names: list[str], cfg: tcmod.Config, root: pathlib.Path, online: bool, find_links: list[str]) -> int:
    failed = False
    for problem in check_accelerators(cfg, root):
        print(f"FAIL {problem}")
        failed = True
    for name in names:
        ls = cfg.lock_sets[name]
        problems = check_offline(ls, cfg, root)
        if online and not problems:
            require_lock_platform()
            extra = preflight_indexes(ls, find_links)
            with tempfile.TemporaryDirectory() as td:
                out = pathlib.Path(td) / pathlib.Path(ls.lock).name
                shutil.copyfile(root / ls.lock, out)
                pip_compile(ls, cfg, root, out, find_links, extra)
                old = (root / ls.lock).read_text(encoding="utf-8").splitlines(keepends=True)
                new = out.read_text(encoding="utf-8").splitlines(keepends=True)
                if old != new:
                    sys.stdout.writelines(difflib.unified_diff(old, new, ls.lock, "re-resolved"))
                    problems.append(Problem(f"{ls.lock}: differs from a fresh re-resolution (diff above; hashes "
                                            "fresh from the index)", f"tools/lock update {name}"))
        if problems:
            failed = True
            _print_problems(problems, ls, root)
        else:
            print(f"ok   {ls.lock}" + (" (re-resolved)" if online else ""))
    return 1 if failed else 0


def _git(root: pathlib.Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=30)


def default_base(root: pathlib.Path) -> str | None:
    """The revision lock changes are measured from: the merge base with the upstream branch, else HEAD."""
    for ref in ("@{upstream}", "origin/HEAD"):
        proc = _git(root, "merge-base", "HEAD", ref)
        if proc.returncode == 0 and proc.stdout.strip():
            return proc.stdout.strip()
    proc = _git(root, "rev-parse", "--verify", "-q", "HEAD")
    return proc.stdout.strip() if proc.returncode == 0 else None


def changed_entries(ls: tcmod.LockSet, root: pathlib.Path, entries: dict, base: str | None) -> dict:
    """Entries whose version or hashes differ from the lock at `base` (all when there is no base)."""
    if base is None:
        return entries
    proc = _git(root, "show", f"{base}:{ls.lock}")
    old = parse_lock(proc.stdout) if proc.returncode == 0 else {}
    return {n: e for n, e in entries.items() if _entry_key(old.get(n)) != _entry_key(e)}


def verify(names: list[str], cfg: tcmod.Config, root: pathlib.Path, find_links: list[str], base: str | None,
           download_all: bool, closure: bool = True) -> int:
    """Every lock line against the index: its hashes are files the index publishes for exactly that
    version (all lines), the changed lines' files downloaded and hashed, and every dependency locked."""
    from tools import lockverify

    failed = False
    for name in names:
        ls = cfg.lock_sets[name]
        lock_path = root / ls.lock
        if not lock_path.is_file():
            _print_problems([Problem(f"{ls.lock}: lock file missing", f"git checkout -- {ls.lock}")], ls, root)
            failed = True
            continue
        entries = parse_lock(lock_path.read_text(encoding="utf-8"))
        download = set(entries) if download_all else set(changed_entries(ls, root, entries, base))
        finder = lockverify.Finder([ls.index_url, *ls.extra_index_urls], find_links)
        problems, fetched = lockverify.provenance(ls.lock, entries, finder, ls.python, download)
        if closure:
            problems += lockverify.completeness(ls.lock, entries, finder, ls.python)
        for url, why in finder.down.items():
            print(f"     {ls.lock}: {url} unreachable ({why}); its files were taken from the local wheel folders "
                  f"{find_links or '(none given)'}")
        for f in fetched:
            if f.get("local"):
                print(f"     {ls.lock}: {f['filename']} hashed from the local wheel folder (its index is unreachable)")
        if problems:
            failed = True
            fix = (f"git checkout -- {ls.lock}" if _differs_from_head(root, ls.lock)
                   else f"tools/lock update {name} (hashes are taken fresh from the index)")
            retry = (f"run tools/lock verify {name} again once {', '.join(finder.down)} answers (a line not "
                     "checked is not known to be wrong: do not regenerate the lock for it)")
            _print_problems([Problem(p, retry if isinstance(p, lockverify.Unverified) else fix)
                             for p in problems], ls, root)
        else:
            hashes = sum(len(e["hashes"]) for e in entries.values())
            print(f"ok   {ls.lock} (index: {len(entries)} entries, {hashes} hashes published; {len(fetched)} "
                  f"files of "
                  f"{len(download)} changed entries downloaded and hashed"
                  f"{'; dependencies complete' if closure else ''})")
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
    ck.add_argument("--online", action="store_true", help="also re-resolve (fresh hashes) and diff")
    ck.add_argument("--find-links", action="append")
    vf = sub.add_parser("verify", help="every lock line against the index (provenance and completeness)")
    vf.add_argument("names", nargs="*")
    vf.add_argument("--since", help="download and hash the files of entries changed since this git revision "
                                    "(default: the merge base with the upstream branch, else HEAD)")
    vf.add_argument("--all", action="store_true", help="download and hash every entry's file")
    vf.add_argument("--find-links", action="append")
    ch = sub.add_parser("changed", help="print the lock sets whose lock or inputs changed since a git revision")
    ch.add_argument("--since", help="default: the merge base with the upstream branch, else HEAD")
    ap.add_argument("--root", default=os.environ.get("BUILD_WORKSPACE_DIRECTORY") or str(ROOT), help=argparse.SUPPRESS)
    ns = ap.parse_args(argv)
    root = pathlib.Path(ns.root).resolve()
    try:
        cfg = tcmod.load(root)
        names = getattr(ns, "names", None) or list(cfg.lock_sets)
        for n in names:
            if n not in cfg.lock_sets:
                raise LockError(
                    f"unknown toolchain {n!r}: deps/toolchains.toml defines {', '.join(cfg.lock_sets)}"
                )
        if ns.cmd == "update":
            upgrade = [f"--upgrade-package={p}" for p in ns.upgrade_package]
            update(names, cfg, root, _find_links(ns.find_links), upgrade)
            return 0
        if ns.cmd == "changed":
            base = ns.since or default_base(root)
            for name, ls in cfg.lock_sets.items():
                files = sorted({ls.lock, ls.input, *(f for _, _, f, _ in parse_in(ls.input, root))})
                if base is None or _git(root, "diff", "--quiet", base, "--", *files).returncode != 0:
                    print(name)
            return 0
        if ns.cmd == "verify":
            base = ns.since or default_base(root)
            return verify(names, cfg, root, _find_links(ns.find_links), base, ns.all)
        return check(names, cfg, root, ns.online, _find_links(ns.find_links))
    except (LockError, tcmod.ToolchainError) as exc:
        print(f"lock: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
