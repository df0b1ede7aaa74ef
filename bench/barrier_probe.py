"""What the consumer's per-step warpgroup barriers cost in sm90_ws (issue #28), timed on the GPU.

    PYTHONPATH=. python3 bench/barrier_probe.py [--out probe.json]

Triton's shared-memory barrier pass puts a `bar.sync <id>, 128` (the consumer warpgroup's) before each
K step's `mbarrier.try_wait` and before each `mbarrier.arrive` (Gluon arrives from thread 0 for the
warpgroup). DeepGEMM arrives once per warp and needs neither. This measures what they cost: each
shape's kernel is compiled three times in child processes (fresh Triton caches), as shipped and
from its own PTX with barriers taken out through Triton's kernel override (TRITON_KERNEL_OVERRIDE):
"no wait sync" drops the barriers before the waits (each thread waits on the mbarrier itself);
"no syncs" drops every consumer barrier in the K loop, the arrive's too, so thread 0 may release a
slot while other warps still read it. That variant is an upper bound on the gain, not a correct
kernel. Each variant's output is compared with the shipped kernel's bit for bit. An experiment:
nothing here ships an edited kernel. The kernels are launched without B-scale staging (sb_stage=False),
as they shipped when this was written; a staged tile adds a wait and a release per tile.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
# (M, N, K, tile rows, tile width): the two 64-row-tile shapes furthest behind DeepGEMM, and a
# 128x256-tile M=4096 shape
SHAPES = [(64, 7168, 2048, 64, 64), (128, 4096, 7168, 64, 64), (4096, 4096, 7168, 128, 256)]
SYNC = re.compile(r"^\s*bar\.sync\s+\d+,\s*128;\s*$")  # a consumer warpgroup's named barrier


def strip_syncs(ptx, before=("mbarrier.try_wait", )):
    """ptx without the warpgroup barriers whose next instruction (past braces, `.reg` lines, labels,
    comments and a predicate guard) starts with one of `before` -> (ptx, number removed)."""
    lines = ptx.splitlines(keepends=True)
    keep, removed = [], 0
    for i, line in enumerate(lines):
        if SYNC.match(line):
            nxt = next((x.strip() for x in lines[i + 1:] if x.strip() and not x.strip().startswith(
                ("{", ".reg", "//", ".loc")) and not x.strip().endswith(":")), "")
            if re.sub(r"^@!?%p\d+\s+", "", nxt).startswith(before):
                removed += 1
                continue
        keep.append(line)
    return "".join(keep), removed


def _child(out_dir):
    import torch

    from bench.common import graph_ms
    from bench.gemm import dense_inputs
    from rtp_fp8.gemm.triton import block_scaled as G
    from rtp_fp8.gemm.triton import sm90_ws as W

    res = []
    for m, n, k, bm, bn in SHAPES:
        torch.manual_seed(m + n + k)
        a, sa, b, sb, out = dense_inputs(m, n, k)
        out.fill_(float("nan"))

        def call(a=a, sa=sa, b=b, sb=sb, out=out, bm=bm, bn=bn):
            W.launch(G.DENSE, a, sa, b, sb, sb, sb, 1, out, bm=bm, bn=bn, sb_stage=False)
        call()
        torch.cuda.synchronize()
        torch.save(out.cpu(), os.path.join(out_dir, f"out_{m}_{n}_{k}.pt"))
        res.append({"shape": [m, n, k], "tile": f"{bm}x{bn}", "us": graph_ms(call) * 1e3})
    print(json.dumps(res))


def _run(env_extra):
    with tempfile.TemporaryDirectory() as cache, tempfile.TemporaryDirectory() as outs:
        env = dict(os.environ, TRITON_CACHE_DIR=cache, **env_extra)
        proc = subprocess.run([sys.executable, __file__, "--child", outs], cwd=ROOT, env=env, capture_output=True,
                              text=True)
        if proc.returncode:
            return {"error": proc.stderr[-2000:]}, {}
        import torch
        rows = json.loads(proc.stdout.strip().splitlines()[-1])
        return rows, {f: torch.load(os.path.join(outs, f)) for f in os.listdir(outs)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--child")
    ap.add_argument("--out")
    args = ap.parse_args()
    if args.child:
        return _child(args.child)
    import torch

    from bench.common import environment
    dump = tempfile.mkdtemp()
    shipped, ref = _run({"TRITON_KERNEL_DUMP": "1", "TRITON_DUMP_DIR": dump})
    res = {"env": environment(), "shipped": shipped}
    for name, before in (("no wait sync", ("mbarrier.try_wait", )),
                         ("no syncs", ("mbarrier.try_wait", "mbarrier.arrive.shared"))):
        override = tempfile.mkdtemp()
        removed = {}
        for ptx in pathlib.Path(dump).rglob("*.ptx"):
            dst = pathlib.Path(override) / ptx.relative_to(dump)
            dst.parent.mkdir(parents=True, exist_ok=True)
            text, removed[ptx.parent.name] = strip_syncs(ptx.read_text(), before)
            dst.write_text(text)
        rows, outs = _run({"TRITON_KERNEL_OVERRIDE": "1", "TRITON_OVERRIDE_DIR": override})
        if isinstance(rows, list):
            for r in rows:
                f = "out_{}_{}_{}.pt".format(*r["shape"])
                r["bit_identical"] = f in outs and f in ref and torch.equal(outs[f], ref[f])
        res[name] = {"rows": rows, "removed": removed}
        shutil.rmtree(override)
    shutil.rmtree(dump)
    print(json.dumps({k: v for k, v in res.items() if k != "env"}, indent=1))
    if args.out:
        pathlib.Path(args.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
