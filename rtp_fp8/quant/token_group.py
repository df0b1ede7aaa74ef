"""Per-token-group activation quantization (1 x group), Triton kernel + public API.

    q, scales = per_token_group_quant(x, 128)                       # fp8, FP32 row-major
    q, scales = per_token_group_quant(x, 128, scale_layout="col_tma")  # DeepGEMM SM90 A
    q, scales = per_token_group_quant(x, 128, scale_layout="ue8m0")    # DeepGEMM SM100 A

One pass over the input: each program loads a [BLOCK_M, GPP, group] tile, computes the
finite amax of each group, the scale (amax/qmax, or rounded up to a power of two), the
quantized values, and writes the scales in the requested layout itself, including the
packed UE8M0 words (four groups per int32), so no second pass re-lays out the scales.

NaN/Inf: the scale comes from the finite amax of the group (NaN and +-Inf ignored);
NaN becomes the canonical fp8 NaN 0x7F whatever its sign (0 in int8; the GPU's cast
drops NaN signs, so every backend and the oracle canonicalize), +-Inf saturates to +-qmax. An all-zero group gets
scale eps/qmax and zero values.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from rtp_fp8 import triton_env
from rtp_fp8.arch import num_sms
from rtp_fp8.quant import layout as L

OUT_DTYPES = {torch.float8_e4m3fn: 448.0, torch.int8: 127.0}
IN_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
BACKENDS = ("triton", "cuda", "reference")


@triton.jit
def _rint(y):
    # Round half to even for |y| < 2**22 (int8 range): the fp32 add rounds to nearest even.
    magic = 12582912.0  # 1.5 * 2**23
    return (y + magic) - magic


@triton.jit
def _div_fast(x, s, inv):
    """div.rn(x, s) from inv = div.rn(1, s): q0 = x * inv, e = fma(q0, s, -x) (exact, the
    negated remainder), q0 - e * inv rounded once. Equal to the division unless x, the
    remainder or the quotient is subnormal (|x| < 2**-100 or |x / s| < 2**-100: both
    quotients are then fp8 zeros of x's sign) or something overflows:
    tests/quant/test_fast_division.py checks every bf16 and fp16 (x, amax) pair on the GPU.
    Signed zeros: x = -0 must give -0, so the remainder is the negated one (the last step
    adds -0 to -0), and negation is a multiply by -1 (Triton's unary minus is 0 - v, which
    maps +0 to +0)."""
    q0 = x * inv
    return tl.fma(tl.fma(q0, s, x * -1.0), inv * -1.0, q0)


@triton.jit
def _quantize(x, eps, qmax, AXIS: tl.constexpr, POW2: tl.constexpr, INT8: tl.constexpr):
    """(values ready for the cast, scales) for the groups along AXIS of fp32 x.

    amax is the group's finite amax: a max of |x| ignores NaN (maxnum); +-Inf, rare, sends
    the whole tile through a second, filtering amax. The quotient x / scale is the IEEE
    division's: a power-of-two scale multiplies by its exact reciprocal; an FP32 scale takes
    _div_fast with inv = 1 / scale rounded once per group, which equals div.rn(x, scale)
    whenever nothing overflows or underflows, so tiles holding +-Inf or a scale below
    2**-60 divide instead. fp8: the cast saturates
    (+-Inf -> +-448) and gives NaN the canonical 0x7F; int8: clamped, rounded half to even,
    NaN -> 0.
    """
    ax = tl.abs(x)
    amax = tl.max(ax, axis=AXIS)
    tiny = 8.673617379884035e-19  # 2**-60
    special = tl.max(((amax == float("inf")) | (tl.maximum(amax, eps) < qmax * tiny)).to(tl.int32)) != 0
    if special:
        amax = tl.max(tl.where(ax < float("inf"), ax, 0.0), axis=AXIS)  # NaN and Inf compare false
    scale = tl.math.div_rn(tl.maximum(amax, eps), qmax)
    if POW2:
        bits = scale.to(tl.int32, bitcast=True)
        expo = ((bits >> 23) & 0xFF) + ((bits & 0x7FFFFF) != 0).to(tl.int32)
        scale = (expo << 23).to(tl.float32, bitcast=True)
    s = tl.broadcast_to(tl.expand_dims(scale, AXIS), x.shape)
    inv = tl.broadcast_to(tl.expand_dims(tl.math.div_rn(1.0, scale), AXIS), x.shape)  # once per group
    if POW2:
        y = x * inv
    elif special:
        y = tl.math.div_rn(x, s)
    else:
        y = _div_fast(x, s, inv)
    if INT8:
        y = tl.where(x != x, 0.0, _rint(tl.minimum(tl.maximum(y, -qmax), qmax)))
    return y, scale


@triton.jit
def _silu_mul(x_ptr, offs, up_off, mask, CUDA_EXP: tl.constexpr):
    """bf16(silu(g) * u) in fp32 with silu(g) = g / (1 + exp(-g)) (IEEE division), as torch
    computes silu(g.float()) * u.float(): CUDA_EXP uses the CUDA math library's expf (what
    torch's kernel calls); the interpreter's numpy exp may differ in the last bit."""
    g = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(x_ptr + offs + up_off, mask=mask, other=0.0).to(tl.float32)
    e = libdevice.exp(g * -1.0) if CUDA_EXP else tl.exp(g * -1.0)
    return (tl.math.div_rn(g, 1.0 + e) * u).to(tl.bfloat16).to(tl.float32)


@triton.jit
def _per_token_group_quant_kernel(
    x_ptr, q_ptr, s_ptr, M, stride_xm, stride_qm, stride_sm, stride_sg, eps, qmax, up_off,
    NUM_GROUPS: tl.constexpr, GROUP: tl.constexpr, GPP: tl.constexpr, BLOCK_M: tl.constexpr,
    POW2: tl.constexpr, PACKED: tl.constexpr, INT8: tl.constexpr, SILU_MUL: tl.constexpr = False,
    CUDA_EXP: tl.constexpr = True, rows_ptr=None, rows_per_expert=1, SKIP: tl.constexpr = 0,
):
    """Rows of x (or, with SILU_MUL, bf16(silu(x[:, :up_off]) * x[:, up_off:])) per group.
    SKIP 1: rows whose id in rows_ptr is negative (contiguous padding) are skipped; SKIP 2: row r
    is skipped when r % rows_per_expert >= rows_ptr[r // rows_per_expert] (masked_m). Skipped rows
    are neither read nor written. Program (i, j) takes row blocks i, i + grid[0], ... (one block
    each when the grid has a program per block; a persistent grid, fewer)."""
    pid_g = tl.program_id(1)
    for pid_m in range(tl.program_id(0), tl.cdiv(M, BLOCK_M), tl.num_programs(0)):
        rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        rmask = rows < M
        if SKIP == 1:
            rmask &= tl.load(rows_ptr + rows, mask=rmask, other=-1) >= 0
        elif SKIP == 2:
            rmask &= (rows % rows_per_expert) < tl.load(rows_ptr + rows // rows_per_expert, mask=rmask, other=0)
        # masked lanes still run the arithmetic, which bounds this kernel (exp and IEEE divisions):
        # a block of skipped rows is passed over
        live = tl.sum(rmask.to(tl.int32), axis=0) != 0 if SKIP != 0 else pid_m >= 0
        if live:
            _quant_block(x_ptr, q_ptr, s_ptr, rows, rmask, pid_g, stride_xm, stride_qm, stride_sm, stride_sg, eps,
                         qmax, up_off, NUM_GROUPS, GROUP, GPP, BLOCK_M, POW2, PACKED, INT8, SILU_MUL, CUDA_EXP)


@triton.jit
def _quant_block(x_ptr, q_ptr, s_ptr, rows, rmask, pid_g, stride_xm, stride_qm, stride_sm, stride_sg, eps, qmax,
                 up_off, NUM_GROUPS: tl.constexpr, GROUP: tl.constexpr, GPP: tl.constexpr, BLOCK_M: tl.constexpr,
                 POW2: tl.constexpr, PACKED: tl.constexpr, INT8: tl.constexpr, SILU_MUL: tl.constexpr,
                 CUDA_EXP: tl.constexpr):
    """_per_token_group_quant_kernel's work on one [BLOCK_M rows, GPP groups] block."""
    groups = pid_g * GPP + tl.arange(0, GPP)
    cols = tl.arange(0, GROUP)
    gmask = groups < NUM_GROUPS
    rows64 = rows.to(tl.int64)
    kofs = groups[None, :, None] * GROUP + cols[None, None, :]
    mask = rmask[:, None, None] & gmask[None, :, None]
    if SILU_MUL:
        x = _silu_mul(x_ptr, rows64[:, None, None] * stride_xm + kofs, up_off, mask, CUDA_EXP)
    else:
        x = tl.load(x_ptr + rows64[:, None, None] * stride_xm + kofs, mask=mask, other=0.0).to(tl.float32)

    y, scale = _quantize(x, eps, qmax, 2, POW2, INT8)
    tl.store(q_ptr + rows64[:, None, None] * stride_qm + kofs, y.to(q_ptr.dtype.element_ty), mask=mask)

    if PACKED:
        expo = tl.where(gmask[None, :], (scale.to(tl.int32, bitcast=True) >> 23) & 0xFF, 0)
        shift = (groups % 4) * 8
        byte = expo << shift[None, :]
        word = tl.sum(tl.reshape(byte, (BLOCK_M, GPP // 4, 4)), axis=2)
        widx = pid_g * (GPP // 4) + tl.arange(0, GPP // 4)
        wmask = rmask[:, None] & (widx[None, :] < (NUM_GROUPS + 3) // 4)
        tl.store(s_ptr + rows64[:, None] * stride_sm + widx[None, :] * stride_sg, word, mask=wmask)
    else:
        smask = rmask[:, None] & gmask[None, :]
        tl.store(s_ptr + rows64[:, None] * stride_sm + groups[None, :] * stride_sg, scale, mask=smask)


@triton.jit
def _per_token_group_quant_seg_kernel(
    x_ptr, q_ptr, s_ptr, NSEG, stride_sm, stride_sg, eps, qmax,
    NUM_GROUPS: tl.constexpr, GROUP: tl.constexpr, SEG: tl.constexpr,
    POW2: tl.constexpr, PACKED: tl.constexpr, INT8: tl.constexpr,
):
    """Contiguous input and output: SEG consecutive (row, group) segments per program."""
    pid = tl.program_id(0)
    seg = pid.to(tl.int64) * SEG + tl.arange(0, SEG)
    smask = seg < NSEG
    offs = seg[:, None] * GROUP + tl.arange(0, GROUP)[None, :]
    x = tl.load(x_ptr + offs, mask=smask[:, None], other=0.0, eviction_policy="evict_first").to(tl.float32)

    y, scale = _quantize(x, eps, qmax, 1, POW2, INT8)
    tl.store(q_ptr + offs, y.to(q_ptr.dtype.element_ty), mask=smask[:, None])

    if PACKED:  # NUM_GROUPS % 4 == 0 and SEG % 4 == 0: a word never straddles rows or programs
        g = seg % NUM_GROUPS
        byte = ((scale.to(tl.int32, bitcast=True) >> 23) & 0xFF) << ((g % 4) * 8).to(tl.int32)
        word = tl.sum(tl.reshape(byte, (SEG // 4, 4)), axis=1)
        first = pid.to(tl.int64) * SEG + tl.arange(0, SEG // 4) * 4
        row = first // NUM_GROUPS
        widx = (first % NUM_GROUPS) // 4
        tl.store(s_ptr + row * stride_sm + widx * stride_sg, word, mask=first < NSEG)
    else:
        row = seg // NUM_GROUPS
        tl.store(s_ptr + row * stride_sm + (seg % NUM_GROUPS) * stride_sg, scale, mask=smask)


def _seg_config(m: int, num_groups: int, group: int) -> tuple[int, int]:
    """(SEG, num_warps) for the contiguous kernel; from bench/quant.py --sweep on an H200."""
    if triton_env.interpreting():
        return max(4, min(256, triton.next_power_of_2(m * num_groups))), 1
    seg = max(4, 2048 // group)
    return seg, 4


def _launch_config(m: int, num_groups: int, group: int, packed: bool) -> tuple[int, int, int, int]:
    """(BLOCK_M, GPP, num_warps, num_stages) from shape buckets; measured in bench/quant.py."""
    gpp = 4 if packed or num_groups % 4 == 0 else (2 if num_groups % 2 == 0 else 1)
    rows = triton.next_power_of_2(max(m, 1))
    if triton_env.interpreting():  # fewer, larger programs: interpreter cost is per program
        return min(64, rows), gpp, 4, 1
    return min(rows, max(1, min(32, 4096 // (gpp * group)))), gpp, 4, 1


def _validate(x, group_size, out_dtype, scale_layout):
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.device.type == "meta":
        raise ValueError("x is a meta tensor (no data): quantization needs a CPU or CUDA tensor")
    if x.dtype not in IN_DTYPES:
        raise TypeError(f"x must be one of {IN_DTYPES}, got {x.dtype}")
    if out_dtype not in OUT_DTYPES:
        raise TypeError(f"out_dtype must be torch.float8_e4m3fn or torch.int8, got {out_dtype}")
    L.check_layout_name(scale_layout)
    if scale_layout == "ue8m0" and out_dtype != torch.float8_e4m3fn:
        raise ValueError("scale_layout='ue8m0' needs out_dtype=torch.float8_e4m3fn")
    if not isinstance(group_size, int) or group_size < 16 or group_size > 1024 or group_size & (group_size - 1):
        raise ValueError(f"group_size must be a power of two in [16, 1024], got {group_size!r}")
    if x.dim() < 1 or x.shape[-1] == 0:
        raise ValueError(f"x must have a non-empty last dimension K, got shape {tuple(x.shape)}")
    if x.shape[-1] % group_size:
        raise ValueError(f"x's last dimension K={x.shape[-1]} is not divisible by group_size={group_size}")
    if x.stride(-1) != 1:
        raise ValueError(f"x must be contiguous in its last dimension, got strides {x.stride()}")


def default_backend() -> str:
    """RTP_FP8_QUANT_BACKEND forces 'triton', 'cuda' or 'reference' (rollback, A/B)."""
    forced = os.environ.get("RTP_FP8_QUANT_BACKEND", "")
    if forced and forced not in BACKENDS:
        raise ValueError(f"RTP_FP8_QUANT_BACKEND must be one of {BACKENDS}, got {forced!r}")
    return forced


def _cuda_ext_available() -> bool:
    from rtp_fp8 import _ext

    return _ext.available()


def cuda_supports(x2: torch.Tensor, q2: torch.Tensor, group_size: int) -> bool:
    """What the CUDA kernel handles: contiguous rows, 16-byte aligned, >= 4 vectors a group."""
    vec = 16 // x2.element_size()
    return (x2.is_contiguous() and q2.is_contiguous() and group_size % vec == 0 and group_size // vec >= 4
            and x2.data_ptr() % 16 == 0 and q2.data_ptr() % 16 == 0)


def choose_backend(x: torch.Tensor, backend: str | None, supported: bool = True) -> str:
    """Explicit backend, else RTP_FP8_QUANT_BACKEND, else CUDA extension when usable, else Triton.

    A CPU tensor takes Triton only under the interpreter (TRITON_INTERPRET=1); on a GPU host,
    where the interpreter is off, it takes the plain-torch reference (same numerics)."""
    backend = backend or default_backend()
    if backend:
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        if backend == "cuda" and not (x.is_cuda and _cuda_ext_available()):
            from rtp_fp8 import _ext

            raise ValueError(f"backend='cuda' needs a CUDA input and the compiled extension "
                             f"({_ext.unavailable_reason() or 'input is not on CUDA'})")
        if backend == "triton" and not triton_env.runs_on(x.device):
            raise ValueError(f"backend='triton' needs a CUDA input, or TRITON_INTERPRET=1 for a CPU one; x is on "
                             f"{x.device}")
        return backend
    if not x.is_cuda:  # CPU: Triton only under its interpreter, else the plain-torch oracle
        return "triton" if triton_env.runs_on(x.device) else "reference"
    return "cuda" if supported and _cuda_ext_available() else "triton"


def per_token_group_quant_into(x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor, group_size: int,
                               scale_layout: str = "row", pow2: bool = False, eps: float = 1e-10,
                               backend: str | None = None, _config: tuple | None = None) -> None:
    """Quantize x [..., K] into preallocated q [..., K] and scales (CUDA-graph safe)."""
    _validate(x, group_size, q.dtype if isinstance(q, torch.Tensor) else None, scale_layout)
    if not isinstance(q, torch.Tensor) or q.shape != x.shape or q.stride(-1) != 1:
        raise ValueError(f"q must be a tensor of x's shape {tuple(x.shape)}, contiguous in its last dim")
    if q.device != x.device:
        raise ValueError(f"q is on {q.device}, expected {x.device} (same device as x)")
    x2 = x.reshape(-1, x.shape[-1])  # _validate checked stride(-1) == 1, which reshape keeps
    q2 = q.view(-1, q.shape[-1]) if q.is_contiguous() else q.reshape(-1, q.shape[-1])
    if q2.data_ptr() != q.data_ptr() or (q2.shape[0] > 1 and q2.stride(0) != q.stride(-2)):
        raise ValueError("q must be viewable as [rows, K] without a copy")
    m, k = x2.shape
    g = k // group_size
    L.check_scales(scales, (), m, g, scale_layout, "scales", x.device)
    eps = L.check_eps(eps)
    pow2 = pow2 or scale_layout == "ue8m0"
    backend = choose_backend(x, backend, x.is_cuda and cuda_supports(x2, q2, group_size))
    if scale_layout == "ue8m0":
        L.zero_row_padding(scales, m)  # the kernels write rows < m only
    if m == 0:
        return
    if backend == "reference":
        from rtp_fp8.quant import reference as R

        qr, sr = R.per_token_group_quant_ref(x2, group_size, q.dtype, pow2, eps)
        q2.copy_(qr)
        scales.copy_(L.to_layout(sr, scale_layout))
        return
    if backend == "cuda":
        from rtp_fp8 import _ext

        _ext.per_token_group_quant(x2, q2, scales, group_size, scale_layout, pow2, eps)
        return
    packed = scale_layout == "ue8m0"
    contiguous = x2.stride(0) == k and q2.stride(0) == k
    if contiguous and (not packed or g % 4 == 0) and (_config is None or len(_config) == 2):
        seg, warps = _config or _seg_config(m, g, group_size)
        _per_token_group_quant_seg_kernel[(triton.cdiv(m * g, seg),)](
            x2, q2, scales, m * g, scales.stride(0), scales.stride(1), eps, OUT_DTYPES[q.dtype],
            NUM_GROUPS=g, GROUP=group_size, SEG=seg, POW2=pow2, PACKED=packed, INT8=q.dtype == torch.int8,
            num_warps=warps,
        )
        return
    _launch_tiles(x2, q2, scales, m, g, group_size, eps, pow2, packed, config=_config)


# silu_mul_quant_into's tile on a GPU (BLOCK_M, groups per program, warps, stages) and its persistent grid
# (row programs per SM, each looping over row blocks; 0: a program per row block). bench/silu_sweep.py
# --skip on an H100 (docs/perf.md, twenty-fifth session), I=2048, bit-identical to every other tile: the
# executor's 36864-row workspace skipping its padding 64 us against the former (4, 4, 4, 1) tile's 82 us
# with a program per row block (one row a program, a program per row: 103 us, a launch per empty row);
# the 16403 routed rows alone 59 against 60 us, at 0.94 of the H100's copy bandwidth.
SILU_CONFIG = (1, 4, 1, 1)
SILU_PROGRAMS_PER_SM = 32
NO_SKIP = (0, None, 1)  # (SKIP, rows_ptr, rows_per_expert) of _per_token_group_quant_kernel: every row


def _launch_tiles(x2, q2, scales, m, g, group_size, eps, pow2, packed, up_off=0, config=None, skip=NO_SKIP):
    """The [BLOCK_M, GPP, group] tile kernel over m rows of g groups; up_off > 0: x2 is [g | u]
    with u at column up_off, quantizing bf16(silu(g) * u). skip: the kernel's (SKIP, rows_ptr,
    rows_per_expert), the rows to leave alone (_skip_rows). config: (BLOCK_M, GPP, warps, stages[,
    row programs]); row programs > 0 caps the grid's rows at that many programs, each looping over
    row blocks (a persistent grid); 0 or absent, a program per row block."""
    block_m, gpp, warps, stages, *rest = config or _launch_config(m, g, group_size, packed)
    mode, rows_ptr, rows_per_expert = skip
    blocks = triton.cdiv(m, block_m)
    progs = min(blocks, rest[0]) if rest and rest[0] > 0 else blocks
    _per_token_group_quant_kernel[(progs, triton.cdiv(g, gpp))](
        x2, q2, scales, m, x2.stride(0), q2.stride(0), scales.stride(0), scales.stride(1), eps,
        OUT_DTYPES[q2.dtype], up_off, NUM_GROUPS=g, GROUP=group_size, GPP=gpp, BLOCK_M=block_m,
        POW2=pow2, PACKED=packed, INT8=q2.dtype == torch.int8, SILU_MUL=up_off > 0,
        CUDA_EXP=not triton_env.interpreting(), rows_ptr=rows_ptr, rows_per_expert=rows_per_expert, SKIP=mode,
        num_warps=warps, num_stages=stages,
    )


def silu_mul_quant_into(gate_up: torch.Tensor, q: torch.Tensor, scales: torch.Tensor, group_size: int = 128,
                        scale_layout: str = "row", eps: float = 1e-10, m_indices: torch.Tensor | None = None,
                        masked_m: torch.Tensor | None = None) -> None:
    """The MoE activation, fused: act = bf16(silu(g) * u) for gate_up = [g | u] ([R, 2I] bf16),
    quantized per group into q [R, I] (fp8) and scales, in one pass (no act tensor).
    Same values as `per_token_group_quant_into((F.silu(g.float()) * u.float()).bfloat16(), ...)`
    on the GPU (tests/quant/test_silu_mul_quant.py).

    Rows no GEMM will read can be skipped (neither read nor written: q and scales keep what they
    held): m_indices (int32 [R], the contiguous layout's row ids) skips rows whose id is negative
    (padding); masked_m (int32 [E], R = E x rows per expert) skips expert e's rows from
    masked_m[e] on."""
    if not isinstance(gate_up, torch.Tensor) or gate_up.dtype != torch.bfloat16 or gate_up.dim() != 2:
        got = (gate_up.dtype, tuple(gate_up.shape)) if isinstance(gate_up, torch.Tensor) else type(gate_up).__name__
        raise ValueError(f"gate_up must be a 2-D bfloat16 tensor [rows, 2 * I], got {got}")
    r, w = gate_up.shape
    if w % 2 or gate_up.stride(-1) != 1:
        raise ValueError(f"gate_up must have an even, contiguous last dimension, got shape {tuple(gate_up.shape)} "
                         f"strides {gate_up.stride()}")
    i = w // 2
    if not isinstance(q, torch.Tensor) or q.dtype != torch.float8_e4m3fn or tuple(q.shape) != (r, i) \
            or q.stride(-1) != 1:
        raise ValueError(f"q must be float8_e4m3fn of shape ({r}, {i}) with a contiguous last dim")
    if q.device != gate_up.device:
        raise ValueError(f"q is on {q.device}, expected {gate_up.device} (same device as gate_up)")
    if not isinstance(group_size, int) or group_size < 16 or group_size & (group_size - 1) or i % group_size:
        raise ValueError(f"group_size must be a power of two >= 16 dividing I={i}, got {group_size!r}")
    L.check_layout_name(scale_layout)
    g = i // group_size
    L.check_scales(scales, (), r, g, scale_layout, "scales", gate_up.device)
    eps = L.check_eps(eps)
    skip = _skip_rows(r, gate_up.device, m_indices, masked_m)
    if scale_layout == "ue8m0":
        L.zero_row_padding(scales, r)
    if r == 0:
        return
    packed = scale_layout == "ue8m0"
    config = None
    if not triton_env.interpreting():  # packed scales: four groups a word, so four a program
        block_m, gpp, warps, stages = SILU_CONFIG
        progs = SILU_PROGRAMS_PER_SM * num_sms(gate_up.device.index) if gate_up.is_cuda else 0
        config = (block_m, gpp if packed else min(gpp, triton.next_power_of_2(g)), warps, stages, progs)
    _launch_tiles(gate_up, q, scales, r, g, group_size, eps, packed, packed, up_off=i, config=config, skip=skip)


def _skip_rows(r, device, m_indices, masked_m):
    """silu_mul_quant_into's row filter, validated, as the kernel's (SKIP, rows_ptr, rows_per_expert):
    NO_SKIP, (1, m_indices, 1) or (2, masked_m, R / E)."""
    if m_indices is not None and masked_m is not None:
        raise ValueError("give m_indices (contiguous layout) or masked_m (masked layout), not both")
    for name, t in (("m_indices", m_indices), ("masked_m", masked_m)):
        if t is None:
            continue
        if not isinstance(t, torch.Tensor) or t.dtype != torch.int32 or t.dim() != 1 or not t.is_contiguous():
            got = (t.dtype, tuple(t.shape)) if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"{name} must be a contiguous 1-D int32 tensor, got {got}")
        if t.device != device:
            raise ValueError(f"{name} is on {t.device}, expected {device} (gate_up's device)")
    if m_indices is not None:
        if m_indices.shape[0] != r:
            raise ValueError(f"m_indices must have one id per gate_up row ({r}), got {m_indices.shape[0]}")
        return (1, m_indices, 1)
    if masked_m is not None:
        e = masked_m.shape[0]
        if e == 0 or r % e:
            raise ValueError(f"masked_m has {e} experts, which do not divide gate_up's {r} rows")
        return (2, masked_m, r // e)
    return NO_SKIP


def per_token_group_quant(x: torch.Tensor, group_size: int = 128, out_dtype: torch.dtype = torch.float8_e4m3fn,
                          scale_layout: str = "row", pow2: bool = False, eps: float = 1e-10,
                          backend: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., K] -> (q [..., K], scales [rows, K/group] in `scale_layout`).

    pow2 rounds FP32 scales up to powers of two (implied by 'ue8m0'). Leading dims of x
    are flattened into rows for the scales.
    """
    _validate(x, group_size, out_dtype, scale_layout)
    q = torch.empty(x.shape, dtype=out_dtype, device=x.device)
    rows = x.numel() // x.shape[-1]
    scales = L.alloc_scales((), rows, x.shape[-1] // group_size, scale_layout, x.device)
    per_token_group_quant_into(x, q, scales, group_size, scale_layout, pow2, eps, backend)
    return q, scales
