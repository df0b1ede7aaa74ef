"""bench/l2_promotion.py's host side: the cuTensorMapEncodeTiled arguments it rebuilds from a
descriptor and the compiler's metadata must be the ones Triton's fillTMADescriptor passes (dims,
box innermost first; outer strides in bytes; the host dtype enum; NaN padding as the OOB fill).
The experiment itself re-checks each descriptor against Triton's bytes on the GPU before it
changes the promotion."""

import pytest

from bench import l2_promotion as P

# The metadata Triton's compiler gives sm90_ws's A / B boxes (sm90_ws.compile_sm90a's tensordesc_meta): FP8
# travels as bytes (enum 0), the scales as FP32 (7), the output as BF16 (device enum 10, the driver's 9)
FP8 = {"swizzle": 3, "elem_size": 1, "elem_type": 0, "block_size": [128, 128], "fp4_padded": False}


def test_a_2d_fp8_descriptor():
    args = P.encode_args(0x7000, [7168, 2048], [2048, 1], "zero", FP8)
    assert args == {"dtype": 0, "rank": 2, "base": 0x7000, "dims": [2048, 7168], "strides": [2048],
                    "box": [128, 128], "swizzle": 3, "oob_nan": 0}


def test_a_1d_fp32_scale_run_and_a_3d_bf16_box():
    meta = dict(FP8, elem_size=4, elem_type=7, block_size=[128], swizzle=0)
    assert P.encode_args(16, [4096], [1], "zero", meta)["strides"] == []
    meta = dict(FP8, elem_size=2, elem_type=10, block_size=[1, 64, 128])
    args = P.encode_args(32, [8, 300, 7168], [300 * 7200, 7200, 1], "nan", meta)
    assert (args["dtype"], args["dims"], args["strides"], args["box"], args["oob_nan"]) == (
        9, [7168, 300, 8], [7200 * 2, 300 * 7200 * 2], [128, 64, 1], 1)


def test_fp4_padded_doubles_the_inner_dim():
    assert P.encode_args(0, [64, 512], [512, 1], "zero", dict(FP8, fp4_padded=True))["dims"] == [1024, 64]


@pytest.mark.parametrize("strides", [[1, 2048], [2048]])
def test_strides_must_match_and_end_in_one(strides):
    with pytest.raises(ValueError, match="strides"):
        P.encode_args(0, [7168, 2048], strides, "zero", FP8)


def test_the_promotions_are_the_driver_enum():
    assert P.PROMOTIONS == {"none": 0, "64": 1, "128": 2, "256": 3} and P.TRITON_PROMOTION == 2
