"""The Bazel layer, checked statically: the graph of the real files passes, and
deliberately broken copies each fail with a message naming what is wrong."""

import pathlib
import shutil
import subprocess
import sys

import pytest

pytest.importorskip("starlark", reason="needs starlark-pyo3 (in the cpu lock; not on this machine)")

from tools import bazel_graph, gen_test_build  # noqa: E402
from tools import toolchains as tcmod  # noqa: E402

ROOT = tcmod.REPO_ROOT


def test_graph_of_main_passes():
    assert bazel_graph.check(ROOT) == []


def test_tests_build_file_is_current():
    assert gen_test_build.main(["--check"]) == 0


def test_every_toolchain_has_hub_update_and_unmanual_test():
    g = bazel_graph.evaluate(ROOT)
    hubs = {kw["hub_name"] for ext, tag, kw in g.ext_tags if tag == "parse"}
    cfg = tcmod.load(ROOT)
    for name in cfg.lock_sets:
        assert (f"pypi_{name}" in hubs) == (name in cfg.toolchains)  # the lock tool's set needs no hub
        assert g.targets[f"//deps:{name}.update"].attrs["args"] == ["update", name]
        t = g.targets[f"//deps:{name}.test"]
        assert "manual" not in t.attrs.get("tags", []) and t.attrs["args"] == ["check", name]
        online = g.targets[f"//deps:{name}.online_test"]
        assert "requires-network" in online.attrs["tags"]


def test_gpu_test_tags():
    g = bazel_graph.evaluate(ROOT)
    t = g.targets["//tests:quant_test_token_group"]
    assert t.attrs["tags"] == ["gpu", "gpu_sm100", "gpu_sm120", "gpu_sm90", "resources:gpu:1"]
    assert t.attrs["exec_properties"] == {"test.Pool": "gpu"}
    assert bazel_graph.expected_tags(["gpu_sm100"]) == ["gpu", "gpu_sm100", "resources:gpu:1"]
    assert g.targets["//tests:moe_test_dist_multigpu"].attrs["tags"] == [
        "gpu", "gpu_multi", "gpu_sm100", "gpu_sm120", "gpu_sm90", "resources:gpu:2"]  # asks Bazel for 2 GPUs
    assert bazel_graph.expected_tags(["requires_network"]) == ["manual", "requires-network"]
    assert g.targets["//tests:tools_test_wheel_online"].attrs["tags"] == ["manual", "requires-network"]  # pip
    assert g.targets["//tests:tools_test_wheel"].attrs["tags"] == []  # its offline tests stay in //...


@pytest.fixture
def copy(tmp_path):
    ignore = shutil.ignore_patterns(".git", ".venv", ".venv-lock", "node_modules", "__pycache__", ".*cache*")
    shutil.copytree(ROOT, tmp_path / "r", ignore=ignore)
    _writable(tmp_path / "r")
    return tmp_path / "r"


def _writable(root: pathlib.Path):
    """Copies of a read-only tree (Bazel's runfiles) keep its modes: make them writable."""
    for p in [root, *root.rglob("*")]:
        p.chmod(p.stat().st_mode | 0o200)


def _edit(path: pathlib.Path, old: str, new: str):
    text = path.read_text()
    assert old in text, f"{old!r} not in {path}"
    path.write_text(text.replace(old, new, 1))


def _fails(root, needle):
    problems = bazel_graph.check(root)
    assert any(needle in p for p in problems), problems


def test_test_file_without_target_fails(copy):
    (copy / "tests/quant/test_orphan.py").write_text("def test_x():\n    pass\n")
    _fails(copy, "tests/quant/test_orphan.py: belongs to 0 test targets")


def test_manual_lock_test_fails(copy):
    _edit(copy / "deps/BUILD.bazel", 'size = "small",', 'size = "small",\n    tags = ["manual"],')
    _fails(copy, "//deps:cpu.test is tagged manual")


@pytest.mark.parametrize(
    "path,old,new,needle",
    [
        ("rtp_fp8/BUILD.bazel", 'imports = [".."],', 'importz = [".."],', "has no attribute(s) ['importz']"),
        ("MODULE.bazel", 'requirements_lock = "//deps:requirements_lock_cpu.txt"',
         'requirement_lock = "//deps:requirements_lock_cpu.txt"',
         "pip.parse() has no attribute(s) ['requirement_lock']"),
        ("suites/defs.bzl", "exec_properties =", "exec_propertys =", "has no attribute(s) ['exec_propertys']"),
    ],
)
def test_misspelled_attribute_fails(copy, path, old, new, needle):
    _edit(copy / path, old, new)
    _fails(copy, needle)


def test_tag_marker_mismatch_fails(copy):
    _edit(copy / "tests/BUILD.bazel", '    src = "quant/test_token_group.py",\n    markers = ["gpu"],',
          '    src = "quant/test_token_group.py",')
    _fails(copy, "//tests:quant_test_token_group: tags [] but quant/test_token_group.py's markers give")


def test_arch_mismatch_fails(copy):
    _edit(copy / ".bazelrc", "common:cuda13_0 --@rules_cuda//cuda:archs=sm_90a;sm_100a;sm_120a;compute_120",
          "common:cuda13_0 --@rules_cuda//cuda:archs=sm_90a;sm_100a;compute_120")
    _fails(copy, ".bazelrc: config cuda13_0 archs ['sm_90a', 'sm_100a', 'compute_120'] != toolchains.cuda13_0")


def test_missing_hub_and_dangling_suite_label_fail(copy):
    _edit(copy / "MODULE.bazel", '"pypi_cuda12_8", ', "")
    _edit(copy / "suites/BUILD.bazel", '"//deps:tools.test",', '"//deps:tools.test",\n        "//deps:nope.test",')
    problems = bazel_graph.check(copy)
    assert any("use_repo lacks 'pypi_cuda12_8'" in p for p in problems), problems
    assert any("names //deps:nope.test, which does not exist" in p for p in problems), problems


def test_cli_exit_codes(copy):
    ok = subprocess.run([sys.executable, "-m", "tools.bazel_graph", str(ROOT)], cwd=ROOT, capture_output=True)
    assert ok.returncode == 0
    (copy / "tests/test_orphan2.py").write_text("def test_x():\n    pass\n")
    bad = subprocess.run([sys.executable, "-m", "tools.bazel_graph", str(copy)], cwd=ROOT, capture_output=True,
                         text=True)
    assert bad.returncode == 1 and "test_orphan2.py" in bad.stdout


def test_extension_wheel_and_smoke_targets_exist():
    g = bazel_graph.evaluate(ROOT)
    lib = g.targets["//csrc:per_token_group_quant_8bit"]
    assert lib.kind == "cuda_library" and lib.attrs["srcs"] == ["per_token_group_quant_8bit.cu"]
    assert g.targets["//csrc:_C.so"].attrs["linkshared"] is True
    assert g.targets["//:wheel"].kind == "py_wheel"
    assert g.targets["//rtp_fp8:build_info"].attrs["stamp"] == 1
    for arch in ("cpu", "sm90", "sm100", "sm120"):
        t = g.targets[f"//smoke:smoke_{arch}"]
        assert t.attrs["args"] == ["--arch", arch]
        assert ("gpu_" + arch in t.attrs["tags"]) == (arch != "cpu")
        assert g.targets[f"//suites:smoke_{arch}"].attrs["tests"] == [f"//smoke:smoke_{arch}"]


def test_cu_file_outside_the_extension_fails(copy):
    (copy / "csrc/extra_kernel.cu").write_text("// not in any cuda_library\n")
    _fails(copy, "csrc/extra_kernel.cu: in no cuda_library linked into //csrc:_C.so")


@pytest.mark.parametrize(
    "path,old,new,needle",
    [
        ("csrc/BUILD.bazel", '    local_defines = ["NDEBUG"],',
         '    archs = ["sm_90a"],\n    local_defines = ["NDEBUG"],', "//csrc:per_token_group_quant_8bit: sets archs"),
        ("BUILD.bazel", '    version = per_toolchain("{STABLE_RTP_FP8_VERSION_%s}"),', '    version = "0.1.0",',
         "//:wheel: version must be per_toolchain('{STABLE_RTP_FP8_VERSION_%s}') with stamp = 1"),
        ("tools/workspace_status.sh", "python3 tools/wheel.py --workspace-status", "echo 0.1.0",
         "tools/workspace_status.sh must print the wheel versions"),
        ("MODULE.bazel", '    extra_hub_aliases = {"torch": ["torch_cc"]},\n    hub_name = "pypi_cuda13_0",',
         '    hub_name = "pypi_cuda13_0",', "pypi_cuda13_0 lacks the torch whl_modifications / torch_cc alias"),
    ],
    ids=["archs-on-cuda_library", "wheel-version-fixed", "wheel-version-not-stamped", "torch_cc-alias-missing"],
)
def test_extension_and_wheel_drift_fails(copy, path, old, new, needle):
    _edit(copy / path, old, new)
    _fails(copy, needle)


@pytest.mark.parametrize(
    "path,old,new,needle",
    [
        (".bazelversion", "8.5.0", "8.4.2", ".bazelversion 8.4.2: rules_python 2.3.2 calls flag_alias()"),
        (".bazelversion", "8.5.0", "7.6.1", ".bazelversion 7.6.1: rules_python 2.3.2 calls flag_alias()"),
        ("MODULE.bazel", 'name = "bazel_skylib", version = "1.8.2"', 'name = "bazel_skylib", version = "1.8.1"',
         "bazel_dep bazel_skylib 1.8.1 is older than rules_python 2.3.2 requires (1.8.2"),
        ("MODULE.bazel", 'name = "rules_cc", version = "0.2.17"', 'name = "rules_cc", version = "0.1.1"',
         "bazel_dep rules_cc 0.1.1 is older than rules_cuda 0.3.0 requires (0.2.14"),
        ("MODULE.bazel", 'name = "rules_python", version = "2.3.2"', 'name = "rules_python", version = "2.3.1"',
         "rules_python 2.3.1 has no recorded facts"),
    ],
    ids=["bazel-8.4.2-lacks-flag_alias", "bazel-7", "skylib-below-rules_python", "rules_cc-below-rules_cuda",
         "unrecorded-rules_python"],
)
def test_module_layer_against_the_recorded_facts(copy, path, old, new, needle):
    """Defect class 1 of issue #23: a module set that real Bazel cannot resolve, or resolves by silently
    upgrading our pins. The facts (tools/bazel_facts.json) were read at the pinned tags."""
    assert bazel_graph.check_module_layer(copy) == []
    _edit(copy / path, old, new)
    _fails(copy, needle)


@pytest.mark.parametrize(
    "path,old,new,needle",
    [
        ("rtp_fp8/loader/BUILD.bazel", '] + pypi(["safetensors"]),', "],",
         "rtp_fp8/loader/online_fp8.py:52 imports safetensors but its deps name no pip package safetensors"),
        ("tests/BUILD.bazel", '    deps = ["//tools:build_ext_lib"],\n', "",
         "//tests:csrc_test_cuda_quant: tests/csrc/test_cuda_quant.py:15 imports tools.build_ext"),
        ("tools/BUILD.bazel", '] + pypi(["starlark-pyo3"]),', "],",
         "imports starlark but its deps name no pip package starlark_pyo3"),
        ("rtp_fp8/moe/BUILD.bazel", '        "//rtp_fp8/gemm/triton",\n', "",
         "//rtp_fp8/moe:moe: rtp_fp8/moe/executors.py:42 imports rtp_fp8.gemm.triton"),
        ("tools/BUILD.bazel", '        "bazel_imports.py",\n', "",
         "tools/bazel_imports.py: in no py_library/py_binary/py_test"),
    ],
    ids=["safetensors-undeclared", "tools.build_ext-undeclared", "starlark-undeclared", "first-party-dep-missing",
         "file-in-no-target"],
)
def test_imports_are_provided_by_deps(copy, path, old, new, needle):
    """Defect class 3 of issue #23: an import no dep provides passes a stub evaluation but fails in
    `bazel test` (ModuleNotFoundError in the runfiles)."""
    _edit(copy / path, old, new)
    _fails(copy, needle)


def test_generated_init_py_would_break_helpers_imports(copy):
    """Defect class 2 of issue #23: without explicit __init__.py in force, rules_python 2.3.2 generates
    tests/__init__.py in the runfiles and `from helpers import ...` fails under bazel test."""
    assert bazel_graph.check(copy) == []
    _edit(copy / "MODULE.bazel", "rules_python_config.explicit_init_py(default = True)\n", "")
    _fails(copy, "//tests:gemm_test_linear: tests/gemm/test_linear.py imports helpers as a top-level module")
    _edit(copy / "MODULE.bazel", 'use_extension("@rules_python//python/extensions:config.bzl", "config")',
          'use_extension("@rules_python//python/extensions:config.bzl", "config")\n'
          "rules_python_config.explicit_init_py(default = False)")
    _fails(copy, "imports helpers as a top-level module")


def test_arch_suites_select_what_pytest_selects(copy):
    """Defect class 6 of issue #23: a test_suite's tag filter does not reach a nested suite, so a
    suite `tags = ["gpu_sm90"], tests = ["//tests:all_tests"]` runs every test. The checker expands
    suites with Bazel's rules and compares with the pytest marker selection."""
    g = bazel_graph.evaluate(copy)
    sm90 = bazel_graph.expand_suite(g, "//suites:sm90")
    assert "//tests:gemm_test_sm90_ws" in sm90 and "//tests:tools_test_lock_tool" not in sm90
    assert "//tests:gemm_test_sm90_ws" not in bazel_graph.expand_suite(g, "//suites:sm100")
    _edit(copy / "suites/BUILD.bazel", '''[test_suite(
    name = arch,
    tests = ["//tests:gpu_" + arch],''', '''[test_suite(
    name = arch,
    tags = ["gpu_" + arch],
    tests = ["//tests:all_tests"],''')
    _fails(copy, "//suites:sm90 selects")


@pytest.mark.parametrize(
    "path,old,new,needle",
    [
        ("csrc/BUILD.bazel", "    alwayslink = True,\n", "",
         "//csrc:per_token_group_quant_8bit: registers ops with TORCH_LIBRARY but is not alwayslink"),
        ("csrc/BUILD.bazel", '        "-std=c++20",\n', '        "-std=c++20",\n        "-O3",\n',
         "copts ['-O3'] fight rules_cuda's per-mode optimisation flags"),
        ("rtp_fp8/BUILD.bazel", "    data = select({",
         '    data = glob(\n        ["_C*.so"],\n        allow_empty = True,\n    ) + select({',
         "glob('_C*.so') matches build outputs"),
        ("deps/BUILD.bazel", '        "manual",\n        "no-remote-exec",', '        "no-remote-exec",',
         "//deps:cpu.online_test: requires-network but not manual"),
        ("deps/BUILD.bazel", '    env_inherit = ["PIP_FIND_LINKS"],\n', "",
         "//deps:cpu.online_test: does not inherit PIP_FIND_LINKS"),
        ("suites/defs.bzl",
         '        tags = tags + ["resources:gpu:2" if "gpu_multi" in markers else "resources:gpu:1"]',
         '        tags = tags + ["exclusive-if-local", "resources:gpu:2" if "gpu_multi" in markers else '
         '"resources:gpu:1"]', "exclusive-if-local also serialises"),
    ],
    ids=["no-alwayslink", "O3-in-copts", "glob-of-built-so", "network-test-in-wildcard", "no-find-links",
         "exclusive-if-local"],
)
def test_rule_hygiene(copy, path, old, new, needle):
    """Defect classes 4, 7, 9 and 10 of issue #23, each reproduced on a copy and caught."""
    _edit(copy / path, old, new)
    _fails(copy, needle)


def test_no_test_depends_on_a_stamped_action(copy):
    """Defect class 8 of issue #23: the stamped build info as data of //rtp_fp8 made every test
    depend on the workspace status (rerun on every commit, no remote cache hits)."""
    g = bazel_graph.evaluate(copy)
    assert "//rtp_fp8:build_info" in bazel_graph._closure_all(g, "//:wheel")
    _edit(copy / "rtp_fp8/BUILD.bazel", "    data = select({", '    data = [":build_info"] + select({')
    _fails(copy, "depends on stamped //rtp_fp8:build_info")


@pytest.mark.parametrize(
    "path,old,new,needle",
    [
        (".bazelrc", "common --@rules_cuda//cuda:enable=false\ncommon:cpu", "common:cpu",
         "no `common --@rules_cuda//cuda:enable=false`"),
        (".bazelrc", "common:cuda12_8 --repo_env=CUDA_PATH\n", "", "config cuda12_8 lacks `common:cuda12_8 --repo_env"),
        (".bazelrc", "common:cuda13_0 --@rules_cuda//cuda:enable=true\n", "",
         "config cuda13_0 lacks `common:cuda13_0 --@rules_cuda//cuda:enable=true`"),
        ("csrc/BUILD.bazel", "    target_compatible_with = cuda_only(),\n    deps = torch_cc(),",
         "    target_compatible_with = requires_cuda(),\n    deps = torch_cc(),", "requires_cuda() also skips"),
    ],
    ids=["cuda-on-by-default", "toolkit-not-from-CUDA_PATH", "cuda-config-without-cuda", "silent-skip"],
)
def test_cuda_configuration(copy, path, old, new, needle):
    """Defect class 5 of issue #23: no config must not build CUDA; a cuda config builds with the
    toolkit it names and fails loudly without one."""
    _edit(copy / path, old, new)
    if "requires_cuda" in new:
        _edit(copy / path, 'load("@rules_cuda//cuda:defs.bzl", "cuda_library")',
              'load("@rules_cuda//cuda:defs.bzl", "cuda_library", "requires_cuda")')
    _fails(copy, needle)


def test_toolkit_version_check(tmp_path, monkeypatch, capsys):
    from tools import build_ext

    (tmp_path / "bin").mkdir()
    nvcc = tmp_path / "bin" / "nvcc"
    nvcc.write_text("#!/bin/sh\necho 'Cuda compilation tools, release 12.8, V12.8.93'\n")
    nvcc.chmod(0o755)
    monkeypatch.setenv("CUDA_PATH", str(tmp_path))
    assert build_ext.main(["--check-toolkit", "cuda12_8"]) == 0
    assert build_ext.main(["--check-toolkit", "cuda13_0"]) == 1
    assert "toolchain cuda13_0 needs CUDA 13.0, but the toolkit found" in capsys.readouterr().err
    assert build_ext.main(["--check-toolkit", "cpu"]) == 2


def test_unused_pip_hub_fails(copy):
    """Issue #23 defect 11: @pypi_tools was parsed (and fetched) but used by no target."""
    _edit(copy / "MODULE.bazel", 'use_repo(pip, "pypi_cpu",', 'pip.parse(\n    hub_name = "pypi_tools",\n'
          '    python_version = "3.11",\n    requirements_lock = "//deps:requirements_lock_tools.txt",\n)\n'
          'use_repo(pip, "pypi_tools", "pypi_cpu",')
    _fails(copy, "pip hub 'pypi_tools' is used by no target")


@pytest.mark.parametrize("path,old,new,needle", [
    ("deps/BUILD.bazel", '    size = "small",', '    size = "tiny",', "size = 'tiny', Bazel takes"),
    ("BUILD.bazel", '    distribution = "rtp_fp8",\n', "", "py_wheel(name='wheel') lacks mandatory ['distribution']"),
], ids=["bad-size", "wheel-without-distribution"])
def test_stub_attribute_values_and_mandatory_attributes(copy, path, old, new, needle):
    _edit(copy / path, old, new)
    _fails(copy, needle)


@pytest.mark.parametrize("path,old,new,needle", [
    ("deps/BUILD.bazel", '    visibility = ["//suites:__pkg__"],  # //suites:cpu names it\n', "",
     "//suites:cpu: tests names //deps:cpu.test, which is not visible to //suites"),
    ("rtp_fp8/moe/BUILD.bazel", "    visibility = [\"//visibility:public\"],\n", "",
     "names //rtp_fp8/moe:moe, which is not visible"),
    ("deps/BUILD.bazel", '    main = "//tools:lock_main.py",\n    visibility',
     '    main = "//tools:lock.py",\n    visibility',
     "main //tools:lock.py is not in srcs"),
], ids=["suite-names-private-test", "private-library", "main-not-in-srcs"])
def test_visibility_and_main(copy, path, old, new, needle):
    _edit(copy / path, old, new)
    _fails(copy, needle)
