"""MoE executors and the strategy that picks one.

    experts = QuantizedExperts.from_bf16(w_gate, w_up, w_down, arch)   # once, at load
    moe = FP8MoE(experts, max_tokens=..., topk=...)                    # picks per call
    y = moe(x, topk_ids, topk_weights)

ContiguousExecutor (prefill, large batches): quantize activations per token group -> EP
scatter into the m-grouped contiguous layout -> grouped FP8 GEMM gate_up -> SiLU(gate) * up,
requantized per token group -> grouped FP8 GEMM down -> weighted top-k gather. Workspace
rows = routed + min(routed, E) * (A - 1), aligned up to A (A the mk-alignment), from
shapes only.

MaskedExecutor (decode, small batches): the same steps on a per-expert padded layout
[E, max_m, H] (max_m = max_tokens by default: with distinct top-k ids a token reaches an
expert once) with masked GEMMs over masked_m = min(count, max_m).

Both: every buffer is allocated once from shapes, the forward has no host sync and no
data-dependent shape, so it can be captured in a CUDA graph and replayed with new inputs
and routing written in place. Capacity and layout come from one source, the GPU counts of
ep_dispatch (contiguous) / ep_masked_layout. Scale formats follow the Arch: FP32 (SM90, CPU) or packed
UE8M0 (SM100/SM120). Dropped routes are never silent: `counters` (int32 [2] on the
device: invalid ids, overflowed rows) accumulate across calls; `read_counters()` syncs
once; eager calls poll the previous call's copy (no per-call sync) and log growth.

Strategy (`choose`): masked when the batch has <= masked_max_tokens tokens, else
contiguous; RTP_FP8_MOE_EXECUTOR=masked|contiguous (or `executor=`) forces one, which
keeps CUDA graphs (both are capturable) and is the rollback switch. The GEMM backend is the
Triton grouped GEMM; DeepGEMM's is reported as bypassed with the reason. The choice and
any bypassed setting are logged once.
"""

from __future__ import annotations

import dataclasses
import logging
import os

import torch

from rtp_fp8 import arch as A
from rtp_fp8._logging import log_once
from rtp_fp8.gemm.triton import block_scaled as G
from rtp_fp8.moe import ep_kernels as K
from rtp_fp8.quant import activation_scale_layout, quantize_weight
from rtp_fp8.quant import layout as L
from rtp_fp8.quant import token_group as T

log = logging.getLogger(__name__)
EXECUTOR_ENV = "RTP_FP8_MOE_EXECUTOR"
EXECUTORS = ("masked", "contiguous")
_logged: set[str] = set()


def _log_once(msg: str, level: int = logging.INFO) -> None:
    log_once(log, _logged, msg, "rtp_fp8.moe: %s", msg, level=level)


def _capturing(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


@dataclasses.dataclass(frozen=True)
class QuantizedExperts:
    """FP8 expert weights: w13 [E, 2I, H] (gate rows then up rows), w2 [E, H, I], scales in the Arch's format."""

    w13: torch.Tensor
    w13_scales: torch.Tensor
    w2: torch.Tensor
    w2_scales: torch.Tensor
    arch: A.Arch

    def __post_init__(self):
        for name in ("w13", "w2"):
            t = getattr(self, name)
            if not isinstance(t, torch.Tensor) or t.dtype != torch.float8_e4m3fn or t.dim() != 3:
                raise ValueError(f"{name} must be a 3-D float8_e4m3fn tensor [E, N, K], got "
                                 f"{getattr(t, 'dtype', type(t).__name__)} {tuple(getattr(t, 'shape', ()))}")
        e, i2, h = self.w13.shape
        if i2 % 2:
            raise ValueError(f"w13 must stack gate and up rows (an even N), got N={i2}")
        if tuple(self.w2.shape) != (e, h, i2 // 2):
            raise ValueError(f"w2 must be [E={e}, H={h}, I={i2 // 2}], got {tuple(self.w2.shape)}")
        for name, w in (("w13_scales", self.w13), ("w2_scales", self.w2)):
            s = getattr(self, name)
            if not isinstance(s, torch.Tensor) or s.dim() != 3 or s.shape[0] != w.shape[0]:
                raise ValueError(f"{name} must be 3-D with {w.shape[0]} experts (as its weights), got "
                                 f"{tuple(getattr(s, 'shape', ()))}")
            want = torch.int32 if self.arch.scale_format == "ue8m0" else torch.float32
            if s.dtype != want:
                raise ValueError(f"{name} must be {want} for {self.arch} ({self.arch.scale_format} scales), "
                                 f"got {s.dtype}")
            G.check_b_scales(s, w.shape[:1], w.shape[1], w.shape[2], name)
            if s.device != w.device:
                raise ValueError(f"{name} is on {s.device}, {name[:-7]} on {w.device}")

    @property
    def num_experts(self) -> int:
        return self.w13.shape[0]

    @property
    def hidden(self) -> int:
        return self.w13.shape[2]

    @property
    def inter(self) -> int:
        return self.w13.shape[1] // 2

    @classmethod
    def from_bf16(cls, w_gate, w_up, w_down, arch: A.Arch | None = None) -> QuantizedExperts:
        """w_gate/w_up [E, I, H], w_down [E, H, I] (BF16), quantized once for `arch`."""
        if not isinstance(w_gate, torch.Tensor) or w_gate.dim() != 3 or w_gate.shape != w_up.shape:
            raise ValueError(f"w_gate and w_up must be [E, I, H] of one shape, got {tuple(w_gate.shape)}, "
                             f"{tuple(w_up.shape)}")
        e, i, h = w_gate.shape
        if tuple(w_down.shape) != (e, h, i):
            raise ValueError(f"w_down must be [E={e}, H={h}, I={i}], got {tuple(w_down.shape)}")
        arch = A.resolve(arch, w_gate.device)
        w13, s13 = quantize_weight(torch.cat([w_gate, w_up], dim=1), arch)
        w2, s2 = quantize_weight(w_down, arch)
        return cls(w13, s13, w2, s2, arch)


class _Executor:
    kind = ""

    def __init__(self, experts: QuantizedExperts, max_tokens: int, topk: int, *, group: int = 128,
                 expert_offset: int = 0, num_global_experts: int | None = None, deterministic: bool = False):
        if not isinstance(experts, QuantizedExperts):
            raise TypeError(f"experts must be QuantizedExperts, got {type(experts).__name__}")
        for name, v in (("max_tokens", max_tokens), ("topk", topk), ("group", group)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an int >= 1, got {v!r}")
        e, h, i = experts.num_experts, experts.hidden, experts.inter
        if h % group or i % group:
            raise ValueError(f"hidden size {h} and intermediate size {i} must be multiples of the quant group {group}")
        K._check_experts(e, expert_offset, num_global_experts)
        self.experts, self.arch = experts, experts.arch
        self.e, self.h, self.i, self.topk, self.group = e, h, i, topk, group
        self.max_tokens, self.expert_offset, self.num_global = max_tokens, expert_offset, num_global_experts
        self.deterministic = deterministic
        self.layout = activation_scale_layout(self.arch)
        self.device = experts.w13.device
        self.counters = torch.zeros(2, dtype=torch.int32, device=self.device)  # invalid ids, overflow (accumulated)
        self._host = None  # eager polling: (pinned copy, event)
        self._reported = [0, 0]

    def _check(self, x, topk_ids, topk_weights):
        if not isinstance(x, torch.Tensor) or x.dim() != 2 or x.shape[1] != self.h:
            raise ValueError(f"x must be [tokens, H={self.h}], got {tuple(getattr(x, 'shape', ()))}")
        if x.dtype not in (torch.bfloat16, torch.float16, torch.float32):
            raise ValueError(f"x must be bf16/fp16/fp32, got {x.dtype}")
        t = x.shape[0]
        if t > self.max_tokens:
            raise ValueError(f"x has {t} tokens, more than max_tokens={self.max_tokens} the workspace was sized for")
        K._check_ids(topk_ids)
        if tuple(topk_ids.shape) != (t, self.topk):
            raise ValueError(f"topk_ids must be [{t}, {self.topk}], got {tuple(topk_ids.shape)}")
        if tuple(topk_weights.shape) != (t, self.topk):
            raise ValueError(f"topk_weights must be [{t}, {self.topk}], got {tuple(topk_weights.shape)}")
        for name, v in (("x", x), ("topk_ids", topk_ids), ("topk_weights", topk_weights)):
            if v.device != self.device:
                raise ValueError(f"{name} is on {v.device}, the experts on {self.device}")

    def _quantize_input(self, x, consume_input):
        q, s = T.per_token_group_quant(x, self.group, scale_layout=self.layout)
        if consume_input:
            # Invariant: the caller's activation may be released early only where no CUDA graph
            # is being captured. A captured graph re-reads its static input on every replay, so
            # freeing it there would make replays read freed memory; eager calls quantize it once.
            if _capturing(self.device):
                _log_once("consume_input ignored while capturing a CUDA graph (the input is a static graph buffer)",
                          logging.WARNING)
            else:
                x.untyped_storage().resize_(0)
        return q, s

    def _silu_mul_quant(self, gate_up, q_out, s_out, **skip):
        """silu(gate) * up, rounded to bf16 and quantized per group: one fused kernel, no activation
        tensor. skip: m_indices= or masked_m=, the rows the down GEMM reads (others are not touched)."""
        T.silu_mul_quant_into(gate_up.reshape(-1, 2 * self.i), q_out, s_out, self.group, self.layout, **skip)

    def _account(self):
        """The layout and scatter kernels add to self.counters on the device; report growth here
        without a per-call sync (eager only)."""
        if _capturing(self.device):
            return
        if self.device.type != "cuda":
            self._report(counters_now=self.counters.tolist())
            return
        if self._host is None:
            buf = torch.empty(2, dtype=torch.int32, pin_memory=True)
        else:
            buf, ev = self._host
            if not ev.query():  # the previous call's copy is still in flight: leave it
                return
            self._report(buf.tolist())
        buf.copy_(self.counters, non_blocking=True)
        ev = torch.cuda.Event()
        ev.record()
        self._host = (buf, ev)

    def _report(self, counters_now):
        if counters_now != self._reported:
            inv, ovf = counters_now[0] - self._reported[0], counters_now[1] - self._reported[1]
            log.warning("rtp_fp8.moe: %s executor dropped routes: %d invalid expert ids, %d overflowed rows "
                        "(totals %s)", self.kind, inv, ovf, counters_now)
            self._reported = list(counters_now)

    def read_counters(self) -> dict[str, int]:
        """Totals since construction (one host sync)."""
        inv, ovf = self.counters.tolist()
        return {"invalid_ids": inv, "overflow": ovf}

    def __call__(self, x, topk_ids, topk_weights, consume_input: bool = False):
        return self.forward(x, topk_ids, topk_weights, consume_input)


class ContiguousExecutor(_Executor):
    kind = "contiguous"

    def __init__(self, experts: QuantizedExperts, max_tokens: int, topk: int, *, alignment: int = 128, **kw):
        super().__init__(experts, max_tokens, topk, **kw)
        if not isinstance(alignment, int) or not 1 <= alignment <= 256 or alignment & (alignment - 1):
            raise ValueError(f"alignment must be a power of two in [1, 256], got {alignment!r}")
        self.alignment = alignment
        self.cap = K.workspace_rows(max_tokens * topk, self.e, alignment)
        dev, cap = self.device, self.cap
        self.a = torch.empty(cap, self.h, dtype=torch.float8_e4m3fn, device=dev)
        # zeroed once: padding rows never get scales, and garbage ones overflow in the GEMM
        self.a_scales = L.alloc_scales((), cap, self.h // self.group, self.layout, dev, zero=True)
        self.act_q = torch.empty(cap, self.i, dtype=torch.float8_e4m3fn, device=dev)
        self.act_s = L.alloc_scales((), cap, self.i // self.group, self.layout, dev, zero=True)
        self.gate_up = torch.empty(cap, 2 * self.i, dtype=torch.bfloat16, device=dev)
        self.down = torch.empty(cap, self.h, dtype=torch.bfloat16, device=dev)
        self.m_indices = torch.empty(cap, dtype=torch.int32, device=dev)

    def forward(self, x, topk_ids, topk_weights, consume_input: bool = False):
        self._check(x, topk_ids, topk_weights)
        q, s = self._quantize_input(x, consume_input)
        return self.forward_quantized(q, s, topk_ids, topk_weights)

    def forward_quantized(self, q, s, topk_ids, topk_weights):
        """The forward from activations already quantized per token group (q FP8 [T, H], s in
        this Arch's activation scale layout): what expert parallelism hands a rank."""
        lay, oidx = K.ep_dispatch(q, s, topk_ids, self.e, self.a, self.a_scales, self.alignment,
                                  expert_offset=self.expert_offset, num_global_experts=self.num_global,
                                  counters=self.counters, m_indices=self.m_indices,
                                  deterministic=self.deterministic)
        m_indices = lay[2]
        del q, s  # the quantized input is dead once scattered
        ex = self.experts
        G.m_grouped_fp8_gemm_nt_contiguous(self.a, self.a_scales, ex.w13, ex.w13_scales, m_indices, out=self.gate_up,
                                           alignment=self.alignment)
        self._silu_mul_quant(self.gate_up, self.act_q, self.act_s, m_indices=m_indices)  # padding rows skipped
        G.m_grouped_fp8_gemm_nt_contiguous(self.act_q, self.act_s, ex.w2, ex.w2_scales, m_indices, out=self.down,
                                           alignment=self.alignment)
        self._account()
        return K.ep_gather(self.down, topk_weights, oidx, counters=self.counters)


def _batched(flat: torch.Tensor, e: int, m: int) -> torch.Tensor:
    """[e*m, c] (any strides) viewed as [e, m, c]."""
    s0, s1 = flat.stride()
    return flat.as_strided((e, m, flat.shape[1]), (m * s0, s0, s1))


class MaskedExecutor(_Executor):
    kind = "masked"

    def __init__(self, experts: QuantizedExperts, max_tokens: int, topk: int, *, max_m: int | None = None, **kw):
        super().__init__(experts, max_tokens, topk, **kw)
        self.max_m = max_tokens if max_m is None else max_m
        if self.max_m < 1:
            raise ValueError(f"max_m must be >= 1, got {self.max_m}")
        e, m, dev = self.e, self.max_m, self.device
        self.a = torch.empty(e * m, self.h, dtype=torch.float8_e4m3fn, device=dev)
        self.a_scales = L.alloc_scales((), e * m, self.h // self.group, self.layout, dev, zero=True)
        self.act_q = torch.empty(e * m, self.i, dtype=torch.float8_e4m3fn, device=dev)
        self.act_s = L.alloc_scales((), e * m, self.i // self.group, self.layout, dev, zero=True)
        self.gate_up = torch.empty(e, m, 2 * self.i, dtype=torch.bfloat16, device=dev)
        self.down = torch.empty(e, m, self.h, dtype=torch.bfloat16, device=dev)

    def forward(self, x, topk_ids, topk_weights, consume_input: bool = False):
        self._check(x, topk_ids, topk_weights)
        q, s = self._quantize_input(x, consume_input)
        return self.forward_quantized(q, s, topk_ids, topk_weights)

    def forward_quantized(self, q, s, topk_ids, topk_weights):
        """As ContiguousExecutor.forward_quantized."""
        e, m = self.e, self.max_m
        lay = K.ep_masked_layout(topk_ids, e, m, expert_offset=self.expert_offset, num_global_experts=self.num_global,
                                 counters=self.counters)
        _, starts, masked_m, counters = lay
        oidx = K.ep_scatter(q, s, topk_ids, starts, self.a, self.a_scales, counters, ends=lay.ends, cursor=lay.cursor,
                            expert_offset=self.expert_offset, deterministic=self.deterministic, num_experts=e)
        t = q.shape[0]
        del q, s
        self.run_experts(self.a.view(e, m, self.h), _batched(self.a_scales, e, m), masked_m, self.expected_m(t))
        self._account()
        return K.ep_gather(self.down.view(e * m, self.h), topk_weights, oidx, counters=self.counters)

    def expected_m(self, tokens: int) -> int:
        """Rows per expert to expect from `tokens` tokens (the masked GEMMs' tile-size hint)."""
        return max(1, min(self.max_m, -(-tokens * self.topk // self.e)))

    def run_experts(self, a, sa, masked_m, expected_m):
        """The experts on a per-expert padded layout: a [E, max_m, H] FP8 with its scales, masked_m
        [E] rows each -> self.down [E, max_m, H] BF16 (gate/up GEMM, fused SiLU*mul + quantization,
        down GEMM). The scatter above feeds it; so does DeepEP's low-latency dispatch (moe.dist)."""
        e, m, ex = self.e, self.max_m, self.experts
        G.m_grouped_fp8_gemm_nt_masked(a, sa, ex.w13, ex.w13_scales, masked_m, expected_m=expected_m,
                                       out=self.gate_up)
        self._silu_mul_quant(self.gate_up, self.act_q, self.act_s, masked_m=masked_m)  # rows past masked_m skipped
        G.m_grouped_fp8_gemm_nt_masked(self.act_q.view(e, m, self.i), _batched(self.act_s, e, m), ex.w2,
                                       ex.w2_scales, masked_m, expected_m=expected_m, out=self.down)
        return self.down


@dataclasses.dataclass(frozen=True)
class Choice:
    executor: str
    gemm_backend: str
    reason: str


def _deepgemm_bypass(arch: A.Arch) -> str:
    if "deepgemm" not in arch.gemm_backends:
        return f"DeepGEMM has no kernels for {arch}"
    return "the MoE executors run the Triton grouped GEMMs (no DeepGEMM grouped path in rtp_fp8 yet)"


def choose(arch: A.Arch, num_tokens: int, graph: bool = False, executor: str | None = None,
           masked_max_tokens: int = 64) -> Choice:
    """Executor and GEMM backend for one call; logged once per distinct decision."""
    forced = executor or os.environ.get(EXECUTOR_ENV, "") or None
    if forced is not None and forced not in EXECUTORS + ("auto",):
        raise ValueError(f"executor ({EXECUTOR_ENV}) must be one of {EXECUTORS + ('auto',)}, got {forced!r}")
    auto = "masked" if num_tokens <= masked_max_tokens else "contiguous"
    if forced in EXECUTORS:
        name, reason = forced, f"forced by {'executor=' if executor else EXECUTOR_ENV}"
        if forced != auto:
            _log_once(f"{reason}: {forced} instead of {auto} for {num_tokens} tokens")
    else:
        name = auto
        reason = f"{num_tokens} tokens {'<=' if auto == 'masked' else '>'} masked_max_tokens={masked_max_tokens}"
    mode = "graph" if graph else "eager"
    _log_once(f"{arch}: DeepGEMM bypassed: {_deepgemm_bypass(arch)}")
    _log_once(f"{arch} {mode}: {name} executor, triton GEMM ({reason})")
    return Choice(name, "triton", reason)


class FP8MoE:
    """The MoE layer: picks an executor per call (`choose`), each allocated once on first use.

    For CUDA graphs, call once per captured batch size before capturing (allocates the
    chosen executor's workspace outside the capture)."""

    def __init__(self, experts: QuantizedExperts, max_tokens: int, topk: int, *, masked_max_tokens: int = 64,
                 executor: str | None = None, **kw):
        if executor is not None and executor not in EXECUTORS + ("auto",):
            raise ValueError(f"executor must be one of {EXECUTORS + ('auto',)} or None, got {executor!r}")
        forced = os.environ.get(EXECUTOR_ENV, "")
        if forced and forced not in EXECUTORS + ("auto",):
            raise ValueError(f"{EXECUTOR_ENV} must be one of {EXECUTORS + ('auto',)}, got {forced!r}")
        if isinstance(masked_max_tokens, bool) or not isinstance(masked_max_tokens, int) or masked_max_tokens < 0:
            raise ValueError(f"masked_max_tokens must be an int >= 0, got {masked_max_tokens!r}")
        self.experts, self.max_tokens, self.topk = experts, max_tokens, topk
        self.masked_max_tokens, self.executor, self.kw = masked_max_tokens, executor, kw
        self._executors: dict[str, _Executor] = {}

    def get(self, name: str) -> _Executor:
        if name not in self._executors:
            if name == "masked":
                n = min(self.max_tokens, max(self.masked_max_tokens, 1))
                self._executors[name] = MaskedExecutor(self.experts, n, self.topk, **self.kw)
            else:
                self._executors[name] = ContiguousExecutor(self.experts, self.max_tokens, self.topk, **self.kw)
        return self._executors[name]

    def __call__(self, x, topk_ids, topk_weights, consume_input: bool = False):
        c = choose(self.experts.arch, x.shape[0], _capturing(x.device), self.executor, self.masked_max_tokens)
        ex = self.get(c.executor)
        if x.shape[0] > ex.max_tokens:  # a forced masked executor sized for the masked range
            raise ValueError(f"x has {x.shape[0]} tokens, more than the {c.executor} executor's "
                             f"max_tokens={ex.max_tokens}")
        return ex(x, topk_ids, topk_weights, consume_input)


def moe_reference(x, topk_ids, topk_weights, w_gate, w_up, w_down, expert_offset: int = 0) -> torch.Tensor:
    """BF16 MoE oracle: float32 math on BF16 weights; ids outside this rank's experts skipped."""
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    for e in range(w_gate.shape[0]):
        rows, slot = (topk_ids == e + expert_offset).nonzero(as_tuple=True)
        if rows.numel() == 0:
            continue
        xe = x[rows].float()
        act = torch.nn.functional.silu(xe @ w_gate[e].float().t()) * (xe @ w_up[e].float().t())
        y = act @ w_down[e].float().t()
        out.index_add_(0, rows, y * topk_weights[rows, slot, None].float())
    return out.to(torch.bfloat16)
