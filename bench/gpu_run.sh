#!/usr/bin/env bash
# One device call: build the extension, run every gpu-marked test, run the benchmarks.
#   bash bench/gpu_run.sh OUTDIR [pytest -k expression]
# Logs and JSON under OUTDIR; a short table is printed last.
set -uo pipefail
out=${1:?usage: bench/gpu_run.sh OUTDIR [-k expr]}
kexpr=${2:-}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
start=$SECONDS
python3 tools/build_ext.py > "$out/build.log" 2>&1 || { tail -40 "$out/build.log"; exit 1; }
echo "build_ext: $((SECONDS - start))s, $(stat -c %s rtp_fp8/_C.so) bytes"
./dev gpu-test "$out/gpu" -q ${kexpr:+-k "$kexpr"} > "$out/gpu-summary.log" 2>&1
echo "gpu-test: exit $?, $(tail -1 "$out/gpu-summary.log")"
grep -E "^(FAILED|ERROR)" "$out/gpu-summary.log" | head -20
python3 bench/quant.py --out "$out/quant.json" > "$out/bench.log" 2>&1 || tail -20 "$out/bench.log"
grep -v "^sweep" "$out/bench.log" | tail -32
python3 bench/gemm.py --out "$out/gemm.json" > "$out/gemm.log" 2>&1 || tail -20 "$out/gemm.log"
tail -14 "$out/gemm.log"
python3 bench/moe.py --out "$out/moe.json" > "$out/moe.log" 2>&1 || tail -20 "$out/moe.log"
tail -7 "$out/moe.log"
