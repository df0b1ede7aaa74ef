"""Entry point of every Bazel test target: pytest on the file(s) given as arguments.

Without CUDA, Triton kernels run under the interpreter (as ./dev test does).
"""

import os
import sys

import pytest

if __name__ == "__main__":
    try:
        import torch

        cuda = torch.cuda.is_available()
    except ImportError:
        cuda = False
    if not cuda:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    sys.exit(pytest.main(["-p", "no:cacheprovider", "-ra", *sys.argv[1:]]))
