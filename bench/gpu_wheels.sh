#!/usr/bin/env bash
# Fill .whl/ (git-ignored) with the wheels bench/gpu.sh installs on the GPU machine
# for `jaxrl-dist bench`; the machine has no package index: CPython 3.12, x86-64, with
# jax, flax, optax, chex, orbax-checkpoint, numpy, scipy, pillow, etils, absl-py, msgpack,
# rich, pyyaml, six, matplotlib, seaborn and tensorboard already installed. Everything
# that travels (the working tree too) must stay under 64 MiB, so envpool and
# envpool-assets are trimmed to the families the benchmarks use (Atari, MuJoCo gym,
# classic control): the other families' binaries are left out and envpool/entry.py no
# longer imports their registrations (each registration imports its family's binary);
# mujoco-mjx leaves out its test data. Of brax's declared requirements, only those that
# `brax.envs` imports travel (flask, flask-cors, ml-collections, pyopengl and
# mujoco-studio are never imported by it). Versions match the CPU venv. The script
# prints the total, which bench/RESULTS.md records.
#
#     bash bench/gpu_wheels.sh        # from the repo root, on a machine with PyPI access
set -euo pipefail
cd "$(dirname "$0")/.."
exclude=$(git rev-parse --git-path info/exclude)  # a linked worktree's too
mkdir -p "$(dirname "$exclude")"
grep -qx '/.whl/' "$exclude" 2>/dev/null || echo /.whl/ >> "$exclude"
rm -rf .whl && mkdir -p .whl
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

download() {  # dest, then NAME==VERSION...
  local dest=$1; shift
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux1_x86_64 -d "$dest" "$@"
}

# envpool 1.2.5 requires dm-env, gymnasium, optree, types-protobuf (stubs only), glfw
# (only for rendering: left out), pillow/matplotlib/packaging/typing-extensions (on the
# machine) and the asset packages (trimmed below; the large MuJoCo ones left out).
# dm-env's dm-tree is only imported by dm_env.test_utils: left out.
download .whl dm-env==1.6 gymnasium==1.3.0 farama-notifications==0.0.6 cloudpickle==3.1.3 \
  optree==0.20.0 types-protobuf==7.35.1.20260906 gymnax==1.0.1 hydra-core==1.3.8 \
  omegaconf==2.3.1 tensorboardX==2.6.5 tenacity==9.2.1
# env=brax_hopper: brax and what `brax.envs` imports that the machine lacks
download .whl brax==0.14.2 mujoco==4.0.0 mujoco-core==4.0.0 jaxopt==0.8.5 trimesh==5.2.0 glfw==2.11.0
download "$tmp" mujoco-mjx==3.17.0
python3 bench/trim_wheel.py "$tmp"/mujoco_mjx-3.17.0-*.whl .whl \
  --drop 'mujoco/mjx/test_data/*' --drop 'mujoco/mjx/integration_test/*'
# antlr4-python3-runtime 4.9.3 (hydra/omegaconf pin 4.9.*) exists only as an sdist
python3 -m pip wheel -q --no-deps antlr4-python3-runtime==4.9.3 -w .whl

download "$tmp" envpool==1.2.5 envpool-assets==0.3.0
python3 bench/trim_wheel.py "$tmp"/envpool-1.2.5-*.whl .whl \
  --drop 'envpool/*.so' --drop 'envpool/vizdoom/bin/*' --drop 'envpool/jumanji/assets/*' \
  --keep 'envpool/atari/*.so' --keep 'envpool/mujoco/mujoco_gym_envpool.so' \
  --keep 'envpool/classic_control/*.so' \
  --sub envpool/entry.py '^import envpool\.(?!atari\.|classic_control\.|mujoco\.gym\.).*\n' ''
python3 bench/trim_wheel.py "$tmp"/envpool_assets-0.3.0-*.whl .whl \
  --drop 'envpool_assets/*' --keep 'envpool_assets/__init__.py' \
  --keep 'envpool_assets/atari/*' --keep 'envpool_assets/mujoco/assets_gym/*'
ls -l .whl
du -sh .whl
echo "carried in all (the working tree's tracked and untracked files, and .whl):"
{ git ls-files -co --exclude-standard -z | du -cb --files0-from=- | tail -1; du -sb .whl; } \
  | awk '{s += $1} END {printf "%.1f MiB of 64\n", s / 2^20}'
