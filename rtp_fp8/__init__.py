"""rtp_fp8: FP8 inference kernels for Hopper (SM90) and Blackwell (SM100, SM120)."""

__version__ = "0.1.0"


def build_info() -> dict:
    """How this copy of rtp_fp8 was built: the wheel's _build_info.json, or 'checkout'.

    'extension_loaded' says whether the CUDA extension loads here (False on CPU builds).
    """
    import json
    import pathlib

    from rtp_fp8 import _ext

    path = pathlib.Path(__file__).with_name("_build_info.json")
    info = json.loads(path.read_text()) if path.exists() else {"source": "checkout"}
    info["extension_loaded"] = _ext.available()
    return info
