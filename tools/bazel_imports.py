"""Imports against Bazel deps: what `bazel test` would find missing at run time (issue #23, class 3).

For every py_library / py_binary / py_test of the evaluated graph (tools/bazel_graph.py), each
Python file the target runs (its srcs, and .py files in its data such as tests/conftest.py) is
parsed, and every import is resolved the way Gazelle's Python extension resolves it:
- the standard library, and the optional accelerators detected at run time (deep_gemm, deep_ep,
  imported inside try/except ImportError or through importlib), need nothing;
- a first-party module (rtp_fp8.*, tools.*, smoke.*, bench.*, and tests' `helpers`, `scratch`) must be a file
  in the srcs/data of the target or of a first-party target in its deps closure;
- a third-party module must map (THIRD_PARTY) to a distribution the target's deps name in the
  pip hub, in every toolchain branch of a select().
Also: every first-party .py file belongs to some target (a file no target owns never reaches
runfiles). Imports inside `if TYPE_CHECKING:` blocks are ignored.
"""

from __future__ import annotations

import ast
import functools
import pathlib
import sys

from tools.bazel_graph import canonical

FIRST_PARTY = {"rtp_fp8", "tools", "smoke", "bench", "suites"}
TEST_MODULES = {"helpers": "tests/helpers.py", "conftest": "tests/conftest.py", "scratch": "tests/scratch.py"}
OPTIONAL = {"deep_gemm", "deep_ep"}  # accelerators probed at run time, never locked
# import name -> distribution name (normalized like the hub's labels)
THIRD_PARTY = {
    "torch": "torch", "triton": "triton", "numpy": "numpy", "pytest": "pytest", "_pytest": "pytest",
    "hypothesis": "hypothesis", "safetensors": "safetensors", "starlark": "starlark_pyo3", "xdist": "pytest_xdist",
    "piptools": "pip_tools", "packaging": "packaging",
}
OWNED_DIRS = ("rtp_fp8", "tools", "smoke", "bench", "suites")


def _norm(pkg: str) -> str:
    return pkg.lower().replace("-", "_").replace(".", "_")


def _label_file(label: str, pkg: str) -> str | None:
    """'x.py' / ':x.py' / '//p:x.py' -> repo-relative path; None for target labels."""
    if label.startswith("@"):
        return None
    if label.startswith("//"):
        p, _, name = label[2:].partition(":")
        path = f"{p}/{name}" if p else name
    else:
        path = f"{pkg}/{label.lstrip(':')}" if pkg else label.lstrip(":")
    return path if path.endswith(".py") else None


def _target_label(label: str, pkg: str) -> str | None:
    """A deps entry naming a first-party target, canonical; None for pip hub labels."""
    return canonical(label, pkg) if label.startswith(("//", ":")) else None


def _branches(deps) -> dict[str, list[str]]:
    """deps (a list, possibly with select() placeholders) -> {branch: labels}; '' = unconditional."""
    out: dict[str, list[str]] = {"": []}
    for d in deps or []:
        if isinstance(d, dict) and "__select__" in d:
            for cond, labels in d["__select__"].items():
                out.setdefault(cond, []).extend(labels)
        else:
            out[""].append(d)
    return out


def _closure(graph, label: str, seen=None) -> set[str]:
    seen = set() if seen is None else seen
    if label in seen or label not in graph.targets:
        return seen
    seen.add(label)
    t = graph.targets[label]
    for labels in _branches(t.attrs.get("deps")).values():
        for d in labels:
            tl = _target_label(d, t.package)
            if tl:
                _closure(graph, tl, seen)
    return seen


def _files(t) -> set[str]:
    out = set()
    for key in ("srcs", "data"):
        for lab in t.attrs.get(key) or []:
            if isinstance(lab, str):
                f = _label_file(lab, t.package)
                if f:
                    out.add(f)
    return out


def _pypi(graph, closure: set[str]) -> dict[str, set[str]]:
    """{toolchain branch: distributions} over the closure's deps (the unconditional ones in every branch)."""
    per: dict[str, set[str]] = {}
    common: set[str] = set()
    for label in closure:
        for cond, labels in _branches(graph.targets[label].attrs.get("deps")).items():
            dists = {lab.split("//", 1)[1].split(":")[0] for lab in labels if lab.startswith("@pypi_")}
            (common if cond == "" else per.setdefault(cond, set())).update(dists)
    return {cond: {_norm(d) for d in s | common} for cond, s in (per or {"": set()}).items()}


def _guarded(node, parents) -> bool:
    """Inside try/except ImportError or `if TYPE_CHECKING:`."""
    p = parents.get(node)
    while p is not None:
        if isinstance(p, ast.Try) and any(
                isinstance(h.type, ast.Name) and h.type.id in ("ImportError", "ModuleNotFoundError")
                or isinstance(h.type, ast.Tuple) and any(getattr(e, "id", "") == "ImportError" for e in h.type.elts)
                for h in p.handlers):
            return True
        if isinstance(p, ast.If) and "TYPE_CHECKING" in ast.unparse(p.test):
            return True
        p = parents.get(p)
    return False


def imports(path: pathlib.Path) -> list[tuple[str, int]]:
    """(module, line) of every absolute import in a file, the guarded ones left out."""
    return _imports(str(path), path.read_text(encoding="utf-8"))


@functools.cache
def _imports(name: str, text: str) -> list[tuple[str, int]]:
    tree = ast.parse(text, name)
    parents = {c: n for n in ast.walk(tree) for c in ast.iter_child_nodes(n)}
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Import, ast.ImportFrom)) or _guarded(node, parents):
            continue
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.module, node.lineno))
            out += [(f"{node.module}.{a.name}", node.lineno) for a in node.names]  # a submodule, if one exists
    return out


def _module_file(root: pathlib.Path, mod: str) -> str | None:
    if mod in TEST_MODULES:
        return TEST_MODULES[mod]
    rel = mod.replace(".", "/")
    for cand in (f"{rel}.py", f"{rel}/__init__.py"):
        if (root / cand).is_file():
            return cand
    return None


def check(root: pathlib.Path, graph) -> list[str]:
    problems = []
    owned: set[str] = set()
    for label, t in sorted(graph.targets.items()):
        if t.kind not in ("py_library", "py_binary", "py_test"):
            continue
        own = _files(t)
        owned |= own
        closure = _closure(graph, label)
        provided = set().union(*(_files(graph.targets[c]) for c in closure))
        dists = _pypi(graph, closure)
        for f in sorted(own):
            path = root / f
            if not path.is_file():
                problems.append(f"{label}: source {f} does not exist")
                continue
            for mod, line in imports(path):
                top = mod.split(".")[0]
                if top in sys.stdlib_module_names or top == "__future__" or top in OPTIONAL:
                    continue
                if top in FIRST_PARTY or top in TEST_MODULES:
                    mf = _module_file(root, mod)
                    if mf is None:
                        if mod.count(".") and _module_file(root, mod.rsplit(".", 1)[0]):
                            continue  # `from pkg import name`: a name, not a submodule
                        problems.append(f"{label}: {f}:{line} imports {mod}, which no file provides")
                    elif mf not in provided:
                        problems.append(f"{label}: {f}:{line} imports {mod} ({mf}), which is in no srcs/data of "
                                        "its deps")
                    continue
                dist = THIRD_PARTY.get(top)
                if dist is None:
                    problems.append(f"{label}: {f}:{line} imports {top}, which maps to no known distribution "
                                    "(tools/bazel_imports.py THIRD_PARTY)")
                    continue
                missing = sorted(c or "(all)" for c, s in dists.items() if dist not in s)
                if missing:
                    problems.append(f"{label}: {f}:{line} imports {top} but its deps name no pip package {dist} "
                                    f"(branches {missing})")
    for d in OWNED_DIRS:
        for path in sorted((root / d).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            if rel not in owned:
                problems.append(f"{rel}: in no py_library/py_binary/py_test (never reaches runfiles)")
    return sorted(set(problems))
