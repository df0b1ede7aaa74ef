"""The TMA descriptors' L2 promotion, an experiment (issue #28): does DeepGEMM's 256-byte promotion
speed up our kernels?

    PYTHONPATH=. python3 bench/l2_promotion.py [--out l2.json] [--promotion 128 256 none]

Triton's launcher encodes every host tensor descriptor with CU_TENSOR_MAP_L2_PROMOTION_L2_128B
(fillTMADescriptor in triton/backends/nvidia/driver.c); DeepGEMM encodes its own with L2_256B
(docs/perf.md, seventh session). Nsight Compute placed our 64-row tiles' gap at load latency.

While `promotion(p)` is active, each descriptor the launcher builds (driver.make_tensordesc_arg,
looked up at every launch) is re-encoded in place with promotion p through the driver's
cuTensorMapEncodeTiled, every other field as Triton encoded it. Before that, each is encoded again
with Triton's own 128-byte promotion into scratch memory and compared byte for byte with what the
launcher built: a mismatch (another Triton's field mapping, or another object layout) raises
instead of timing a different descriptor. CUDA graphs capture the kernel parameters, so a graph
replays the promotion it was captured with.

Timed: the shipped dispatch on the dense decode shapes and two M=4096 shapes over operand sets
rotated past the L2, under each promotion; every output must equal the 128-byte one bit for bit
(the promotion changes what the L2 fetches, not what the kernel reads). Nothing here ships:
rtp_fp8 never patches Triton.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
from unittest import mock

import torch

from bench.common import dump, environment, operand_sets, output_of, rotated_ms
from bench.decode_sweep import DENSE
from bench.gemm import dense_call, dense_inputs

PROMOTIONS = {"none": 0, "64": 1, "128": 2, "256": 3}  # CUtensorMapL2promotion
TRITON_PROMOTION = PROMOTIONS["128"]  # what Triton's fillTMADescriptor passes
MAP_OFFSET = 128  # PyCUtensorMapObject: PyObject_HEAD, then an _Alignas(128) CUtensorMap
MAP_BYTES = 128  # sizeof(CUtensorMap)
SHAPES = DENSE + [(4096, 7168, 16384), (4096, 4096, 7168)]  # the decode shapes and two M=4096 ones


def encode_args(base: int, shape, strides, padding: str, metadata: dict) -> dict:
    """cuTensorMapEncodeTiled's arguments (its L2 promotion aside) for a descriptor over base (a
    device address), shape and strides (elements, outermost first, the last 1), padding ("zero" or
    "nan") and the compiler's tensordesc metadata, as Triton's fillTMADescriptor passes them: dims
    and box innermost first, the rank - 1 outer strides in bytes, element strides 1, no interleave."""
    from triton.backends.nvidia.driver import TMA_DTYPE_DEVICE_TO_HOST

    shape, strides = list(shape), list(strides)
    if metadata["fp4_padded"]:
        shape[-1] *= 2
    if len(strides) != len(shape) or strides[-1] != 1:
        raise ValueError(f"strides must match shape {shape} and end in 1, got {strides}")
    size = metadata["elem_size"]
    return {"dtype": TMA_DTYPE_DEVICE_TO_HOST[metadata["elem_type"]], "rank": len(shape), "base": base,
            "dims": shape[::-1], "strides": [s * size for s in strides[:-1]][::-1],
            "box": list(metadata["block_size"])[::-1], "swizzle": metadata["swizzle"],
            "oob_nan": 1 if padding == "nan" else 0}


class _Encoder:
    """cuTensorMapEncodeTiled from the driver library, writing a 128-byte map at an address."""

    def __init__(self):
        self.fn = ctypes.CDLL("libcuda.so.1").cuTensorMapEncodeTiled
        self.fn.restype = ctypes.c_int
        self.scratch = ctypes.create_string_buffer(2 * MAP_BYTES)  # a 128-aligned map inside it
        self.scratch_at = -(-ctypes.addressof(self.scratch) // MAP_BYTES) * MAP_BYTES

    def __call__(self, dst: int, args: dict, promotion: int) -> None:
        rank = args["rank"]
        u64, u32 = ctypes.c_uint64 * 5, ctypes.c_uint32 * 5
        res = self.fn(ctypes.c_void_p(dst), args["dtype"], rank, ctypes.c_void_p(args["base"]), u64(*args["dims"]),
                      u64(*args["strides"]), u32(*args["box"]), u32(*([1] * rank)), 0, args["swizzle"], promotion,
                      args["oob_nan"])
        if res != 0:
            raise RuntimeError(f"cuTensorMapEncodeTiled failed (CUresult {res}) for {args}")


@contextlib.contextmanager
def promotion(name: str):
    """Every descriptor Triton's launcher builds in the block is encoded with L2 promotion `name`
    (PROMOTIONS), after checking that the re-encoding reproduces Triton's own bytes."""
    from triton.backends.nvidia import driver

    encode = _Encoder()
    original = driver.make_tensordesc_arg

    def make(arg, metadata):
        out = original(arg, metadata)
        if metadata is None:  # decomposed into pointer, shape and strides: no map to re-encode
            return out
        args = encode_args(arg.base.data_ptr(), arg.shape, arg.strides, arg.padding, metadata)
        at = id(out[0]) + MAP_OFFSET
        encode(encode.scratch_at, args, TRITON_PROMOTION)
        if ctypes.string_at(encode.scratch_at, MAP_BYTES) != ctypes.string_at(at, MAP_BYTES):
            raise RuntimeError("re-encoding with Triton's own promotion does not reproduce its descriptor: this "
                               "Triton's fields or object layout differ from the ones this experiment assumes")
        encode(at, args, PROMOTIONS[name])
        return out

    with mock.patch.object(driver, "make_tensordesc_arg", make):
        yield


def rows(names):
    out_rows = []
    for m, n, k in SHAPES:
        sets = operand_sets(lambda m=m, n=n, k=k: dense_inputs(m, n, k))
        r = {"shape": [m, n, k], "operand_sets": len(sets)}
        ref = None
        for name in names:
            with promotion(name):
                got = output_of(dense_call, sets[0], sets[0][4])
                if ref is None:
                    ref = got
                if not torch.equal(got, ref):
                    r[name] = f"differs from the {names[0]}-promotion output"
                    continue
                r[name] = rotated_ms(dense_call, sets) * 1e3  # graphs captured inside the block
        out_rows.append(r)
        print(r, flush=True)
    return out_rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--promotion", nargs="+", default=["128", "256"], choices=list(PROMOTIONS))
    args = ap.parse_args()
    res = {"env": environment(), "promotions": args.promotion, "rows": rows(args.promotion)}
    if args.out:
        dump(args.out, res)


if __name__ == "__main__":
    main()
