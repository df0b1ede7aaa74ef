"""Labels of PyPI packages in the hub of the selected toolchain (//deps:toolchain)."""

TOOLCHAINS = ["cpu", "cuda12_8", "cuda13_0"]

def _norm(pkg):
    return pkg.lower().replace("-", "_").replace(".", "_")

def pypi(pkgs):
    """select() of the packages' labels in the selected toolchain's hub."""
    return select({
        "//deps:is_%s" % tc: ["@pypi_%s//%s" % (tc, _norm(p)) for p in pkgs]
        for tc in TOOLCHAINS
    })

CUDA_TOOLCHAINS = ["cuda12_8", "cuda13_0"]

def torch_cc():
    """torch's headers and libraries (a cc_library) from the selected CUDA toolchain's hub.

    The cpu toolchain has none: targets using this are CUDA-only (cuda_only()).
    """
    return select(dict(
        {"//deps:is_%s" % tc: ["@pypi_%s//torch:torch_cc" % tc] for tc in CUDA_TOOLCHAINS},
        **{"//deps:is_cpu": []}
    ))

def per_toolchain(fmt):
    """select() of fmt % toolchain name, one branch per toolchain."""
    return select({"//deps:is_%s" % tc: fmt % tc for tc in TOOLCHAINS})

def cuda_only():
    """target_compatible_with of CUDA-only targets (the cuda12_8 / cuda13_0 configs).

    Compatible where --@rules_cuda//cuda:enable is true, incompatible (skipped by //...)
    elsewhere. Unlike rules_cuda's requires_cuda() (v0.3.0 cuda/private/defs.bzl), which also makes a target
    incompatible when no valid toolkit is found, a cuda config on a machine without the toolkit
    then fails the build instead of skipping every test that needs the extension (reads as green).
    """
    return select({
        "@rules_cuda//cuda:is_enabled": [],
        "//conditions:default": ["@platforms//:incompatible"],
    })

def all_files(name = "all_files", exclude = []):
    """Declares :all_files, every file of the calling package (//:repo_files collects them).

    For the checks that read the checkout's Bazel layer itself (tests/bazel, tests/tools);
    nothing else depends on it.

    Args:
      name: the filegroup's name (//:repo_files expects the default).
      exclude: more glob patterns to leave out.
    """
    native.filegroup(
        name = name,
        srcs = native.glob(
            ["**"],
            exclude = [
                "**/__pycache__/**",
                "**/*.pyc",
                "**/*.so",
                ".*/**",
            ] + exclude,
        ),
        visibility = ["//:__pkg__"],
    )
