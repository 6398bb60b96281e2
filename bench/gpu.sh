#!/usr/bin/env bash
# `jaxrl-dist bench` on the lent GPU machine (one H200, 16 cores, CPython 3.12 with jax,
# flax, optax, chex, orbax, numpy, matplotlib, seaborn, tensorboard; no package index).
#
#     bash bench/gpu.sh [BUDGET_S]     # from the repo root, with .whl/ (bench/gpu_wheels.sh) beside it
#
# A device session has about 15 minutes in all and a call at most 10, so the suite runs
# as two calls of this script, each under its own budget (`--budget-s`, default 480 s),
# both on bench/out/gpu with `--resume`: the second call runs the cases the first did
# not reach (priority order: `jaxrl_dist.tools.benchmark.ORDER`), and a case the first killed
# at the budget keeps the figures of the chunks it finished. A warm machine keeps
# bench/out/gpu between calls; carried, it resumes on a fresh machine too:
#
#     run  command="bash bench/gpu.sh 480"  carry=[".whl"]                  timeout_s=570
#     mkdir -p bench/out/gpu && cp FILES_AT/bench.json bench/out/gpu/    # here, between the calls
#     run  command="bash bench/gpu.sh 240"  carry=[".whl", "bench/out/gpu"]  timeout_s=330
#
# The wheels in .whl/ go to /tmp/site; the repo itself is imported from the working
# tree. Outputs, copied to $OUT (at most 8 files come back): gpu_log.txt, bench.json,
# bench.md, bench_sps.png, bench_time.png, bench_scaling.png, profile.tar.gz (a JAX
# profiler trace of GPU_BENCH_PROFILE, default cartpole_2048, when the budget leaves
# time for it) and logs.tar.gz (every case's train log).
# Smoke test without a GPU, with the project's venv first on PATH (no wheels installed):
#   PATH=.venv/bin:$PATH GPU_BENCH_NO_INSTALL=1 GPU_BENCH_ALLOW_CPU=1 GPU_BENCH_ARGS=--quick \
#     GPU_BENCH_PROFILE=cartpole_1 OUT=/tmp/gpu-smoke bash bench/gpu.sh 80
if [[ -n $GPU_BENCH_NO_INSTALL ]]; then  # a smoke test where python3 already has the packages
  export PYTHONPATH=$PWD
elif python3 -m pip --version >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit 1
else  # no pip in this interpreter: a wheel is a zip laid out for site-packages
  python3 -c 'import sys, zipfile; [zipfile.ZipFile(w).extractall("/tmp/site") for w in sys.argv[1:]]' .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit 1
fi
export PYTHONUNBUFFERED=1
set -o pipefail

START=$SECONDS
BUDGET=${1:-${GPU_BENCH_BUDGET_S:-480}}
DIR=bench/out/gpu
OUT=${OUT:-$DIR}
mkdir -p "$DIR" "$OUT"
LOG=$DIR/gpu_log.txt
log() { echo "$*" | tee -a "$LOG"; }
check() {  # CAP_S CMD...: a setup command under a time cap, its output logged
  local cap=$1; shift
  log "\$ $*"
  timeout -k 5 "$cap" "$@" 2>&1 | tee -a "$LOG"
}

log "=== machine ($(date -u '+%F %T') UTC)"
check 30 nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,utilization.gpu --format=csv
check 60 python3 -c '
import jax, sys
print(sys.version.split()[0], "jax", jax.__version__, jax.devices())
sys.exit(0 if jax.default_backend() == "gpu" else 1)' || [[ -n $GPU_BENCH_ALLOW_CPU ]] || { log "no GPU backend: stopping"; exit 1; }
check 10 git log -1 --format='commit %h %s'
check 10 git status --short -- jaxrl_dist bench

# the suite gets what is left of the call's budget after the set-up above
left=$((BUDGET - (SECONDS - START) - 5))
log "=== jaxrl-dist bench --budget-s $left (call budget ${BUDGET}s)"
# shellcheck disable=SC2086  # GPU_BENCH_ARGS: extra flags, e.g. --quick for a smoke test
timeout -k 5 $((left + 20)) python3 -m jaxrl_dist bench --resume --out "$DIR" --budget-s "$left" \
  --profile "${GPU_BENCH_PROFILE:-cartpole_2048}" $GPU_BENCH_ARGS 2>&1 | tee -a "$LOG"
log "=== bench exit ${PIPESTATUS[0]} after $((SECONDS - START))s"

cp "$DIR"/bench.json "$DIR"/bench.md "$DIR"/bench_*.png "$OUT"/ 2>/dev/null
if [[ -d $DIR/profile ]]; then  # a file over 16 MiB would not come back
  tar -czf "$OUT"/profile.tar.gz -C "$DIR" profile
  (( $(stat -c %s "$OUT"/profile.tar.gz) > 16000000 )) && rm "$OUT"/profile.tar.gz && log "profile.tar.gz over 16 MB: left out"
fi
[[ -d $DIR/runs ]] && (cd "$DIR" && find runs -name '*.log' -print0 | tar -czf "$OUT"/logs.tar.gz --null -T -)
log "=== done in $((SECONDS - START))s"
[[ $OUT != "$DIR" ]] && cp "$LOG" "$OUT"/
exit 0
