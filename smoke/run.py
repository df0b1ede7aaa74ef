"""The main job: smoke tasks on the embedded default model, FP8 vs BF16 vs goldens.

    ./dev smoke [--rewrite] [--arch sm90] [--task NAME] [--model-dir DIR]
    bazel run //smoke:run -- [same flags]

For the detected Arch (CPU included; --arch forces another scale format, e.g. sm100 on
any machine), every task in smoke/tasks/*.json runs through the FP8 path (online FP8
weights in the arch's scale format, TP split, per-token-group activations, the task's
GEMM backend) and through the BF16 reference. A task fails when the FP8 tokens differ
from the BF16 tokens in the first `tokens_equal_steps` steps, when the cosine of the
logits falls under `min_cosine`, when any single FP8 linear (each expert on its own), run on
the BF16 path's own input, is further than `max_linear_rel_l2` (relative L2, default 0.08) from
its BF16 twin, when it disagrees with the golden
smoke/goldens/<arch>/<task>.json (tokens exactly, logits summary within 1e-2 relative), or
when that golden is missing.
--rewrite writes new goldens only for tasks whose BF16 gate passes, and prints the diff.
--model-dir runs the same tasks on a user's BF16 checkpoint of this architecture.
"""

from __future__ import annotations

import argparse
import difflib
import json
import pathlib
import sys
import time

import torch

from rtp_fp8 import arch as A
from smoke import model as MD

HERE = pathlib.Path(__file__).resolve().parent
TASKS = HERE / "tasks"
GOLDENS = HERE / "goldens"
SUMMARY_RTOL = 1e-2
# Per-linear gate (smoke.model.Probe): relative L2 of each FP8 linear against its BF16 twin on the
# same input. FP8 noise measures 0.032-0.054 over every task and arch format (UE8M0 the larger); a
# linear scaled by 1.5 gives 0.5 (tests/smoke/test_smoke_gate.py: the mutation table).
MAX_LINEAR_REL_L2 = 0.08
ARCHS = {"cpu": A.CPU, "sm90": A.Arch(9, 0), "sm100": A.Arch(10, 0), "sm120": A.Arch(12, 0)}


def load_tasks(only: str | None = None) -> list[dict]:
    tasks = []
    for p in sorted(TASKS.glob("*.json")):
        t = json.loads(p.read_text())
        t.setdefault("name", p.stem)
        for key in ("prompt", "steps", "tp", "backend", "criteria"):
            if key not in t:
                raise ValueError(f"{p}: task lacks {key!r}")
        if only is None or t["name"] == only:
            tasks.append(t)
    if only and not tasks:
        raise ValueError(f"--task {only!r}: no such task in {TASKS}")
    return tasks


def summarize(logits: torch.Tensor) -> dict:
    top2 = logits.topk(2, dim=-1).values
    return {"top1_margin_min": round(float((top2[:, 0] - top2[:, 1]).min()), 4),
            "logit_sum": round(float(logits.sum()), 4), "logit_norm": round(float(logits.norm()), 4)}


def run_task(task: dict, arch: A.Arch, cfg: dict, tensors: dict, device: str) -> dict:
    plan = MD.weight_plan(cfg)
    t0 = time.perf_counter()
    ref_tokens, ref_logits = MD.greedy(task["prompt"], task["steps"], tensors, MD.Bf16Linears(tensors), cfg)
    lin = MD.Fp8Linears(tensors, plan, arch, task["tp"], task["backend"], device)
    tokens, logits = MD.greedy(task["prompt"], task["steps"], tensors, lin, cfg)
    errors = MD.linear_errors(task["prompt"] + ref_tokens, tensors, MD.Bf16Linears(tensors), lin, cfg, plan)
    dt = time.perf_counter() - t0
    cos = float(torch.nn.functional.cosine_similarity(logits.flatten().double(), ref_logits.flatten().double(), 0))
    crit = task["criteria"]
    n_eq = crit.get("tokens_equal_steps", task["steps"])
    agreed = 0
    for a, b in zip(tokens, ref_tokens):
        if a != b:
            break
        agreed += 1
    worst = max(errors, key=errors.get)
    max_err = crit.get("max_linear_rel_l2", MAX_LINEAR_REL_L2)
    gate = agreed >= n_eq and cos >= crit.get("min_cosine", 0.999) and errors[worst] <= max_err
    return {"task": task["name"], "arch": arch.family, "backend": task["backend"], "tp": task["tp"],
            "tokens": tokens, "ref_tokens": ref_tokens, "agreed": agreed, "steps": task["steps"], "cosine": cos,
            "worst_linear": worst, "worst_rel_l2": errors[worst], "max_rel_l2": max_err, "linear_errors": errors,
            "gate": gate, "summary": summarize(logits), "time_s": dt}


def golden_payload(r: dict) -> dict:
    return {"task": r["task"], "arch": r["arch"], "backend": r["backend"], "tp": r["tp"], "tokens": r["tokens"],
            "logits_summary": r["summary"],
            "versions": {"torch": torch.__version__, "rtp_fp8": __import__("rtp_fp8").__version__}}


def compare_golden(r: dict, golden: dict) -> list[str]:
    problems = []
    if golden["tokens"] != r["tokens"]:
        problems.append(f"tokens {r['tokens']} != golden {golden['tokens']}")
    for k, v in golden["logits_summary"].items():
        got = r["summary"][k]
        if abs(got - v) > SUMMARY_RTOL * max(abs(v), 1.0):
            problems.append(f"{k} {got} != golden {v} (rtol {SUMMARY_RTOL})")
    return problems


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="./dev smoke", description=__doc__.split("\n\n")[0])
    ap.add_argument("--rewrite", action="store_true", help="write goldens for tasks whose BF16 gate passes")
    ap.add_argument("--arch", choices=sorted(ARCHS), help="scale format/arch to run (default: detected)")
    ap.add_argument("--task", help="run one task")
    ap.add_argument("--model-dir", help="a BF16 checkpoint (config.json + *.safetensors) of this architecture")
    a = ap.parse_args(argv)
    arch = ARCHS[a.arch] if a.arch else A.detect()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        tasks = load_tasks(a.task)  # before the checkpoint: a wrong --task costs nothing
        model_dir = pathlib.Path(a.model_dir) if a.model_dir else MD.ensure_default_checkpoint()
        if not model_dir.is_dir():
            raise ValueError(f"--model-dir {model_dir}: not a directory")
        from rtp_fp8.loader.online_fp8 import load_safetensors

        cfg, tensors = load_safetensors(model_dir)
        if cfg.get("architecture") != MD.CONFIG["architecture"]:
            raise ValueError(f"{model_dir}/config.json architecture {cfg.get('architecture')!r} is not "
                             f"{MD.CONFIG['architecture']!r}")
        lacking = [k for k in MD.CONFIG if k not in cfg]
        if lacking:
            raise ValueError(f"{model_dir}/config.json lacks {lacking} (this architecture's keys: {sorted(MD.CONFIG)})")
        missing = sorted(set(MD.tensor_names(cfg)) - set(tensors))
        if missing:
            raise ValueError(f"--model-dir {model_dir}: checkpoint lacks {len(missing)} tensors of this "
                             f"architecture, e.g. {missing[:3]}")
    except (OSError, ValueError, KeyError) as exc:
        print(f"smoke: error: {exc}", file=sys.stderr)
        return 2
    tensors = {k: v.to(device) for k, v in tensors.items()}
    use_goldens = a.model_dir is None
    results, failed = [], False
    for task in tasks:
        r = run_task(task, arch, cfg, tensors, device)
        gpath = GOLDENS / arch.family / f"{task['name']}.json"
        r["golden"] = "-"
        if use_goldens and not a.rewrite:
            if gpath.exists():
                probs = compare_golden(r, json.loads(gpath.read_text()))
                r["golden"] = "ok" if not probs else "DIFF"
                for p in probs:
                    print(f"smoke: {task['name']}: golden {gpath}: {p}")
            else:  # a missing golden is a failure, not a pass: record one with --rewrite
                print(f"smoke: {task['name']}: no golden {gpath} (record one with --rewrite)")
                r["golden"] = "none"
        if use_goldens and a.rewrite:
            if not r["gate"]:
                print(f"smoke: {task['name']}: refusing to rewrite the golden: FP8 disagrees with the BF16 reference")
                r["golden"] = "refused"
            else:
                new = json.dumps(golden_payload(r), indent=2, sort_keys=True) + "\n"
                old = gpath.read_text() if gpath.exists() else ""
                sys.stdout.writelines(difflib.unified_diff(old.splitlines(True), new.splitlines(True),
                                                           str(gpath) + " (old)", str(gpath) + " (new)"))
                gpath.parent.mkdir(parents=True, exist_ok=True)
                gpath.write_text(new)
                r["golden"] = "written"
        failed |= not r["gate"] or r["golden"] in ("DIFF", "refused", "none")
        results.append(r)
    print(f"{'task':18s} {'arch':6s} {'backend':9s} {'tp':>2s} {'agreed':>7s} {'cosine':>9s} "
          f"{'worst linear (rel L2 / max)':>44s} {'golden':>8s} {'time_s':>7s} result")
    for r in results:
        ok = r["gate"] and r["golden"] not in ("DIFF", "refused", "none")
        worst = f"{r['worst_linear']} {r['worst_rel_l2']:.3f}/{r['max_rel_l2']:.2f}"
        print(f"{r['task']:18s} {r['arch']:6s} {r['backend']:9s} {r['tp']:2d} {r['agreed']:3d}/{r['steps']:<3d} "
              f"{r['cosine']:9.6f} {worst:>44s} {r['golden']:>8s} {r['time_s']:7.1f} {'PASS' if ok else 'FAIL'}")
    print("smoke:", "FAILED" if failed else "passed", f"({arch.family}, {device})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
