"""Expert parallelism across ranks on torch.distributed: dispatch each token's FP8 row to the
ranks that own its experts, run the local experts there, combine the results back.

    group = torch.distributed.group.WORLD            # NCCL on GPUs, gloo on CPU
    ep = EPMoE(local_experts, group, max_tokens=T, topk=k)   # this rank owns experts [r*E, (r+1)*E)
    y = ep(x, topk_ids, topk_weights)                 # global expert ids in [0, W*E)

Two modes, one interface (`mode=` or RTP_FP8_EP_MODE=low_latency|normal, the rollback switch):

- low_latency (decode): every (source, destination) pair has a fixed slot block of `capacity`
  rows (default max_tokens). A token goes once to each rank that owns any of its experts (its
  top-k ids travel with it), so with capacity = max_tokens nothing can overflow. All sizes come
  from shapes: one all_to_all_single of equal splits each way, no host sync; capturable in a CUDA
  graph on NCCL. The receiving rank runs the masked executor over its W*capacity slots.
- normal (prefill): per-destination row counts are exchanged first (one host sync, like
  DeepEP's normal mode, so not capturable), then only the rows needed travel; the receiving
  rank runs the contiguous executor.

A row on the wire is the FP8 token (H bytes), its per-group scales in the Arch's format (FP32,
or packed UE8M0 int32), its top-k global ids (int32) and weights (FP32). The destination runs its
experts on the FP8 rows as they arrived (no requantization) and returns, per received row, the
BF16 top-k weighted sum over its own experts; the source adds the partial sums of the ranks it
sent to, in FP32. Ids outside [0, W*E) are counted as invalid on the rank that saw them, and a
row that does not fit a slot block is counted as overflow there (`counters`: int32 [2] on the
device, `read_counters()`), never dropped silently. Empty slots and experts of other ranks carry
the id W*E, which no rank owns (the executors run with num_global_experts = W*E + 1 and skip it).

DeepEP (deepseek-ai/DeepEP, V1 `Buffer` API as of the pinned v1.2.1) is detected like DeepGEMM
(`deepep_capabilities()`). Where it is usable, on CUDA, the low-latency mode goes through its
`low_latency_dispatch` (FP8 with the Arch's scales: FP32, or UE8M0 with round_scale) and
`low_latency_combine`: its receive tensor [local experts, W x max_tokens, H] with per-expert counts
is exactly the masked GEMMs' input. Its normal mode needs host-side counts per expert (not
capturable, like ours) and is not adapted: the torch.distributed normal mode runs. `backend=`
("torch" or "deepep") or RTP_FP8_EP_BACKEND forces one; the choice is logged once.
"""

from __future__ import annotations

import logging
import os

import torch
import torch.distributed as dist

from rtp_fp8 import accel
from rtp_fp8._logging import log_once
from rtp_fp8.moe import executors as X
from rtp_fp8.quant import layout as L
from rtp_fp8.quant import token_group as T

log = logging.getLogger(__name__)
MODE_ENV = "RTP_FP8_EP_MODE"
BACKEND_ENV = "RTP_FP8_EP_BACKEND"
MODES = ("low_latency", "normal")
_logged: set[str] = set()


def _log_once(msg: str, level: int = logging.INFO) -> None:
    log_once(log, _logged, msg, "rtp_fp8.moe.dist: %s", msg, level=level)


def deepep_capabilities() -> tuple[bool, str]:
    """(usable, why not): deep_ep importable, at least the pinned minimum version, with the
    Buffer methods the two modes need."""
    try:
        import deep_ep  # noqa: F401
    except ImportError:
        return False, "deep_ep is not installed (optional accelerator, not on PyPI)"
    version = getattr(deep_ep, "__version__", None)
    want = accel.MIN_VERSIONS["deep_ep"]
    try:
        too_old = accel.parse_version(version) < accel.parse_version(want)
    except ValueError:
        too_old = True
    if too_old:
        return False, f"deep_ep {version} is older than the minimum {want} (or reports no version)"
    buf = getattr(deep_ep, "Buffer", None)
    missing = [m for m in ("dispatch", "combine", "low_latency_dispatch", "low_latency_combine")
               if not callable(getattr(buf, m, None))]
    if missing:
        return False, f"deep_ep {version}: Buffer lacks {', '.join(missing)}"
    if not callable(getattr(buf, "get_low_latency_rdma_size_hint", None)):
        return False, f"deep_ep {version}: Buffer lacks get_low_latency_rdma_size_hint"
    return True, ""


def row_bytes(hidden: int, topk: int, scale_format: str, group: int = 128) -> int:
    """Bytes of one dispatched row: the FP8 token, its scales (FP32 per group, or UE8M0 packed four
    groups per int32), its top-k ids (int32) and weights (FP32)."""
    groups = -(-hidden // group)
    scale_words = -(-groups // 4) if scale_format == "ue8m0" else groups
    return hidden + 4 * scale_words + 8 * topk


def expected_destinations(ranks: int, experts_per_rank: int, topk: int) -> float:
    """Ranks a token is sent to, on average, when its top-k experts are k distinct uniform picks
    among ranks * experts_per_rank (no node-limited routing): ranks * P(a rank owns one of them)."""
    from math import comb

    total = ranks * experts_per_rank
    return ranks * (1 - comb(total - experts_per_rank, topk) / comb(total, topk))


def _check_mode(mode):
    mode = mode or os.environ.get(MODE_ENV) or "low_latency"
    if mode not in MODES:
        raise ValueError(f"mode ({MODE_ENV}) must be one of {MODES}, got {mode!r}")
    return mode


class EPMoE:
    """One MoE layer across an expert-parallel group (see the module doc)."""

    def __init__(self, experts: X.QuantizedExperts, group=None, *, max_tokens: int, topk: int,
                 mode: str | None = None, capacity: int | None = None, group_size: int = 128,
                 backend: str | None = None):
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("torch.distributed is not initialized: call init_process_group first")
        if not isinstance(experts, X.QuantizedExperts):
            raise TypeError(f"experts must be QuantizedExperts, got {type(experts).__name__}")
        for name, v in (("max_tokens", max_tokens), ("topk", topk)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an int >= 1, got {v!r}")
        self.group = group
        self.world, self.rank = dist.get_world_size(group), dist.get_rank(group)
        self.mode = _check_mode(mode)
        self.capacity = max_tokens if capacity is None else capacity
        if isinstance(self.capacity, bool) or not isinstance(self.capacity, int) or self.capacity < 1:
            raise ValueError(f"capacity must be an int >= 1, got {capacity!r}")
        self.experts, self.arch = experts, experts.arch
        self.e, self.h, self.topk, self.max_tokens, self.gs = experts.num_experts, experts.hidden, topk, max_tokens, \
            group_size
        self.num_global = self.world * self.e
        self.null_id = self.num_global  # owned by no rank
        self.layout = X.activation_scale_layout(self.arch)
        self.device = experts.w13.device
        self.scale_dtype = torch.int32 if self.layout == "ue8m0" else torch.float32
        self.scale_cols = L.scale_cols(self.h // group_size, self.layout)
        self.row_bytes = row_bytes(self.h, topk, "ue8m0" if self.layout == "ue8m0" else "fp32", group_size)
        assert self.row_bytes == self.h + 4 * self.scale_cols + 8 * topk  # the wire layout _pack writes
        self.counters = torch.zeros(2, dtype=torch.int32, device=self.device)  # invalid ids, overflow (this rank)
        self._ex_seen = torch.zeros(2, dtype=torch.int32, device=self.device)
        ids_at = self.h + 4 * self.scale_cols
        self._ids_cols = slice(ids_at, ids_at + 4 * topk)
        self._null_row = torch.full((topk,), self.null_id, dtype=torch.int32, device=self.device).view(torch.uint8)
        kw = dict(expert_offset=self.rank * self.e, num_global_experts=self.num_global + 1, group=group_size)
        self.backend = self._choose_backend(backend)
        self.deepep = _DeepEPLowLatency(self) if self.backend == "deepep" else None
        if self.mode == "low_latency":
            rows = self.world * self.capacity
            self.executor = X.MaskedExecutor(experts, rows, topk, max_m=rows, **kw)
        else:
            self.executor = X.ContiguousExecutor(experts, self.world * max_tokens, topk, **kw)

    def _choose_backend(self, backend):
        forced = backend or os.environ.get(BACKEND_ENV) or None
        if forced not in (None, "torch", "deepep"):
            raise ValueError(f"backend ({BACKEND_ENV}) must be 'torch' or 'deepep', got {forced!r}")
        ok, why = deepep_capabilities()
        if ok and self.mode != "low_latency":
            ok, why = False, "its normal mode is not adapted (host-side counts per expert)"
        if ok and self.device.type != "cuda":
            ok, why = False, f"DeepEP needs CUDA tensors, the experts are on {self.device}"
        if ok and self.capacity != self.max_tokens:
            ok, why = False, "DeepEP's low-latency buffers hold max_tokens per rank (capacity must equal it)"
        if forced == "deepep" and not ok:
            raise ValueError(f"backend 'deepep' was forced but cannot run: {why}")
        if forced == "torch" or not ok:
            _log_once(f"DeepEP bypassed: {why or 'torch forced'}; torch.distributed carries the tokens")
            return "torch"
        _log_once(f"DeepEP low-latency dispatch/combine ({self.world} ranks)")
        return "deepep"

    # ------------------------------------------------------------------ helpers

    def _check(self, x, topk_ids, topk_weights):
        if not isinstance(x, torch.Tensor) or x.dim() != 2 or x.shape[1] != self.h:
            raise ValueError(f"x must be [tokens, H={self.h}], got {tuple(getattr(x, 'shape', ()))}")
        t = x.shape[0]
        if t > self.max_tokens:
            raise ValueError(f"x has {t} tokens, more than max_tokens={self.max_tokens}")
        for name, v in (("topk_ids", topk_ids), ("topk_weights", topk_weights)):
            if not isinstance(v, torch.Tensor) or tuple(v.shape) != (t, self.topk):
                raise ValueError(f"{name} must be [{t}, {self.topk}], got {tuple(getattr(v, 'shape', ()))}")
            if v.device != self.device:
                raise ValueError(f"{name} is on {v.device}, the experts on {self.device}")
        if topk_ids.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"topk_ids must be int32 or int64, got {topk_ids.dtype}")

    def _pack(self, q, s, ids, w):
        """[T, row_bytes] uint8 rows: FP8 token, its scales (logical values), global ids, weights."""
        t = q.shape[0]
        dense = torch.empty(s.shape, dtype=s.dtype, device=s.device).copy_(s)  # row-major (a size-1 dim keeps
        # its stride under .contiguous(), and a byte view needs stride 1)
        parts = [q.view(torch.uint8), dense.view(torch.uint8).reshape(t, -1),
                 ids.contiguous().view(torch.uint8).reshape(t, -1), w.contiguous().view(torch.uint8).reshape(t, -1)]
        return torch.cat(parts, dim=1)

    def _unpack(self, rows):
        n, h, c = rows.shape[0], self.h, self.scale_cols
        q = rows[:, :h].contiguous().view(torch.float8_e4m3fn)
        s_vals = rows[:, h:h + 4 * c].contiguous().view(self.scale_dtype)
        s = L.alloc_scales((), n, self.h // self.gs, self.layout, self.device, zero=True)
        s.copy_(s_vals)
        ids = rows[:, h + 4 * c:h + 4 * c + 4 * self.topk].contiguous().view(torch.int32)
        w = rows[:, h + 4 * c + 4 * self.topk:].contiguous().view(torch.float32)
        return q, s, ids, w

    def _valid(self, topk_ids):
        """[T, k]: ids inside [0, W*E); the others are counted as invalid here, on the rank that saw them."""
        ids = topk_ids.long()
        valid = (ids >= 0) & (ids < self.num_global)
        self.counters[0] += (~valid).sum().to(torch.int32)
        return valid

    def _routes(self, topk_ids):
        """valid [T, k], owner rank [T, k], need [T, W] (a token goes once to each owner rank)."""
        ids = topk_ids.long()
        valid = self._valid(topk_ids)
        owner = torch.where(valid, ids // self.e, -1)
        ranks = torch.arange(self.world, device=self.device)
        need = (owner[:, :, None] == ranks[None, None, :]).any(dim=1)  # [T, W]
        return valid, need

    # ------------------------------------------------------------------ forward

    def __call__(self, x, topk_ids, topk_weights):
        self._check(x, topk_ids, topk_weights)
        if self.deepep is not None:
            return self.deepep(x, topk_ids, topk_weights)
        q, s = T.per_token_group_quant(x, self.gs, scale_layout=self.layout)
        valid, need = self._routes(topk_ids)
        ids = torch.where(valid, topk_ids.long(), self.null_id).to(torch.int32)
        rows = self._pack(q, s, ids, topk_weights.float())
        if self.mode == "low_latency":
            return self._low_latency(rows, need, x.dtype)
        return self._normal(rows, need, x.dtype)

    def _low_latency(self, rows, need, dtype):
        w, c, t = self.world, self.capacity, rows.shape[0]
        slot = torch.cumsum(need.to(torch.int32), dim=0) - 1  # [T, W]: the token's row in each slot block
        fits = need & (slot < c)
        self.counters[1] += (need & ~fits).sum().to(torch.int32)
        target = torch.where(fits, torch.arange(w, device=self.device)[None, :] * c + slot, w * c)  # [T, W]
        send = torch.zeros(w * c + 1, self.row_bytes, dtype=torch.uint8, device=self.device)
        send[:, self._ids_cols] = self._null_row  # empty slots name the expert no rank owns
        copies = rows[:, None, :].expand(t, w, self.row_bytes).reshape(-1, self.row_bytes)
        send.index_copy_(0, target.reshape(-1), copies)
        recv = torch.empty(w * c, self.row_bytes, dtype=torch.uint8, device=self.device)
        dist.all_to_all_single(recv, send[:w * c], group=self.group)
        q, s, ids, wts = self._unpack(recv)
        y = self.executor.forward_quantized(q, s, ids, wts)  # [W*C, H] bf16: my experts' weighted sums
        back = torch.empty_like(y)
        dist.all_to_all_single(back, y, group=self.group)
        back = torch.cat([back, back.new_zeros(1, self.h)])  # the dump row reads as zeros
        out = back[target.reshape(-1)].view(t, w, self.h).float().sum(dim=1)
        self._take_executor_counts()
        return out.to(dtype)

    def _take_executor_counts(self):
        """Rows the executor could not place count here too (on the device: no sync)."""
        self.counters += self.executor.counters - self._ex_seen
        self._ex_seen.copy_(self.executor.counters)

    def _normal(self, rows, need, dtype):
        w, t = self.world, rows.shape[0]
        counts = need.sum(dim=0).to(torch.int64)  # rows to each destination
        recv_counts = torch.empty_like(counts)
        dist.all_to_all_single(recv_counts, counts, group=self.group)
        send_splits, recv_splits = counts.tolist(), recv_counts.tolist()  # host sync (as DeepEP's normal mode)
        dest_major = need.t().reshape(-1)  # [W*T]: (dest, token) pairs in destination order
        token = torch.arange(t, device=self.device).repeat(w)[dest_major]
        send = rows[token]
        recv = torch.empty(sum(recv_splits), self.row_bytes, dtype=torch.uint8, device=self.device)
        dist.all_to_all_single(recv, send, recv_splits, send_splits, group=self.group)
        q, s, ids, wts = self._unpack(recv)
        if recv.shape[0]:
            y = self.executor.forward_quantized(q, s, ids, wts)
        else:
            y = torch.zeros(0, self.h, dtype=torch.bfloat16, device=self.device)
        back = torch.empty(send.shape[0], self.h, dtype=y.dtype, device=self.device)
        dist.all_to_all_single(back, y, send_splits, recv_splits, group=self.group)
        out = torch.zeros(t, self.h, dtype=torch.float32, device=self.device)
        out.index_add_(0, token, back.float())
        self._take_executor_counts()
        return out.to(dtype)

    def read_counters(self) -> dict[str, int]:
        """This rank's totals since construction (one host sync): ids it saw outside [0, W*E),
        and rows that did not fit (a slot block on the way out, or an expert's rows here)."""
        inv, ovf = self.counters.tolist()
        return {"invalid_ids": inv, "overflow": ovf}


class _DeepEPLowLatency:
    """EPMoE's low-latency mode through DeepEP's V1 Buffer: dispatch hands each local expert its
    received FP8 rows ([E, W x max_tokens, H], scales column-major per expert) and counts, which are
    the masked GEMMs' operands and masked_m; combine reduces the BF16 expert outputs with the top-k
    weights back on the source ranks. Invalid ids are counted here and passed as -1 (DeepEP skips them)."""

    def __init__(self, ep: EPMoE):
        import deep_ep

        self.ep = ep
        e, w, c, h = ep.e, ep.world, ep.max_tokens, ep.h
        hint = deep_ep.Buffer.get_low_latency_rdma_size_hint(c, h, w, ep.num_global)
        self.buffer = deep_ep.Buffer(ep.group, num_rdma_bytes=hint, low_latency_mode=True, num_qps_per_rank=e)
        self.ue8m0 = ep.layout == "ue8m0"
        # the experts run on ep.executor (the masked executor of W x max_tokens rows per expert):
        # DeepEP's receive tensor is exactly its run_experts() input

    def __call__(self, x, topk_ids, topk_weights):
        ep = self.ep
        idx = torch.where(ep._valid(topk_ids), topk_ids.long(), -1)
        (q, s), recv_count, handle, _, _ = self.buffer.low_latency_dispatch(
            x.to(torch.bfloat16), idx, ep.max_tokens, ep.num_global, use_fp8=True, round_scale=self.ue8m0,
            use_ue8m0=self.ue8m0)
        ex = ep.executor
        down = ex.run_experts(q, s, recv_count.to(torch.int32).contiguous(), ex.expected_m(x.shape[0]))
        out, _, _ = self.buffer.low_latency_combine(down, idx, topk_weights.float(), handle)
        return out.to(x.dtype)
