#!/usr/bin/env bash
# bench/fused.py on the lent GPU machine (one H200, 16 cores, CPython 3.12 with jax,
# flax, optax, chex, orbax, numpy, matplotlib, seaborn, tensorboard; no package index).
#
#     bash bench/gpu.sh          # from the repo root, with .whl/ (bench/gpu_wheels.sh) beside it
#
# The wheels in .whl/ go to /tmp/site; the repo itself is imported from the working
# tree. Steps run in order of importance (envpool Pong rollout vs envpool's numpy
# API first, then CartPole), each under `timeout` and all under one deadline
# (GPU_BENCH_BUDGET_S seconds from the start, default 270): a step that would start
# with too little time left is skipped, so the script ends within about 4.7 minutes.
# Every step adds its rows to one JSON (--resume), saved after each case, so a step
# cut short loses only the case it was in. Outputs, in $OUT (bench/out/gpu without
# it): gpu_log.txt (everything printed), fused_gpu.json, fused_gpu.md.
# Smoke test without a GPU: GPU_BENCH_ALLOW_CPU=1 GPU_BENCH_ARGS=--quick bash bench/gpu.sh
if python3 -m pip --version >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit 1
else  # no pip in this interpreter: a wheel is a zip laid out for site-packages
  python3 -c 'import sys, zipfile; [zipfile.ZipFile(w).extractall("/tmp/site") for w in sys.argv[1:]]' .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit 1
fi
export PYTHONUNBUFFERED=1
set -o pipefail

START=$SECONDS
BUDGET=${GPU_BENCH_BUDGET_S:-270}
OUT=${OUT:-bench/out/gpu}
mkdir -p "$OUT"
LOG=$OUT/gpu_log.txt
JSON=$OUT/fused_gpu.json
: > "$LOG"
log() { echo "$*" | tee -a "$LOG"; }

# check CAP_S CMD...: a setup command under a time cap, its output logged
check() {
  local cap=$1; shift
  log "\$ $*"
  timeout -k 5 "$cap" "$@" 2>&1 | tee -a "$LOG"
}

# step NAME CAP_S NEED_S ARGS...: bench/fused.py ARGS, under min(CAP_S, time left);
# skipped when less than NEED_S seconds are left before the deadline
step() {
  local name=$1 cap=$2 need=$3; shift 3
  local left=$((BUDGET - (SECONDS - START)))
  if ((left < need)); then
    log "=== [$name] skipped: ${left}s left, needs ${need}s"
    return
  fi
  local limit=$((cap < left ? cap : left))
  log "=== [$name] at $((SECONDS - START))s, limit ${limit}s: bench/fused.py $*"
  local t0=$SECONDS
  # shellcheck disable=SC2086  # GPU_BENCH_ARGS: extra options, e.g. --quick for a smoke test
  timeout -k 5 "$limit" python3 bench/fused.py --resume --out "$JSON" --retries 1 "$@" $GPU_BENCH_ARGS 2>&1 \
    | tee -a "$LOG"
  local rc=${PIPESTATUS[0]}
  log "=== [$name] exit $rc$( ((rc == 124)) && echo ' (timed out)') after $((SECONDS - t0))s"
}

log "=== machine"
check 30 nvidia-smi -L
check 30 nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,utilization.gpu --format=csv
check 10 nproc
check 60 python3 -c 'import sys, jax, jaxlib; print(sys.version); print("jax", jax.__version__, "jaxlib", jaxlib.__version__)'
check 120 python3 -c 'import jax; print(jax.devices())'
check 120 python3 -c '
import jax, sys
backend = jax.default_backend()
print("default backend:", backend)
sys.exit(0 if backend == "gpu" else 1)' || [[ -n $GPU_BENCH_ALLOW_CPU ]] || { log "no GPU backend: stopping"; exit 1; }
check 120 python3 -c '
from importlib.metadata import version
import envpool, gymnax, hydra, omegaconf, tensorboardX
import jaxrl_dist, jaxrl_dist.trainers.fused, jaxrl_dist.envs
print(*(f"{p} {version(p)}" for p in ("envpool", "gymnax", "gymnasium", "hydra-core", "omegaconf",
                                       "tensorboardX", "flax", "optax", "numpy")), sep=", ")
print("jaxrl_dist from", jaxrl_dist.__file__)
print("envpool envs:", len(envpool.list_all_envs()), "incl. Pong-v5:", "Pong-v5" in envpool.list_all_envs())'
check 10 git log -1 --format='commit %h %s'
check 10 git status --short -- jaxrl_dist bench

log "=== benchmarks (deadline ${BUDGET}s from start, now at $((SECONDS - START))s)"
# the key figure: envpool Pong-v5 rollouts (policy + env in one jitted scan) against
# envpool's own numpy API, same pool settings (8 envs, envpool's thread count)
step pong 150 45 --only Pong-v5 --modes numpy,raw,rollout
# CartPole: 64 and 1024 envs (raw, rollout, PPO training), then 4 envs, whose 65,536
# sequential steps per call are bound by per-step launch latency, training timed once
step cartpole-64-1024 150 45 --only CartPole-v1 --num-envs 64,1024 --min-run-s 1
step cartpole-4 100 40 --only CartPole-v1 --num-envs 4 --modes raw,rollout --min-run-s 1
step cartpole-train-4 120 50 --only CartPole-v1 --num-envs 4 --modes train --runs 1 --skip-seeds
# with time left: Pong PPO (one update) and seed scaling (16 and 64 seeds of 500k steps;
# 1 seed is the row above)
step pong-train 90 60 --only Pong-v5 --modes train --runs 1
step seeds 200 150 --only seeds --runs 1

log "=== results ($((SECONDS - START))s so far)"
if [[ -f $JSON ]]; then
  timeout -k 5 60 python3 bench/fused.py --render "$JSON" > "$OUT/fused_gpu.md" 2>>"$LOG"
  tee -a "$LOG" < "$OUT/fused_gpu.md"
else
  log "no results written"
fi
log "=== done in $((SECONDS - START))s"
