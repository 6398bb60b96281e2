#!/usr/bin/env bash
# Fill .whl/ (git-ignored) with the wheels bench/gpu.sh installs on the GPU machine,
# which has no package index: CPython 3.12, x86-64, with jax, flax, optax, chex,
# orbax-checkpoint, numpy, msgpack, rich, pyyaml, six, matplotlib, seaborn and
# tensorboard already installed. Everything that travels must stay under 64 MiB,
# so envpool and envpool-assets are trimmed to the families the benchmarks use
# (Atari, MuJoCo gym, classic control): the other families' binaries are left out
# and envpool/entry.py no longer imports their registrations (each registration
# imports its family's binary). Versions match the CPU venv.
#
#     bash bench/gpu_wheels.sh        # from the repo root, on a machine with PyPI access
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo /.whl/ >> .git/info/exclude
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
  omegaconf==2.3.1 tensorboardX==2.6.5
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
