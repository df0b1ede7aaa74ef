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

    The cpu toolchain has none: targets using this are CUDA-only (requires_cuda()).
    """
    return select(dict(
        {"//deps:is_%s" % tc: ["@pypi_%s//torch:torch_cc" % tc] for tc in CUDA_TOOLCHAINS},
        **{"//deps:is_cpu": []}
    ))

def per_toolchain(fmt):
    """select() of fmt % toolchain name, one branch per toolchain."""
    return select({"//deps:is_%s" % tc: fmt % tc for tc in TOOLCHAINS})
