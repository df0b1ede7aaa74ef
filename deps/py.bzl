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
