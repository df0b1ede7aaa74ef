"""rtp_fp8: FP8 inference kernels for Hopper (SM90) and Blackwell (SM100, SM120)."""

__version__ = "0.1.0"
