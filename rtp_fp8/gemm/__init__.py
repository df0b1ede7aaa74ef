"""FP8 block-scaled GEMM backends: Triton kernels (everywhere), plain-torch reference."""
