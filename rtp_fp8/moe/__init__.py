"""MoE expert parallelism: EP scatter/gather kernels (executors to come)."""
