"""`hydra/launcher=vmap` against the basic launcher and the fused trainer, on the CLI.

Every side is a whole `jaxrl-dist train` command (its process start, Hydra, compiles,
training, every job's run dir and checkpoints), timed from launch to exit, each with a
fresh `XDG_CACHE_HOME` (no compile cache from an earlier side), one side after another.

- `--same`: for each traced key, a sweep of its default and another value (10 updates
  each) with `hydra/launcher=vmap` and with `hydra/launcher=basic`: the largest absolute
  difference of each job's params between the two. On a 2-core host each member of such
  a group has a CPU device to itself; `four_members` sweeps 4 learning rates (two
  members a device: a batched program) after 10 and after 40 updates.
- `--speed`: 16 `algo.lr` values x 4 seeds (64 jobs; CartPole, 4 envs x 128 steps, 4
  epochs x 4 minibatches, 5e5 steps each) with the vmap launcher; `trainer=fused
  num_seeds=64` with the same config; the basic launcher on 8 of the jobs, extrapolated
  to 64 as its first job plus 63 times the median of the others (job starts from each
  job log's first line).
- `--optuna`: an Optuna sweep of 32 trials in batches of 16 (`hydra.sweeper.n_jobs=16`)
  at 1e5 steps each, with the vmap and with the basic launcher.
- `--memory`: a config whose trajectory buffer is over 50 MB a member; 8 jobs with
  `max_members=2` (4 programs one after another), 2 of the jobs alone (one chunk), and
  the 8 unchunked: the launching process's peak RSS of each.

`--repeats N` runs `--speed` and `--optuna` N times, their sides interleaved, and takes medians.

    python bench/vmap_sweep.py [--same] [--speed] [--optuna] [--memory] [--repeats N] [--out bench/results/vmap_sweep.json]
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from common import machine_info, write_json  # noqa: E402

CLI = [sys.executable, "-m", "jaxrl_dist", "train"]
SPEED = ["trainer=fused", "env=cartpole", "env.num_envs=4", "algo.num_steps=128", "algo.update_epochs=4",
         "algo.num_minibatches=4", "algo.minibatch_size=null", "algo.total_timesteps=500000",
         "run.progress=false"]
LRS = ",".join(f"{x:.3g}" for x in [1e-4 * (100 ** (i / 15)) for i in range(16)])  # 1e-4 .. 1e-2
TRACED = {"lr": 3e-3, "max_grad_norm": 0.1, "ent_coef": 0.0, "vf_coef": 1.0, "clip_eps": 0.1, "gamma": 0.9,
          "gae_lambda": 0.8}


def cli(args: list, cwd: Path, env_extra: dict = None) -> tuple:
    """`(seconds, completed process)` of one command with a fresh compile cache."""
    cache = tempfile.mkdtemp(prefix="xdg-", dir=cwd)
    env = dict(os.environ, XDG_CACHE_HOME=cache, **(env_extra or {}))
    t0 = time.perf_counter()
    out = subprocess.run(CLI + args, cwd=cwd, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if out.returncode != 0:
        sys.exit(f"{' '.join(args)}: exit {out.returncode}\n{out.stderr[-3000:]}")
    return seconds, out


def job_dirs(sweep: Path) -> list:
    return sorted((p for p in sweep.iterdir() if p.name.isdigit()), key=lambda p: int(p.name))


def params(run: Path):
    import jax
    import numpy as np

    from jaxrl_dist.evaluation import latest_state

    return [np.asarray(x) for x in jax.tree.leaves(latest_state(run)[1].train.params)]


def same(work: Path) -> dict:
    """Each job's params after 10 updates, vmap against basic: for each traced key a
    sweep of its default and another value (two jobs, one program under vmap)."""
    from jaxrl_dist.config import AlgoConfig

    rows = {}
    for key, value in TRACED.items():
        rows.update(_vmap_against_basic(work, key, f"{getattr(AlgoConfig(), key)},{value}", 10))
    four = {f"{n}_updates": _vmap_against_basic(work, "lr", "1e-4,3e-4,1e-3,3e-3", n) for n in (10, 40)}
    return {"largest_abs_difference": rows, "max": max(rows.values()), "target": 1e-5,
            "four_members": {**four, "max_after_10": max(four["10_updates"].values())}}


def _vmap_against_basic(work: Path, key: str, values: str, updates: int) -> dict:
    """`{override: largest params difference}` of each job of the sweep `algo.KEY=VALUES`
    (`updates` updates each), `hydra/launcher=vmap` against `hydra/launcher=basic`."""
    base = ["-m", "trainer=fused", "env.num_envs=4", "algo.num_steps=32", "algo.minibatch_size=null",
            "algo.num_minibatches=2", "algo.update_epochs=2", f"algo.total_timesteps={4 * 32 * updates}",
            "run.progress=false", "run.tensorboard=false", f"algo.{key}={values}"]
    dirs = {}
    for launcher in ("vmap", "basic"):
        dirs[launcher] = work / f"{key}_{values.count(',') + 1}_{updates}_{launcher}"
        cli([*base, f"hydra/launcher={launcher}", f"run.dir={dirs[launcher]}"], work)
    rows = {}
    for a, b in zip(job_dirs(dirs["vmap"]), job_dirs(dirs["basic"])):
        given = next(o for o in _overrides(a) if o.startswith(f"algo.{key}="))
        rows[given] = max(float(abs(x - y).max()) for x, y in zip(params(a), params(b)))
    return rows


def _overrides(run: Path) -> list:
    import yaml

    return yaml.safe_load((run / ".hydra" / "overrides.yaml").read_text())


def _job_starts(sweep: Path) -> list:
    """Each job's first log time, as seconds since the epoch."""
    starts = []
    for run in job_dirs(sweep):
        stamp = re.search(r"^\[([\d-]+ [\d:,]+)\]", (run / "train.log").read_text(), re.M).group(1)
        starts.append(datetime.datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp())
    return starts


def _times(run: Path) -> dict:
    """The summary's clock: compile, training, checkpoint waits, the trainer's wall."""
    s = json.loads((run / "summary.json").read_text())
    return {k: s[k] for k in ("compile_seconds", "train_seconds", "checkpoint_seconds", "wall_seconds", "sps")}


def speed(work: Path, repeats: int = 1) -> dict:
    """`_speed_once` `repeats` times (the three sides interleaved); the ratios of the
    medians, each run's figures under `runs`."""
    runs = []
    for i in range(repeats):
        (work / str(i)).mkdir()
        runs.append(_speed_once(work / str(i)))
    out = _with_ratios({k: statistics.median(r[k] for r in runs)
                        for k in ("vmap_64_jobs_s", "fused_64_seeds_s", "basic_64_jobs_extrapolated_s")})
    return {**out, "repeats": repeats, "runs": runs}


def _with_ratios(out: dict) -> dict:
    """`out` (the three sides' seconds) with vmap over fused and basic over vmap."""
    out["vmap_over_fused"] = out["vmap_64_jobs_s"] / out["fused_64_seeds_s"]
    out["basic_over_vmap"] = out["basic_64_jobs_extrapolated_s"] / out["vmap_64_jobs_s"]
    return out


def _speed_once(work: Path) -> dict:
    out = {}
    t, _ = cli(["-m", *SPEED, "hydra/launcher=vmap", f"algo.lr={LRS}", "seed=0,1,2,3",
                f"run.dir={work / 'speed_vmap'}"], work)
    out["vmap_64_jobs_s"] = t
    out["vmap_group"] = _times(work / "speed_vmap" / "0")
    t, _ = cli([*SPEED, "num_seeds=64", f"run.dir={work / 'speed_fused'}"], work)
    out["fused_64_seeds_s"] = t
    out["fused"] = _times(work / "speed_fused")
    eight = ",".join(LRS.split(",")[:2])
    t0 = time.time()
    t, _ = cli(["-m", *SPEED, "hydra/launcher=basic", f"algo.lr={eight}", "seed=0,1,2,3",
                f"run.dir={work / 'speed_basic'}"], work)
    end = t0 + t
    starts = _job_starts(work / "speed_basic")
    jobs = [b - a for a, b in zip([t0, *starts[1:]], [*starts[1:], end])]
    out.update(basic_8_jobs_s=t, basic_job_s=jobs, basic_64_jobs_extrapolated_s=jobs[0] + 63 * statistics.median(jobs[1:]))
    return _with_ratios(out)


def optuna(work: Path, repeats: int = 1) -> dict:
    """The Optuna sweep with each launcher, `repeats` times interleaved; medians."""
    args = ["-m", *SPEED, "algo.total_timesteps=100000", "hydra/sweeper=optuna", "hydra.sweeper.n_trials=32",
            "hydra.sweeper.n_jobs=16", "algo.lr=tag(log,interval(1e-4,1e-2))"]
    runs = {"vmap_s": [], "basic_s": []}
    for i in range(repeats):
        for launcher in ("vmap", "basic"):
            t, _ = cli([*args, f"hydra/launcher={launcher}", f"run.dir={work / f'optuna_{launcher}_{i}'}"], work)
            runs[f"{launcher}_s"].append(t)
    out = {k: statistics.median(v) for k, v in runs.items()}
    out["basic_over_vmap"] = out["basic_s"] / out["vmap_s"]
    return {**out, "repeats": repeats, "runs": runs}


def memory(work: Path) -> dict:
    """Peak RSS (the summaries' `peak_rss_mb`, the launching process's) of 8 jobs in chunks of
    2 members, of one chunk alone, and of the 8 unchunked."""
    big = ["trainer=fused", "env.num_envs=512", "algo.num_steps=2048", "algo.update_epochs=1",
           "algo.num_minibatches=4", "algo.minibatch_size=null", "algo.total_timesteps=1048576",
           "run.progress=false", "run.tensorboard=false", "hydra/launcher=vmap"]
    sides = {"chunked_8_by_2": ("seed=0,1,2,3,4,5,6,7", 2), "one_chunk_2": ("seed=0,1", 2),
             "unchunked_8": ("seed=0,1,2,3,4,5,6,7", 1024)}
    out = {"trajectory_mb_per_member": 512 * 2048 * 56 / 1e6}
    for name, (seeds, most) in sides.items():
        t, _ = cli(["-m", *big, seeds, f"hydra.launcher.max_members={most}", f"run.dir={work / name}"], work)
        rss = max(json.loads((r / "summary.json").read_text())["peak_rss_mb"] for r in job_dirs(work / name))
        out[name] = {"peak_rss_mb": rss, "seconds": t}
    one = out["one_chunk_2"]["peak_rss_mb"]
    out["chunked_over_one_chunk"] = out["chunked_8_by_2"]["peak_rss_mb"] / one
    out["unchunked_over_one_chunk"] = out["unchunked_8"]["peak_rss_mb"] / one
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for name in ("same", "speed", "optuna", "memory"):
        p.add_argument(f"--{name}", action="store_true")
    p.add_argument("--repeats", type=int, default=1, help="runs of --speed and --optuna (interleaved; medians)")
    p.add_argument("--out", default=str(HERE / "results" / "vmap_sweep.json"))
    args = p.parse_args()
    chosen = [n for n in ("same", "speed", "optuna", "memory") if getattr(args, n)] or ["same", "speed", "optuna", "memory"]
    result = {"machine": machine_info(), "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE,
                                                                  capture_output=True, text=True).stdout.strip()}
    with tempfile.TemporaryDirectory(prefix="vmap-bench-") as tmp:
        for name in chosen:
            work = Path(tmp) / name
            work.mkdir()
            extra = {"repeats": args.repeats} if name in ("speed", "optuna") else {}
            result[name] = globals()[name](work, **extra)
            print(json.dumps({name: result[name]}, indent=2, default=float), flush=True)
    write_json(args.out, result)


if __name__ == "__main__":
    main()
