"""Fine-tuning a learned scheduler on another task against training it from scratch.

The scratch scheduler trains `--updates` PPO updates on the task's scheduling
MDP; its greedy policy's score is its mean episode return on `--eval-episodes`
fixed inner runs (`scheduler_mdp.play`, the same keys for every policy). The
fine-tuned one starts from another task's scheduler (`--init-from`, default
the shipped generalist): each of `--stages` is its own training of k updates
from that file, timed as scratch is (one call, its compile included, as a user
who fine-tunes instead of training pays it). The result is the first stage
whose score reaches the scratch score, as a fraction of the scratch training's
updates and wall seconds (also without each call's first update, which holds
its compile). Stage 0 is the file unchanged (zero-shot, on this task's scale).

Catch-bsuite with CartPole's PPO settings (4 envs, a 64x64 MLP) is a task
outside the generalist's set whose inner runs cost about what CartPole's do
(the `auto_grid` defaults, 64 envs and a 256x256 MLP, cost ~50x more):

    python bench/scheduler_finetune.py env=cartpole env.id=Catch-bsuite run.target_return=0.8 \
        scheduler.min_return=-1 scheduler.max_return=1 scheduler.max_shards=16 --updates 40 --stages 0,2,4

Writes `bench/results/scheduler_finetune.json`.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine_info, write_json  # noqa: E402
from scheduler_mdp import greedy, play  # noqa: E402

from jaxrl_dist import scheduler_training  # noqa: E402
from jaxrl_dist.cli.compose import load_config  # noqa: E402
from jaxrl_dist.scheduling import learned, mdp  # noqa: E402
from jaxrl_dist.platform import configure_cpu  # noqa: E402


def make_env(overrides: list, opts, episodes: int, init) -> mdp.SchedulingEnv:
    """The task's MDP with the features `init` reads (scratch training sees the same)."""
    cfg, sched = scheduler_training.task_and_options(load_config(overrides + ["backend=local"]), opts.max_rounds, opts.time_weight, 10.0)
    return mdp.SchedulingEnv(cfg, cfg.cost, sched._replace(features=scheduler_training.features_for(None, init)),
                             episodes)


def timed_training(env, updates: int, seed: int, recipe, init=None) -> tuple:
    """`(trained, wall seconds, seconds after the first update)`: the first holds the compile."""
    t0, ends = time.perf_counter(), []
    trained = scheduler_training.train_scheduler(env, 16, updates, seed, init, recipe=recipe,
                                                 log=lambda s: ends.append(time.perf_counter()))
    wall = time.perf_counter() - t0
    return trained, wall, wall - (ends[0] - t0)


def score(trained, env, seed: int) -> dict:
    """The greedy policy's MDP returns on `env`'s episodes from `seed`'s keys."""
    return play(env, greedy(trained, env), seed)


def one_seed(seed: int, env, evaluation, opts, recipe, init) -> dict:
    """Scratch training from `seed`, then each stage's fine-tuning from `init` (seed
    `seed + 1`), each scored on the same evaluation episodes."""
    scratch, scratch_s, scratch_rest = timed_training(env, opts.updates, seed, recipe)
    target = score(scratch, evaluation, opts.eval_seed)
    print(f"seed {seed} scratch: {opts.updates} updates in {scratch_s:.0f} s, score {target['return_mean']:.2f} "
          f"(reached {target['reached']:.2f}, mean n {target['mean_n']:.1f})", flush=True)
    stages = []
    for k in (int(x) for x in opts.stages.split(",")):
        tuned, secs, rest = timed_training(env, k, seed + 1, recipe, init) if k else (init, 0.0, 0.0)
        s = score(tuned, evaluation, opts.eval_seed)
        stages.append({"updates": k, "train_s": secs, "after_first_s": rest, **s})
        print(f"seed {seed} fine-tuned {k} updates ({secs:.0f} s): score {s['return_mean']:.2f} "
              f"(reached {s['reached']:.2f}, mean n {s['mean_n']:.1f})", flush=True)
    hit = next((st for st in stages if st["return_mean"] >= target["return_mean"]), None)
    return {"seed": seed, "load_average": os.getloadavg(),
            "scratch": {"updates": opts.updates, "train_s": scratch_s, "after_first_s": scratch_rest, **target},
            "stages": stages,
            "reached_scratch_at": hit and {"updates": hit["updates"],
                                           "update_fraction": hit["updates"] / opts.updates,
                                           "wall_fraction": hit["train_s"] / scratch_s,
                                           "after_first_fraction": hit["after_first_s"] / scratch_rest}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("overrides", nargs="*", help="the task's config overrides (env=..., scheduler.max_shards=...)")
    p.add_argument("--init-from", default=str(learned.preset_path(learned.DEFAULT)),
                   help="the scheduler to fine-tune (default: the shipped generalist)")
    p.add_argument("--epochs", type=int, default=10, help="the scheduler's PPO epochs (both trainings)")
    p.add_argument("--lr", type=float, default=1e-3, help="the scheduler's learning rate (both trainings)")
    p.add_argument("--updates", type=int, default=40, help="scratch training's PPO updates")
    p.add_argument("--stages", default="0,2,4", help="fine-tuning updates after which to score")
    p.add_argument("--seeds", default="0", help="training seeds, comma-separated (one scratch run each)")
    p.add_argument("--episodes", type=int, default=8)
    p.add_argument("--max-rounds", type=int, default=60)
    p.add_argument("--time-weight", type=float, default=0.6)
    p.add_argument("--eval-episodes", type=int, default=16)
    p.add_argument("--eval-seed", type=int, default=123)
    p.add_argument("--out", default=str(Path(__file__).parent / "results" / "scheduler_finetune.json"))
    opts = p.parse_args()
    configure_cpu()
    init = learned.load(opts.init_from)
    env = make_env(opts.overrides, opts, opts.episodes, init)
    evaluation = make_env(opts.overrides, opts, opts.eval_episodes, init)  # one for every score
    recipe = scheduler_training.Recipe(epochs=opts.epochs, lr=opts.lr)
    seeds = [one_seed(int(x), env, evaluation, opts, recipe, init) for x in opts.seeds.split(",")]
    for r in seeds:
        print(f"seed {r['seed']}: reached the scratch score at {r['reached_scratch_at']}")
    write_json(opts.out, {"machine": machine_info(), "args": vars(opts), "seeds": seeds})


if __name__ == "__main__":
    main()
