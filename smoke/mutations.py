"""Mutations of the FP8 path that the smoke gate must catch (tests/smoke/test_smoke_gate.py).

    PYTHONPATH=. python3 -m smoke.mutations [--task NAME]   # the table in docs/smoke_gate.md

Each mutation breaks one thing after the FP8 weights are made (a whole linear zeroed, scaled or
negated; one expert scaled by 1.5 or 2; one layer's weight transposed in 128x128 blocks; weight
scales in the wrong row order; every token given its neighbour's activation scales) and leaves
the rest of the model healthy. `mutated(name)` is an Fp8Linears subclass carrying it.
"""

from __future__ import annotations

import argparse

import torch

from smoke import model as MD

BASE = MD.Fp8Linears  # the healthy class (table() swaps MD.Fp8Linears while it runs)


def _scale_output(name, factor, expert=None):
    def linear(self, x, n, e=None):
        y = BASE.linear(self, x, n, e)
        return (y.float() * factor).to(torch.bfloat16) if n == name and (expert is None or e == expert) else y

    return {"linear": linear}


def _on_weights(fn):
    def init(self, *args, **kw):
        BASE.__init__(self, *args, **kw)
        for rank in self.ranks:
            fn(rank)

    return {"__init__": init}


def _zero(name):
    return _on_weights(lambda r: r[name].q.zero_())


def _transpose_blocks(name):
    def fn(r):
        q = r[name].q
        n, k = q.shape
        blocks = q.view(n // 128, 128, k // 128, 128)
        r[name].q = blocks.permute(2, 1, 0, 3).reshape(k, n).contiguous()  # block (i, j) -> (j, i)

    return _on_weights(fn)


def _flip_scale_rows(name):
    def fn(r):
        r[name].scales = torch.flip(r[name].scales, [-2]).contiguous()  # rows of scales in reverse order

    return _on_weights(fn)


def _roll_activation_scales():
    def gemm(self, x, w, expert=None):
        real = MD.quantize_activation

        def rolled(x_, group_size=128, arch=None, backend=None):
            q, s = real(x_, group_size, arch=arch, backend=backend)
            return q, torch.roll(s, 1, dims=0)  # each token gets its neighbour's scales

        MD.quantize_activation = rolled
        try:
            return BASE._gemm(self, x, w, expert)
        finally:
            MD.quantize_activation = real

    return {"_gemm": gemm}


MUTATIONS = {
    "zeroed linear (layers.0.w_down)": _zero("layers.0.w_down"),
    "linear x1.5 (layers.0.wv)": _scale_output("layers.0.wv", 1.5),
    "linear x2 (layers.1.wo)": _scale_output("layers.1.wo", 2.0),
    "negated linear (layers.0.wo)": _scale_output("layers.0.wo", -1.0),
    "expert 1 w_down x1.5": _scale_output("layers.1.experts.w_down", 1.5, expert=1),
    "expert 1 w_down x2": _scale_output("layers.1.experts.w_down", 2.0, expert=1),
    "wq transposed in 128x128 blocks (layer 1)": _transpose_blocks("layers.1.wq"),
    "weight scales in reverse row order (layers.0.w_up)": _flip_scale_rows("layers.0.w_up"),
    "activation scales of the neighbouring token": _roll_activation_scales(),
}


def mutated(name: str) -> type:
    return type("Mutated", (BASE,), MUTATIONS[name])


def table(task_name: str = "dense_moe_tp1", archs=("sm90", "sm100")) -> list[dict]:
    """The gate's verdict on real FP8 (every arch) and on each mutation (the given archs)."""
    from rtp_fp8.loader.online_fp8 import load_safetensors
    from smoke import run as SR

    cfg, tensors = load_safetensors(MD.ensure_default_checkpoint())
    task = SR.load_tasks(task_name)[0]
    rows = []
    for arch in ("cpu", "sm90", "sm100", "sm120"):
        rows.append({"mutation": "none (real FP8)", **_verdict(SR.run_task(task, SR.ARCHS[arch], cfg, tensors, "cpu"))})
    for name in MUTATIONS:
        for arch in archs:
            MD.Fp8Linears = mutated(name)
            try:
                r = SR.run_task(task, SR.ARCHS[arch], cfg, tensors, "cpu")
            finally:
                MD.Fp8Linears = BASE
            rows.append({"mutation": name, **_verdict(r)})
    return rows


def _verdict(r: dict) -> dict:
    return {"arch": r["arch"], "agreed": f"{r['agreed']}/{r['steps']}", "cosine": r["cosine"],
            "worst": r["worst_linear"], "rel_l2": r["worst_rel_l2"], "gate": "pass" if r["gate"] else "FAIL"}


def main() -> int:
    ap = argparse.ArgumentParser(prog="smoke.mutations")
    ap.add_argument("--task", default="dense_moe_tp1")
    a = ap.parse_args()
    print("| mutation | arch | tokens agreed | logits cosine | worst linear | its rel L2 | gate |")
    print("|---|---|---:|---:|---|---:|---|")
    for r in table(a.task):
        print(f"| {r['mutation']} | {r['arch']} | {r['agreed']} | {r['cosine']:.6f} | {r['worst']} | "
              f"{r['rel_l2']:.3f} | {r['gate']} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
