"""Static check of the Bazel layer: evaluate MODULE.bazel, every BUILD.bazel and .bzl with
a Starlark interpreter (starlark-pyo3) against stub rules, then check the target graph.

    python3 -m tools.bazel_graph [ROOT]     # prints problems, exit 1 if any

The stubs record every call and reject attribute names the real rules do not have
(attribute lists from rules_python 2.3.2, rules_cuda 0.3.0, bazel_skylib and Bazel's
native rules), so a misspelled attribute fails here instead of on a user's machine.
Checks: every tests/**/test_*.py is the src of exactly one test target whose tags are
derived from the file's pytest markers; every toolchain of deps/toolchains.toml (and the
lock tool's set) has a pip hub, an `.update` and a non-manual `.test`; every label a
test_suite names exists; .bazelrc's CUDA archs and toolchain flags equal toolchains.toml's;
MODULE.bazel and .bazelversion agree with what the pinned modules need (bazel_facts.json);
every import of every Python target is provided by its deps (tools/bazel_imports.py).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import pathlib
import re
import sys

import starlark as sl

from tools import gen_test_build, wheel
from tools import toolchains as tcmod

COMMON = {
    "name", "visibility", "tags", "testonly", "deprecation", "features", "compatible_with",
    "target_compatible_with", "exec_compatible_with", "exec_properties", "restricted_to", "toolchains",
    "licenses", "applicable_licenses", "package_metadata", "aspect_hints", "exec_group_compatible_with",
}
TEST = {"args", "env", "env_inherit", "size", "timeout", "flaky", "shard_count", "local"}
BINARY = {"args", "env", "output_licenses"}
PY = {
    "srcs", "deps", "data", "imports", "srcs_version", "pyi_srcs", "pyi_deps", "precompile",
    "precompile_invalidation_mode", "precompile_optimize_level", "precompile_source_retention",
    "experimental_venvs_site_packages", "namespace_package_files",
}
PY_EXEC = {
    "main", "main_module", "python_version", "stamp", "legacy_create_init", "interpreter_args",
    "config_settings", "package_collisions", "pyc_collection", "bootstrap_impl", "venvs_use_declare_symlink",
}
RULES = {
    "py_library": COMMON | PY,
    "py_binary": COMMON | PY | PY_EXEC | BINARY,
    "py_test": COMMON | PY | PY_EXEC | TEST,
    "string_flag": COMMON | {"build_setting_default", "values", "scope", "make_variable"},
    "config_setting": COMMON | {"flag_values", "values", "define_values", "constraint_values"},
    "filegroup": COMMON | {"srcs", "data", "output_group"},
    "test_suite": COMMON | {"tests"},
    "alias": COMMON | {"actual"},
    "cuda_library": COMMON | {
        "srcs", "hdrs", "deps", "includes", "alwayslink", "rdc", "copts", "host_copts", "defines",
        "local_defines", "host_defines", "host_local_defines", "linkopts", "host_linkopts", "ptxasopts", "archs",
    },
    "genrule": COMMON | {
        "srcs", "outs", "cmd", "cmd_bash", "cmd_bat", "cmd_ps", "tools", "toolchains", "executable",
        "output_to_bindir", "local", "message", "stamp", "output_licenses",
    },
    "cc_binary": COMMON | BINARY | {
        "srcs", "deps", "data", "copts", "conlyopts", "cxxopts", "defines", "local_defines", "includes",
        "linkopts", "linkshared", "linkstatic", "malloc", "stamp", "additional_linker_inputs", "dynamic_deps",
        "hdrs_check", "link_extra_lib", "nocopts", "win_def_file", "module_interfaces", "reexport_deps",
    },
    "py_package": COMMON | {"deps", "packages"},
    "py_wheel": COMMON | {
        "distribution", "version", "python_tag", "abi", "platform", "compress", "stamp", "requires",
        "requires_file", "extra_requires", "extra_requires_files", "entry_points", "console_scripts", "author",
        "author_email", "homepage", "license", "classifiers", "project_urls", "python_requires", "summary",
        "description_file", "description_content_type", "strip_path_prefixes", "add_path_prefix", "data_files",
        "extra_distinfo_files", "config_settings", "deps", "twine", "twine_binary", "publish_args", "dist_folder",
    },
}
# Mandatory attributes (a missing one is a loading error in Bazel) and the values Bazel accepts for
# test attributes (Bazel's common test attributes: be/common-definitions#common-attributes-tests;
# rules_python 2.3.2 python/private/py_executable.bzl, py_wheel.bzl).
WHEEL_VERSION_KEY = "{STABLE_RTP_FP8_VERSION_%s}"
MANDATORY = {"py_binary": {"srcs"}, "py_test": {"srcs"}, "py_wheel": {"distribution", "version"},
             "genrule": {"outs"}, "test_suite": set(), "config_setting": set()}
VALUES = {"size": {"small", "medium", "large", "enormous"}, "timeout": {"short", "moderate", "long", "eternal"}}
MODULE_FUNCS = {
    "module": {"name", "version", "compatibility_level", "repo_name", "bazel_compatibility"},
    "bazel_dep": {"name", "version", "max_compatibility_level", "repo_name", "dev_dependency"},
}
EXT_TAGS = {
    # rules_python 2.3.2 python/extensions/config.bzl: tag classes add_transition_setting, explicit_init_py
    ("config", "explicit_init_py"): {"default"},
    ("config", "add_transition_setting"): {"setting"},
    ("python", "toolchain"): {"python_version", "is_default", "configure_coverage_tool", "ignore_root_user_error"},
    ("pip", "parse"): {
        "hub_name", "python_version", "requirements_lock", "requirements_linux", "requirements_darwin",
        "requirements_windows", "requirements_by_platform", "uv_lock", "experimental_index_url",
        "experimental_extra_index_urls", "experimental_index_url_overrides", "simpleapi_skip", "parallel_download",
        "download_only", "extra_pip_args", "environment", "isolated", "quiet", "timeout", "target_platforms",
        "whl_modifications", "experimental_requirement_cycles", "extra_hub_aliases",
        "enable_implicit_namespace_pkgs", "pip_data_exclude", "envsubst", "netrc", "auth_patterns",
        "python_interpreter", "python_interpreter_target",
    },
    ("pip", "whl_mods"): {
        "hub_name", "whl_name", "additive_build_content", "additive_build_content_file", "copy_executables",
        "copy_files", "data", "data_exclude_glob", "srcs_exclude_glob",
    },
    ("toolchain", "toolkit"): {"name", "toolkit_path", "version", "nvcc_version", "components_mapping"},
}
EXTENSIONS = {
    "@rules_python//python/extensions:config.bzl": "config",
    "@rules_python//python/extensions:python.bzl": "python",
    "@rules_python//python/extensions:pip.bzl": "pip",
    "@rules_cuda//cuda:extensions.bzl": "toolchain",
}
STUB_BZL = {
    "@rules_python//python:defs.bzl": ["py_library", "py_binary", "py_test"],
    "@rules_python//python:packaging.bzl": ["py_package", "py_wheel"],
    "@rules_cc//cc:defs.bzl": ["cc_binary"],
    "@bazel_skylib//rules:common_settings.bzl": ["string_flag"],
    "@rules_cuda//cuda:defs.bzl": ["cuda_library"],
}
# Non-rule functions of stubbed .bzl files: name -> what the stub returns.
# requires_cuda() stays loadable so that check_rule_hygiene can name it (its use is refused there).
STUB_FUNCS = {
    "@rules_cuda//cuda:defs.bzl": {"requires_cuda": lambda: ["@rules_cuda//cuda:is_enabled"]},
}
NATIVE = ["config_setting", "filegroup", "test_suite", "alias", "genrule"]


class GraphError(Exception):
    pass


@dataclasses.dataclass
class Target:
    kind: str
    package: str
    attrs: dict

    @property
    def label(self) -> str:
        return f"//{self.package}:{self.attrs['name']}"


@dataclasses.dataclass
class Graph:
    targets: dict = dataclasses.field(default_factory=dict)  # label -> Target
    exported: set = dataclasses.field(default_factory=set)  # labels of exported/source files
    module_calls: list = dataclasses.field(default_factory=list)  # (func, kwargs)
    ext_tags: list = dataclasses.field(default_factory=list)  # (ext, tag, kwargs)
    use_repo: list = dataclasses.field(default_factory=list)
    problems: list = dataclasses.field(default_factory=list)


class Evaluator:
    def __init__(self, root: pathlib.Path):
        self.root = root
        self.graph = Graph()
        self.pkg = ""
        self.bzl_cache: dict[str, sl.FrozenModule] = {}
        self.globals = sl.Globals.extended_by([sl.LibraryExtension.StructType])

    # ------------------------------------------------------------------ stubs
    def _rule(self, kind: str):
        allowed = RULES[kind]

        def rule(*args, **kw):
            if args:
                raise GraphError(f"{self.pkg or '.'}: {kind}() takes keyword arguments only")
            unknown = sorted(set(kw) - allowed)
            if unknown:
                raise GraphError(f"//{self.pkg}: {kind}(name={kw.get('name')!r}) has no attribute(s) {unknown}")
            if "name" not in kw:
                raise GraphError(f"//{self.pkg}: {kind}() without name")
            missing = sorted(MANDATORY.get(kind, set()) - set(kw))
            if missing:
                raise GraphError(f"//{self.pkg}: {kind}(name={kw['name']!r}) lacks mandatory {missing}")
            for attr, allowed_values in VALUES.items():
                if attr in kw and kind.endswith("_test") and kw[attr] not in allowed_values:
                    raise GraphError(f"//{self.pkg}: {kind}(name={kw['name']!r}) {attr} = {kw[attr]!r}, Bazel takes "
                                     f"{sorted(allowed_values)}")
            t = Target(kind, self.pkg, kw)
            if t.label in self.graph.targets:
                raise GraphError(f"{t.label} defined twice")
            self.graph.targets[t.label] = t
            return None

        return rule

    def _glob(self, include, exclude=(), allow_empty=True, **_):
        for pat in include:
            if re.search(r"\.(so|o|a|pyc)$|_build_info\.json$", pat):
                self.graph.problems.append(f"//{self.pkg}: glob({pat!r}) matches build outputs: a CLI build lying "
                                           "in the source tree (untracked) would leak into the graph and the wheel")
        base = self.root / self.pkg
        out = set()
        for path in base.rglob("*"):
            if not path.is_file():
                continue
            rel = path.relative_to(base).as_posix()
            # do not cross into sub-packages
            parts = pathlib.PurePosixPath(rel).parts
            if any((base / pathlib.PurePosixPath(*parts[:i]) / "BUILD.bazel").exists() for i in range(1, len(parts))):
                continue
            if any(_match(rel, p) for p in include) and not any(_match(rel, p) for p in exclude):
                out.add(rel)
        return sorted(out)

    def _exports(self, srcs, visibility=None, licenses=None):
        for s in srcs:
            self.graph.exported.add(f"//{self.pkg}:{s}")

    def _stub_module(self, label: str) -> sl.FrozenModule:
        m = sl.Module()
        for n in STUB_BZL[label]:
            m.add_callable(n, self._rule(n))
        for n, f in STUB_FUNCS.get(label, {}).items():
            m.add_callable(n, f)
        return m.freeze()

    def _base_module(self) -> sl.Module:
        m = sl.Module()
        for n in NATIVE:
            m.add_callable(n, self._rule(n))
        m.add_callable("glob", self._glob)
        # list-valued: in Bazel `list + select()` is valid; this keeps `+` working here
        m.add_callable("select", lambda d, no_match_error="": [{"__select__": d}])
        m.add_callable("exports_files", self._exports)
        m.add_callable("package", lambda **kw: None)
        # .bzl macros reach native rules through `native` (Bazel's native module)
        sl.eval(m, sl.parse("native.bzl", "native = struct(" + ", ".join(
            f"{n} = {n}" for n in [*NATIVE, "glob", "exports_files"]) + ")"), self.globals)
        return m

    # ------------------------------------------------------------------ loading
    def _label_path(self, label: str, pkg: str) -> pathlib.Path:
        if label.startswith(":"):
            return self.root / pkg / label[1:]
        if label.startswith("//"):
            p, _, f = label[2:].partition(":")
            return self.root / p / f
        raise GraphError(f"//{pkg}: cannot load {label!r}")

    def _loader(self, pkg: str):
        def load(label: str) -> sl.FrozenModule:
            if label in STUB_BZL:
                return self._stub_module(label)
            path = self._label_path(label, pkg)
            key = str(path)
            if key not in self.bzl_cache:
                if not path.exists():
                    raise GraphError(f"//{pkg}: load of missing file {label}")
                mod = self._base_module()
                rel_pkg = path.parent.relative_to(self.root).as_posix()
                ast = sl.parse(str(path.relative_to(self.root)), path.read_text(encoding="utf-8"))
                sl.eval(mod, ast, self.globals, sl.FileLoader(self._loader(rel_pkg if rel_pkg != "." else "")))
                self.bzl_cache[key] = mod.freeze()
            return self.bzl_cache[key]

        return load

    def eval_build(self, path: pathlib.Path) -> None:
        pkg = path.parent.relative_to(self.root).as_posix()
        self.pkg = "" if pkg == "." else pkg
        mod = self._base_module()
        ast = sl.parse(str(path.relative_to(self.root)), path.read_text(encoding="utf-8"))
        sl.eval(mod, ast, self.globals, sl.FileLoader(self._loader(self.pkg)))

    def eval_module(self) -> None:
        path = self.root / "MODULE.bazel"
        mod = sl.Module()
        g = self.graph

        def func(name):
            def f(*args, **kw):
                unknown = sorted(set(kw) - MODULE_FUNCS[name])
                if unknown:
                    raise GraphError(f"MODULE.bazel: {name}() has no attribute(s) {unknown}")
                g.module_calls.append((name, kw))

            return f

        for name in MODULE_FUNCS:
            mod.add_callable(name, func(name))

        def tag(ext, tag_name, kw):
            allowed = EXT_TAGS.get((ext, tag_name))
            if allowed is None:
                raise GraphError(f"MODULE.bazel: extension {ext!r} has no tag class {tag_name!r}")
            unknown = sorted(set(kw) - allowed)
            if unknown:
                raise GraphError(f"MODULE.bazel: {ext}.{tag_name}() has no attribute(s) {unknown}")
            g.ext_tags.append((ext, tag_name, kw))

        def ext_name(bzl, name):
            if EXTENSIONS.get(bzl) != name:
                raise GraphError(f"MODULE.bazel: unknown extension {bzl} % {name}")
            return name

        mod.add_callable("_tag", tag)
        mod.add_callable("_ext_name", ext_name)
        mod.add_callable("use_repo", lambda ext, *names, **kw: g.use_repo.extend((ext, n) for n in names))
        prelude = (
            "def use_extension(bzl, name, dev_dependency = False, isolate = False):\n"
            "    e = _ext_name(bzl, name)\n"
            "    return struct(_name = e,\n"
            "                  toolchain = lambda **kw: _tag(e, 'toolchain', kw),\n"
            "                  parse = lambda **kw: _tag(e, 'parse', kw),\n"
            "                  whl_mods = lambda **kw: _tag(e, 'whl_mods', kw),\n"
            "                  toolkit = lambda **kw: _tag(e, 'toolkit', kw),\n"
            "                  explicit_init_py = lambda **kw: _tag(e, 'explicit_init_py', kw),\n"
            "                  default = lambda **kw: _tag(e, 'default', kw))\n"
        )
        src = path.read_text(encoding="utf-8")
        src = re.sub(r"use_repo\((\w+),", r"use_repo(\1._name,", src)
        sl.eval(mod, sl.parse("MODULE.bazel", prelude + src), self.globals)


def _match(rel: str, pattern: str) -> bool:
    if "**" in pattern:
        regex = re.escape(pattern).replace(r"\*\*/", "(?:.*/)?").replace(r"\*\*", ".*").replace(r"\*", "[^/]*")
        return re.fullmatch(regex, rel) is not None
    return "/" not in rel and fnmatch.fnmatchcase(rel, pattern) if "/" not in pattern else fnmatch.fnmatchcase(
        rel, pattern)


def evaluate(root: pathlib.Path) -> Graph:
    ev = Evaluator(root)
    ev.eval_module()
    builds = sorted(p for p in root.rglob("BUILD.bazel") if not any(
        part.startswith(".") or part == "node_modules" for part in p.relative_to(root).parts))
    for b in builds:
        ev.eval_build(b)
    return ev.graph


def expected_tags(markers: list[str]) -> list[str]:
    """The rule of suites/defs.bzl gpu_tags(), restated independently."""
    ms = {"requires-network" if m == "requires_network" else m for m in markers}
    archs = {m for m in ms if m.startswith("gpu_sm")}
    tags = sorted(ms)
    if "gpu" in ms or "gpu_multi" in ms or archs:
        archs = archs or {"gpu_sm90", "gpu_sm100", "gpu_sm120"}
        extra = {m for m in ms if not m.startswith("gpu_sm") and m != "gpu"}
        tags = sorted({"gpu"} | archs | extra) + ["resources:gpu:2" if "gpu_multi" in ms else "resources:gpu:1"]
    # a network test is manual: //... must equal ./dev test, which runs offline
    return sorted(tags + ["manual"]) if "requires-network" in tags else tags


def _resolve(label: str, pkg: str) -> str:
    return f"//{pkg}{label}" if label.startswith(":") else label


def canonical(label: str, pkg: str) -> str:
    """A first-party label as `//pkg:name`: ':x' and 'x' are in pkg, '//p' means '//p:<last part of p>'."""
    full = _resolve(label, pkg) if label.startswith((":", "//")) else f"//{pkg}:{label}"
    return full if ":" in full else f"{full}:{full.rsplit('/', 1)[-1]}"


def item_labels(item) -> list[str]:
    """The labels of one attribute list entry: a label, or every branch of a select() placeholder."""
    if isinstance(item, dict) and "__select__" in item:
        return [lab for branch in item["__select__"].values() for lab in branch]
    return [item] if isinstance(item, str) else []


def check(root: pathlib.Path) -> list[str]:
    problems: list[str] = []
    try:
        g = evaluate(root)
    except (GraphError, sl.StarlarkError) as exc:
        return [f"evaluation failed: {exc}"]
    cfg = tcmod.load(root)

    # 1. test files <-> test targets, tags <-> markers
    owners: dict[str, list[str]] = {}
    for t in g.targets.values():
        if t.kind != "py_test" or t.package != "tests":
            continue
        src = t.attrs["srcs"][0]
        owners.setdefault(src, []).append(t.label)
        path = root / "tests" / src
        want = expected_tags(gen_test_build.file_markers(path)) if path.exists() else None
        if want is not None and list(t.attrs.get("tags", [])) != want:
            problems.append(f"{t.label}: tags {list(t.attrs.get('tags', []))} but {src}'s markers give {want}")
    for path in sorted((root / "tests").rglob("test_*.py")):
        rel = path.relative_to(root / "tests").as_posix()
        n = len(owners.get(rel, []))
        if n != 1:
            problems.append(f"tests/{rel}: belongs to {n} test targets (expected exactly 1)")

    # 2. toolchains: hub, .update, non-manual .test
    hubs = {kw["hub_name"]: kw for ext, tag, kw in g.ext_tags if (ext, tag) == ("pip", "parse")}
    repos = {n for ext, n in g.use_repo}
    used = set()
    for t in g.targets.values():
        for key in ("deps", "data", "srcs"):
            for item in t.attrs.get(key) or []:
                used |= {lab[1:].split("//")[0] for lab in item_labels(item) if lab.startswith("@pypi_")}
    for hub in sorted(set(hubs) - used):
        problems.append(f"MODULE.bazel: pip hub {hub!r} is used by no target (an unused hub is fetched for nothing)")
    for name, ls in cfg.lock_sets.items():
        hub = f"pypi_{name}"
        if ls.is_toolchain:  # the lock tool's own set is resolved by tools/lock in its venv, not a hub
            if hub not in hubs:
                problems.append(f"MODULE.bazel: no pip.parse(hub_name = {hub!r}) for toolchain {name!r}")
            else:
                want_lock = "//deps:" + pathlib.PurePosixPath(ls.lock).name
                if hubs[hub].get("requirements_lock") != want_lock:
                    problems.append(f"MODULE.bazel: {hub} requirements_lock {hubs[hub].get('requirements_lock')!r} "
                                    f"!= {want_lock!r}")
                if hubs[hub].get("python_version") != ls.python:
                    problems.append(f"MODULE.bazel: {hub} python_version != {ls.python}")
            if hub not in repos:
                problems.append(f"MODULE.bazel: use_repo lacks {hub!r}")
        upd = g.targets.get(f"//deps:{name}.update")
        if upd is None or upd.kind != "py_binary":
            problems.append(f"//deps:{name}.update missing (py_binary)")
        tst = g.targets.get(f"//deps:{name}.test")
        if tst is None or tst.kind != "py_test":
            problems.append(f"//deps:{name}.test missing (py_test)")
        elif "manual" in tst.attrs.get("tags", []):
            problems.append(f"//deps:{name}.test is tagged manual: CI would never run the lock check")
        elif list(tst.attrs.get("args", [])) != ["check", name]:
            problems.append(f"//deps:{name}.test must run `check {name}`")

    # 3. every label a suite names exists
    for t in g.targets.values():
        if t.kind != "test_suite":
            continue
        for lab in t.attrs.get("tests", []):
            full = _resolve(lab, t.package)
            if full not in g.targets:
                problems.append(f"{t.label}: names {lab}, which does not exist")

    problems += check_suites(g)

    # 4. .bazelrc archs and toolchain flags
    rc = (root / ".bazelrc").read_text(encoding="utf-8")
    for name, tc in cfg.toolchains.items():
        if f"common:{name} --//deps:toolchain={name}" not in rc:
            problems.append(f".bazelrc: config {name} does not set --//deps:toolchain={name}")
        m = re.search(rf"^common:{name} --@rules_cuda//cuda:archs=(\S+)$", rc, re.M)
        got = m.group(1).split(";") if m else []
        want = list(tc.nvcc_archs) + ([tcmod.ptx_arch(tc.nvcc_archs)] if tc.nvcc_archs else [])
        if got != want:
            problems.append(f".bazelrc: config {name} archs {got} != toolchains.{name}.nvcc_archs plus PTX "
                            f"for the newest {want}")
        # CUDA toolchains: torch's headers/libs reach //csrc through the hub's torch_cc alias
        hub = hubs.get(f"pypi_{name}", {})
        if tc.cuda and (dict(hub.get("extra_hub_aliases", {})).get("torch") != ["torch_cc"]
                        or "torch" not in dict(hub.get("whl_modifications", {})).values()):
            problems.append(f"MODULE.bazel: pypi_{name} lacks the torch whl_modifications / torch_cc alias "
                            "that //csrc links against")

    # 5. the CUDA extension: every csrc/*.cu in a cuda_library linked into //csrc:_C.so;
    #    archs only from the toolchain config (rules_cuda rejects -gencode/-arch in copts)
    ext = g.targets.get("//csrc:_C.so")
    if ext is None or ext.kind != "cc_binary" or not ext.attrs.get("linkshared"):
        problems.append("//csrc:_C.so missing (cc_binary, linkshared)")
    else:
        libs = [g.targets.get(_resolve(d, "csrc")) for d in ext.attrs.get("deps", [])]
        cu = {s for lib in libs if lib is not None and lib.kind == "cuda_library" for s in lib.attrs.get("srcs", [])}
        for path in sorted((root / "csrc").glob("*.cu")):
            if path.name not in cu:
                problems.append(f"csrc/{path.name}: in no cuda_library linked into //csrc:_C.so")
        for lib in libs:
            if lib is not None and lib.kind == "cuda_library":
                if "archs" in lib.attrs:
                    problems.append(f"{lib.label}: sets archs; they must come from the toolchain's .bazelrc config")
                bad = [c for c in lib.attrs.get("copts", []) if c.startswith(("-gencode", "-arch", "-code", "-rdc"))]
                if bad:
                    problems.append(f"{lib.label}: copts {bad} (rules_cuda rejects these)")

    # 6. the wheel's version is the source's, as ./dev wheel computes it (tools/wheel.py
    # wheel_version, printed by tools/workspace_status.sh into the stamped key); the module's
    # version is the release it heads for (rtp_fp8/__init__.py)
    try:
        ver = wheel.version(root)
    except wheel.WheelError as exc:
        ver = None
        problems.append(str(exc))
    whl = g.targets.get("//:wheel")
    if whl is None or whl.kind != "py_wheel":
        problems.append("//:wheel missing (py_wheel)")
    else:
        toolchains = list(tcmod.load(root).toolchains)
        want = {"__select__": {f"//deps:is_{tc}": WHEEL_VERSION_KEY % tc for tc in toolchains}}
        if whl.attrs.get("version") != [want] or whl.attrs.get("stamp") != 1:
            problems.append(f"//:wheel: version must be per_toolchain({WHEEL_VERSION_KEY!r}) with stamp = 1 (the "
                            f"version changes with the source), got {whl.attrs.get('version')!r}, "
                            f"stamp {whl.attrs.get('stamp')!r}")
        status = (root / "tools/workspace_status.sh").read_text() if (root / "tools/workspace_status.sh").exists() \
            else ""
        if not any("tools/wheel.py --workspace-status" in ln and not ln.lstrip().startswith("#")
                   for ln in status.splitlines()):
            problems.append("tools/workspace_status.sh must print the wheel versions from "
                            "`tools/wheel.py --workspace-status`")
    for fn, kw in g.module_calls:
        if fn == "module" and kw.get("version") != ver:
            problems.append(f"MODULE.bazel: module version {kw.get('version')!r} != rtp_fp8.__version__ {ver!r}")
    problems += check_module_layer(root)
    problems += check_init_py(root, g)
    problems += check_rule_hygiene(root, g)
    from tools import bazel_imports

    problems += bazel_imports.check(root, g)
    return problems


FACTS = pathlib.Path(__file__).with_name("bazel_facts.json")


def _v(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text)[:3])


def check_module_layer(root: pathlib.Path, facts_path: pathlib.Path = FACTS) -> list[str]:
    """MODULE.bazel's bazel_deps and .bazelversion against the recorded facts of the pinned modules:
    every dependency a pinned module declares must not be newer than our own pin of it (else Bazel's
    minimal version selection silently upgrades ours), and every MODULE.bazel function a pinned
    module calls must exist in the Bazel of .bazelversion (else module resolution fails)."""
    import json

    facts = json.loads(facts_path.read_text())
    src = (root / "MODULE.bazel").read_text(encoding="utf-8")
    ours = dict(re.findall(r'bazel_dep\(\s*name\s*=\s*"([^"]+)",\s*version\s*=\s*"([^"]+)"', src))
    bazel = (root / ".bazelversion").read_text().strip()
    problems = []
    for name, version in sorted(ours.items()):
        known = facts["modules"].get(name, {}).get(version)
        if name in facts["modules"] and known is None:
            problems.append(f"MODULE.bazel: {name} {version} has no recorded facts in {facts_path.name} "
                            f"(recorded: {sorted(facts['modules'][name])}); read its MODULE.bazel at that tag first")
            continue
        if known is None:
            continue
        for dep, need in sorted(known["bazel_deps"].items()):
            if dep in ours and _v(ours[dep]) < _v(need):
                problems.append(f"MODULE.bazel: bazel_dep {dep} {ours[dep]} is older than {name} {version} requires "
                                f"({need}; {known['source']}): resolution would silently upgrade it")
        for fn in known["module_functions"]:
            mins = facts["module_functions"][fn]["min_bazel"]
            want = mins.get(str(_v(bazel)[0]))
            if want is None or _v(bazel) < _v(want):
                problems.append(f".bazelversion {bazel}: {name} {version} calls {fn}() in its MODULE.bazel, which "
                                f"Bazel accepts from {mins} ({facts['module_functions'][fn]['source']})")
    return problems


def _is_test(t: Target) -> bool:
    return t.kind.endswith("_test")


def expand_suite(g: Graph, label: str, _seen=None) -> set[str]:
    """The tests `bazel test <suite>` runs, by Bazel's test_suite rules (be/general.html#test_suite):
    `tags` filter (all positive, no negative) the tests named directly in `tests` only; a nested
    test_suite is expanded by its own rules and merged unfiltered; with no `tests`, every test of
    the suite's package that is not `manual` and passes the filter."""
    _seen = set() if _seen is None else _seen
    if label in _seen:
        return set()
    _seen.add(label)
    t = g.targets[label]
    tags = list(t.attrs.get("tags", []))
    pos, neg = [x for x in tags if not x.startswith("-")], [x[1:] for x in tags if x.startswith("-")]

    def passes(x: Target) -> bool:
        have = x.attrs.get("tags", [])
        return all(p in have for p in pos) and not any(n in have for n in neg)

    names = t.attrs.get("tests") or []
    if not names:
        return {x.label for x in g.targets.values() if x.package == t.package and _is_test(x)
                and "manual" not in x.attrs.get("tags", []) and passes(x)}
    out: set[str] = set()
    for lab in names:
        full = _resolve(lab, t.package)
        x = g.targets.get(full)
        if x is None:
            continue
        if x.kind == "test_suite":
            out |= expand_suite(g, full, _seen)
        elif passes(x):
            out.add(full)
    return out


def check_suites(g: Graph) -> list[str]:
    """//suites:<arch> must select exactly the tests `./dev gpu-test` runs on that arch (pytest's
    gpu marker with that arch marker, or none: test files whose tags carry gpu_<arch>)."""
    problems = []
    for arch in ("sm90", "sm100", "sm120"):
        label = f"//suites:{arch}"
        if label not in g.targets:
            problems.append(f"{label} missing")
            continue
        want = {t.label for t in g.targets.values() if t.package == "tests" and _is_test(t)
                and f"gpu_{arch}" in t.attrs.get("tags", [])}
        got = {x for x in expand_suite(g, label) if x.startswith("//tests:")}
        if got != want:
            extra, missing = sorted(got - want), sorted(want - got)
            problems.append(f"{label} selects {len(got)} tests, the pytest markers {len(want)}: extra {extra[:3]}"
                            f"{'...' if len(extra) > 3 else ''}, missing {missing[:3]}")
    return problems


def _visible(t: Target, pkg: str) -> bool:
    """Bazel's visibility of target t from package pkg (default: private to t's package)."""
    for v in t.attrs.get("visibility") or []:
        if v == "//visibility:public":
            return True
        p, _, kind = v[2:].partition(":")
        if kind == "__pkg__" and p == pkg or kind == "__subpackages__" and (pkg == p or pkg.startswith(p + "/")):
            return True
    return False


def check_rule_hygiene(root: pathlib.Path, g: Graph) -> list[str]:
    """Issue #23 defect classes 4, 7 and 10, each against what the real rules do:
    - a cuda_library whose sources register ops with TORCH_LIBRARY (static initialisers nothing
      references) must be alwayslink, or the shared object linked from it loads with no ops;
    - no -O flag in cuda_library copts (rules_cuda sets it per compilation mode);
    - a requires-network test is manual (so //... stays offline, = ./dev test) and inherits
      PIP_FIND_LINKS (the lock tool's stand-in for an unreachable index);
    - no exclusive-if-local (it also serialises remote runs, Bazel issue 17834; resources:gpu:1
      does the local job)."""
    problems = list(g.problems)
    for t in g.targets.values():
        if t.kind == "cuda_library":
            srcs = [root / t.package / s for s in t.attrs.get("srcs", []) if isinstance(s, str)]
            if any(p.is_file() and "TORCH_LIBRARY" in p.read_text(errors="replace") for p in srcs) \
                    and t.attrs.get("alwayslink") is not True:
                problems.append(f"{t.label}: registers ops with TORCH_LIBRARY but is not alwayslink = True: the "
                                "linker drops the static initialisers and the .so has no ops")
            opt = [c for c in t.attrs.get("copts", []) if isinstance(c, str) and re.match(r"-O\d?$", c)]
            if opt:
                problems.append(f"{t.label}: copts {opt} fight rules_cuda's per-mode optimisation flags")
        tags = t.attrs.get("tags", []) if isinstance(t.attrs.get("tags"), list) else []
        if "exclusive-if-local" in tags:
            problems.append(f"{t.label}: exclusive-if-local also serialises remote runs (Bazel issue 17834)")
        if _is_test(t) and "requires-network" in tags:
            if "manual" not in tags:
                problems.append(f"{t.label}: requires-network but not manual: `bazel test //...` would need the "
                                "network (./dev test runs offline)")
            if t.package == "deps" and "PIP_FIND_LINKS" not in (t.attrs.get("env_inherit") or []):
                problems.append(f"{t.label}: does not inherit PIP_FIND_LINKS")
    for t in g.targets.values():  # every first-party label names a target or an existing file
        for key in ("srcs", "data", "deps", "tests", "main", "actual"):
            v = t.attrs.get(key)
            for item in v if isinstance(v, list) else [v] if v else []:
                for lab in item_labels(item):
                    if lab.startswith("@"):
                        continue
                    full = canonical(lab, t.package)
                    if full in g.targets:
                        dep = g.targets[full]
                        if dep.package != t.package and not _visible(dep, t.package):
                            problems.append(f"{t.label}: {key} names {full}, which is not visible to //{t.package} "
                                            f"(visibility {dep.attrs.get('visibility', ['private'])})")
                        continue
                    pkg, _, name = full[2:].partition(":")
                    if not (root / pkg / name).is_file():
                        problems.append(f"{t.label}: {key} names {lab}, which is neither a target nor a file")
    for t in g.targets.values():  # rules_python: `main` must be one of the srcs
        if t.kind in ("py_binary", "py_test") and t.attrs.get("main"):
            srcs = [canonical(s, t.package) for s in t.attrs.get("srcs", []) if isinstance(s, str)]
            m = t.attrs["main"]
            if canonical(m, t.package) not in srcs:
                problems.append(f"{t.label}: main {m} is not in srcs {t.attrs.get('srcs')}")
    rc = (root / ".bazelrc").read_text(encoding="utf-8")
    if not re.search(r"^common --@rules_cuda//cuda:enable=false$", rc, re.M):
        problems.append(".bazelrc: no `common --@rules_cuda//cuda:enable=false`: with no --config, rules_cuda "
                        "compiles the .cu wherever it detects a toolkit (without torch's headers)")
    for name, tc in tcmod.load(root).toolchains.items():
        if tc.cuda:
            for line in (f"common:{name} --@rules_cuda//cuda:enable=true", f"common:{name} --repo_env=CUDA_PATH"):
                if not re.search(rf"^{re.escape(line)}$", rc, re.M):
                    problems.append(f".bazelrc: config {name} lacks `{line}`")
    for path in sorted(root.rglob("BUILD.bazel")):
        if ".venv" not in path.parts and "requires_cuda()" in path.read_text(encoding="utf-8"):
            problems.append(f"{path.relative_to(root)}: requires_cuda() also skips a target when no toolkit is "
                            "found, so a cuda config on a machine without one reads green: use cuda_only()")
    tv = g.targets.get("//csrc:toolkit_version")
    if tv is None or not _is_test(tv):
        problems.append("//csrc:toolkit_version missing: nothing checks that the toolkit is the config's CUDA")
    for t in g.targets.values():
        if not _is_test(t):
            continue
        stamped = sorted(x for x in _closure_all(g, t.label) if g.targets[x].attrs.get("stamp") == 1
                         and g.targets[x].kind == "genrule")
        if stamped:
            problems.append(f"{t.label}: depends on stamped {stamped[0]}: it reruns on every commit and its "
                            "result is never shared through a remote cache (stamp only what the wheel needs)")
    return problems


def _closure_all(g: Graph, label: str, seen=None) -> set[str]:
    """Targets reachable through deps, data and srcs (every select() branch)."""
    seen = set() if seen is None else seen
    if label in seen or label not in g.targets:
        return seen
    seen.add(label)
    t = g.targets[label]
    for key in ("deps", "data", "srcs"):
        for item in t.attrs.get(key) or []:
            for lab in item_labels(item):
                if lab.startswith(("//", ":")):
                    _closure_all(g, canonical(lab, t.package), seen)
    return seen


def check_init_py(root: pathlib.Path, g: Graph) -> list[str]:
    """rules_python 2.3.2 still generates missing __init__.py files in runfiles by default (py_test's
    legacy_create_init=-1 means auto: true unless the module's config.explicit_init_py(default=True) or
    --incompatible_default_to_explicit_init_py; python/private/py_executable.bzl). A generated
    tests/__init__.py makes `tests` a package, and `from helpers import ...` (tests/helpers.py as a
    top-level module) fails. So: a test importing `helpers` needs explicit __init__.py in force."""
    explicit = any(ext == "config" and tag == "explicit_init_py" and kw.get("default") is True
                   for ext, tag, kw in g.ext_tags)
    if explicit:
        return []
    from tools import bazel_imports

    problems = []
    for t in g.targets.values():
        if t.kind != "py_test" or t.attrs.get("legacy_create_init") == 0:
            continue
        for f in sorted(bazel_imports._files(t)):
            if (root / f).is_file() and any(m == "helpers" for m, _ in bazel_imports.imports(root / f)):
                problems.append(f"{t.label}: {f} imports helpers as a top-level module, but rules_python generates "
                                "tests/__init__.py in its runfiles (no config.explicit_init_py(default = True) in "
                                "MODULE.bazel, no legacy_create_init = 0)")
                break
    return problems


def main(argv: list[str]) -> int:
    root = pathlib.Path(argv[0]).resolve() if argv else tcmod.REPO_ROOT
    problems = check(root)
    for p in problems:
        print(f"FAIL {p}")
    if not problems:
        print("ok   Bazel graph")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
