"""Test macros: one py_test per test file, running pytest on that file.

Tags mirror the file's pytest markers one to one (tests/bazel/test_bazel_graph.py checks
it). A test marked `gpu` without an arch marker can run on every arch, so it carries all
three arch tags; GPU tests also get `resources:gpu:1` (not `exclusive-if-local`, which would
also serialise remote runs: Bazel issue 17834) and, for
remote execution, a test-only pool (`test.` prefix: compiling stays off the GPU pool).
"""

load("@rules_python//python:defs.bzl", "py_test")
load("//deps:py.bzl", "pypi")

ARCHS = ["sm90", "sm100", "sm120"]

TEST_PYPI = [
    "hypothesis",
    "numpy",
    "pytest",
    "safetensors",
    "torch",
    "transformers",
    "triton",
]

def _tag(marker):
    # pytest marker names cannot hold '-': requires_network is Bazel's requires-network
    return "requires-network" if marker == "requires_network" else marker

def gpu_tags(markers):
    """Bazel tags for a test file.

    Args:
      markers: the pytest markers the file uses (gpu, gpu_sm90, ...).

    Returns:
      The sorted marker tags, plus all arch tags for an arch-less gpu test and the
      local-execution tags of GPU tests.
    """
    markers = [_tag(m) for m in markers]
    tags = sorted(markers)
    if "gpu" in markers or "gpu_multi" in markers or [m for m in markers if m.startswith("gpu_sm")]:
        archs = [m for m in markers if m.startswith("gpu_sm")]
        if not archs:
            archs = ["gpu_" + a for a in ARCHS]
        tags = sorted({t: 1 for t in (["gpu"] + archs + [m for m in markers if not m.startswith("gpu_sm") and m != "gpu"])}.keys())
        tags = tags + ["resources:gpu:2" if "gpu_multi" in markers else "resources:gpu:1"]
    if "requires-network" in tags:
        tags = sorted(tags + ["manual"])  # not in //... (= ./dev test, offline); run it by name
    return tags

def rtp_py_test(name, src, markers = [], deps = [], data = [], size = "medium", **kwargs):
    """pytest on one file.

    Args:
      name: target name.
      src: the test file, relative to the package.
      markers: the pytest markers used in the file (see gpu_tags).
      deps: extra py deps.
      data: extra data files.
      size: test size.
      **kwargs: passed to py_test.
    """
    tags = gpu_tags(markers)
    gpu = "gpu" in tags
    py_test(
        name = name,
        size = size,
        srcs = [
            src,
            "//suites:pytest_main.py",
        ],
        args = [
            "$(rootpath %s)" % src,
        ],
        data = data + [
            "//:pyproject.toml",
            "//tests:conftest.py",
            "//tests:helpers.py",
        ],
        exec_properties = {"test.Pool": "gpu"} if gpu else {},
        main = "//suites:pytest_main.py",
        tags = tags,
        deps = deps + ["//rtp_fp8"] + pypi(TEST_PYPI),
        **kwargs
    )

def smoke_test(name, arch):
    """The smoke job (smoke/run.py) for one arch's scale format, checked against its goldens.

    Args:
      name: target name.
      arch: cpu, sm90, sm100 or sm120; the GPU ones carry that arch's GPU tags.
    """
    markers = [] if arch == "cpu" else ["gpu_" + arch]
    tags = gpu_tags(markers)
    py_test(
        name = name,
        size = "large",
        srcs = ["//smoke:run.py"],
        args = [
            "--arch",
            arch,
        ],
        exec_properties = {"test.Pool": "gpu"} if markers else {},
        main = "//smoke:run.py",
        tags = tags,
        visibility = ["//suites:__pkg__"],  # //suites:smoke_<arch> names it
        deps = ["//smoke:model"],
    )
