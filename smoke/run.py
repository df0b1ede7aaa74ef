"""Main job (./dev smoke): an end-to-end check of what exists, until the smoke suite lands.

For the detected arch and explicit Arch(9,0), Arch(10,0), Arch(12,0): quantize a random
BF16 weight (load-time path for that arch) and activations (Triton kernel, the arch's
scale layout), dequantize both through the scale format the arch's GEMM consumes, and
compare the FP8 linear's output with the BF16 reference. Fails above the stated relative
L2 bound. Prints a table.
"""

from __future__ import annotations

import sys
import time

import torch

from rtp_fp8 import arch as A
from rtp_fp8 import quant as Q
from rtp_fp8.quant import block as B
from rtp_fp8.quant import reference as R
from rtp_fp8.quant import ue8m0

REL_L2_MAX = 0.06  # FP8 e4m3 activations and weights, K=1024: ~3-4% measured


def _dequant_act(q, s, arch, group=128):
    if arch.scale_format == "ue8m0":
        s = ue8m0.unpack(s, q.shape[-1] // group)
    return R.group_dequant_ref(q, s.contiguous(), group)


def _dequant_weight(q, s, arch, n, block=128):
    if arch.scale_format == "ue8m0":
        rows = ue8m0.unpack(s, -(-q.shape[-1] // block))
        return (q.float() * rows.repeat_interleave(block, -1)[:, : q.shape[-1]])
    return B.dequantize_weight_blocks(q, s, block)


def run_case(arch, device, m=96, n=768, k=1024, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(m, k, generator=g)).to(torch.bfloat16).to(device)
    w = (torch.randn(n, k, generator=g) / k**0.5).to(torch.bfloat16).to(device)
    t0 = time.perf_counter()
    qw, sw = Q.quantize_weight(w, arch=arch)
    qx, sx = Q.quantize_activation(x, arch=arch)
    y = _dequant_act(qx.cpu(), sx.cpu(), arch) @ _dequant_weight(qw.cpu(), sw.cpu(), arch, n).t()
    dt = time.perf_counter() - t0
    ref = x.cpu().double() @ w.cpu().double().t()
    err = float((y.double() - ref).norm() / ref.norm())
    return err, dt


def main(argv):
    device = "cuda" if torch.cuda.is_available() else "cpu"
    archs = [A.detect()] + [a for a in (A.Arch(9, 0), A.Arch(10, 0), A.Arch(12, 0)) if a != A.detect()]
    print(f"{'arch':8s} {'scales':7s} {'device':7s} {'rel_l2':>8s} {'bound':>6s} {'time_s':>7s} result")
    ok = True
    for arch in archs:
        err, dt = run_case(arch, device)
        good = err <= REL_L2_MAX
        ok &= good
        print(f"{arch.name:8s} {arch.scale_format:7s} {device:7s} {err:8.4f} {REL_L2_MAX:6.2f} {dt:7.2f} "
              f"{'PASS' if good else 'FAIL'}")
    print("smoke:", "passed" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
