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
# The sm90_ws 128x256 experiment first and under a timeout: a kernel that hangs must not cost the run.
timeout 150 ./dev gpu-test "$out/wide" -q -k wide > "$out/wide-summary.log" 2>&1
echo "gpu-test -k wide: exit $?, $(tail -1 "$out/wide-summary.log")"
grep -E "^(FAILED|ERROR)" "$out/wide-summary.log" | head -10
./dev gpu-test "$out/gpu" -q -k "${kexpr:+($kexpr) and }not wide" > "$out/gpu-summary.log" 2>&1
echo "gpu-test: exit $?, $(tail -1 "$out/gpu-summary.log")"
grep -E "^(FAILED|ERROR)" "$out/gpu-summary.log" | head -20
python3 bench/quant.py --out "$out/quant.json" > "$out/bench.log" 2>&1 || tail -20 "$out/bench.log"
grep -v "^sweep" "$out/bench.log" | tail -32
python3 bench/gemm.py --out "$out/gemm.json" > "$out/gemm.log" 2>&1 || tail -20 "$out/gemm.log"
tail -14 "$out/gemm.log"
python3 bench/moe.py --out "$out/moe.json" > "$out/moe.log" 2>&1 || tail -20 "$out/moe.log"
tail -7 "$out/moe.log"
timeout 120 python3 bench/ws_tiles.py --out "$out/ws_tiles.json" --stages 3 4 > "$out/ws_tiles.log" 2>&1 ||
  tail -5 "$out/ws_tiles.log"
tail -10 "$out/ws_tiles.log"
