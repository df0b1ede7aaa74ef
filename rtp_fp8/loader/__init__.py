"""Online FP8 quantization of BF16 checkpoints at load time, with tensor-parallel splits."""
