"""Optional accelerators (DeepGEMM, DeepEP): minimum versions and run-time detection.

MIN_VERSIONS mirrors deps/toolchains.toml [accelerators]; `tools/lock check` fails when
they differ, so every version string traces to that one file.
"""

MIN_VERSIONS = {"deep_gemm": "2.2.0", "deep_ep": "1.2.1"}
