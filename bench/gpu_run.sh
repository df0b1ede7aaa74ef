#!/usr/bin/env bash
# One device call: build the extension, run every gpu-marked test, run the benchmarks.
#   bash bench/gpu_run.sh OUTDIR [pytest -k expression]
# JSON results in OUTDIR; the logs in OUTDIR/logs.tgz (the device returns only a few files);
# a short table is printed last.
set -uo pipefail
out=${1:?usage: bench/gpu_run.sh OUTDIR [-k expr]}
kexpr=${2:-}
logs=$out/logs
mkdir -p "$logs"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
start=$SECONDS
python3 tools/build_ext.py > "$logs/build.log" 2>&1 || { tail -40 "$logs/build.log"; exit 1; }
echo "build_ext: $((SECONDS - start))s, $(stat -c %s rtp_fp8/_C.so) bytes"
# DeepGEMM from its pinned archive (.accel/ or ../shared/third_party, see tools/build_deepgemm.py);
# gpu-test reuses this build, the benchmarks import it through the exported variables.
start=$SECONDS
if python3 tools/build_deepgemm.py --env-file "$logs/deepgemm.env" > "$logs/deepgemm-build.log" 2>&1; then
  echo "deepgemm: $((SECONDS - start))s"; set -a; source "$logs/deepgemm.env"; set +a
else
  echo "deepgemm: not built (exit $?): $(tail -1 "$logs/deepgemm-build.log")"
fi
./dev gpu-test "$logs/gpu" -q ${kexpr:+-k "$kexpr"} > "$logs/gpu-summary.log" 2>&1
echo "gpu-test: exit $?, $(tail -1 "$logs/gpu-summary.log")"
grep -E "^(FAILED|ERROR)|^dev: deepgemm" "$logs/gpu-summary.log" | head -20
python3 bench/quant.py --out "$out/quant.json" > "$logs/bench.log" 2>&1 || tail -20 "$logs/bench.log"
grep -v "^sweep" "$logs/bench.log" | tail -32
python3 bench/gemm.py --out "$out/gemm.json" > "$logs/gemm.log" 2>&1 || tail -20 "$logs/gemm.log"
tail -14 "$logs/gemm.log"
python3 bench/moe.py --out "$out/moe.json" > "$logs/moe.log" 2>&1 || tail -20 "$logs/moe.log"
tail -7 "$logs/moe.log"
timeout 120 python3 bench/ws_tiles.py --out "$out/ws_tiles.json" > "$logs/ws_tiles.log" 2>&1 ||
  tail -5 "$logs/ws_tiles.log"
tail -10 "$logs/ws_tiles.log"
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
