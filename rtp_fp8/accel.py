"""Optional accelerators (DeepGEMM, DeepEP): minimum versions and run-time detection.

MIN_VERSIONS mirrors deps/toolchains.toml [accelerators]; `tools/lock check` fails when
they differ, so every version string traces to that one file.
"""

MIN_VERSIONS = {"deep_gemm": "2.2.0", "deep_ep": "1.2.1"}


def parse_version(v: str) -> tuple[int, ...]:
    """'2.6.1+54e2261' -> (2, 6, 1); the local part is ignored."""
    import re

    m = re.match(r"(\d+(?:\.\d+)*)", v or "")
    if not m:
        raise ValueError(f"cannot parse version {v!r}")
    return tuple(int(p) for p in m.group(1).split("."))
