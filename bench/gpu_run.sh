#!/usr/bin/env bash
# One device call: build the extension, run every gpu-marked test, run the benchmarks.
#   bash bench/gpu_run.sh OUTDIR [-k EXPR] [--steps LIST] [--gpu NAME] [--archs ARCHS] [--workers N]
#     -k EXPR       only the gpu-marked tests matching the pytest -k expression (also: a bare 2nd argument)
#     --steps LIST  comma-separated, in this order whatever the list's: gpu-test,quant,gemm,moe,ws_tiles
#                   (default: all). The extension and DeepGEMM are built first whatever the steps.
#     --gpu NAME    exit 3 at once, before any build, unless nvidia-smi's GPU name contains NAME
#                   (a result owed to one card is not taken on another)
#     --archs ARCHS passed to tools/build_ext.py (e.g. sm_90a: a shorter build on an SM90 card)
#     --workers N   run the gpu-marked tests in N pytest-xdist workers on the one GPU (default 1)
# JSON results in OUTDIR; the logs in OUTDIR/logs.tgz (the device returns only a few files);
# a short table is printed last.
set -uo pipefail
usage="usage: bash bench/gpu_run.sh OUTDIR [-k EXPR] [--steps LIST] [--gpu NAME] [--archs ARCHS] [--workers N]"
all_steps="gpu-test,quant,gemm,moe,ws_tiles"
out=${1:?$usage}
shift
kexpr="" steps=$all_steps gpu="" archs="" workers=1
if [[ $# -gt 0 && $1 != -* ]]; then kexpr=$1; shift; fi
while [[ $# -gt 0 ]]; do
  [[ $# -ge 2 ]] || { echo "bench/gpu_run.sh: $1 needs a value; $usage" >&2; exit 2; }
  case $1 in
    -k) kexpr=$2 ;;
    --steps) steps=$2 ;;
    --gpu) gpu=$2 ;;
    --archs) archs=$2 ;;
    --workers) workers=$2 ;;
    *) echo "bench/gpu_run.sh: unknown argument $1; $usage" >&2; exit 2 ;;
  esac
  shift 2
done
for s in ${steps//,/ }; do
  [[ ",$all_steps," == *",$s,"* ]] || { echo "bench/gpu_run.sh: --steps: unknown step '$s' (of $all_steps)" >&2; exit 2; }
done
[[ $workers =~ ^[1-9][0-9]*$ ]] || { echo "bench/gpu_run.sh: --workers: '$workers' is not a positive integer" >&2; exit 2; }
want() { [[ ",$steps," == *",$1,"* ]]; }

card=$(nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader 2>/dev/null | head -1)
name=${card%%,*}
if [[ -n $gpu && $name != *"$gpu"* ]]; then
  echo "bench/gpu_run.sh: --gpu $gpu: this machine's GPU is '${name:-none found}'; nothing run" >&2
  exit 3
fi
echo "${card:-nvidia-smi: no GPU found}"
logs=$out/logs
mkdir -p "$logs"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
start=$SECONDS
python3 tools/build_ext.py ${archs:+--archs $archs} > "$logs/build.log" 2>&1 || { tail -40 "$logs/build.log"; exit 1; }
echo "build_ext: $((SECONDS - start))s, $(stat -c %s rtp_fp8/_C.so) bytes"
# DeepGEMM from its pinned archive (.accel/ or ../shared/third_party, see tools/build_deepgemm.py);
# gpu-test reuses this build, the benchmarks import it through the exported variables.
start=$SECONDS
if python3 tools/build_deepgemm.py --env-file "$logs/deepgemm.env" > "$logs/deepgemm-build.log" 2>&1; then
  echo "deepgemm: $((SECONDS - start))s"; set -a; source "$logs/deepgemm.env"; set +a
else
  echo "deepgemm: not built (exit $?): $(tail -1 "$logs/deepgemm-build.log")"
fi
if want gpu-test; then
  xdist=()
  [[ $workers -gt 1 ]] && xdist=(-n "$workers")
  ./dev gpu-test "$logs/gpu" -q "${xdist[@]}" ${kexpr:+-k "$kexpr"} > "$logs/gpu-summary.log" 2>&1
  echo "gpu-test: exit $?, $(tail -1 "$logs/gpu-summary.log")"
  grep -E "^(FAILED|ERROR)|^dev: deepgemm" "$logs/gpu-summary.log" | head -20
fi
if want quant; then
  python3 bench/quant.py --out "$out/quant.json" > "$logs/bench.log" 2>&1 || tail -20 "$logs/bench.log"
  grep -v "^sweep" "$logs/bench.log" | tail -32
fi
if want gemm; then
  python3 bench/gemm.py --out "$out/gemm.json" > "$logs/gemm.log" 2>&1 || tail -20 "$logs/gemm.log"
  tail -14 "$logs/gemm.log"
fi
if want moe; then
  python3 bench/moe.py --out "$out/moe.json" > "$logs/moe.log" 2>&1 || tail -20 "$logs/moe.log"
  tail -7 "$logs/moe.log"
fi
if want ws_tiles; then
  timeout 120 python3 bench/ws_tiles.py --out "$out/ws_tiles.json" > "$logs/ws_tiles.log" 2>&1 ||
    tail -5 "$logs/ws_tiles.log"
  tail -10 "$logs/ws_tiles.log"
fi
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
