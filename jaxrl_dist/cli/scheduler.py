"""`jaxrl-dist scheduler train`: PPO on the scheduling MDP, each episode a whole training run."""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Sequence

from jaxrl_dist import scheduler_training
from jaxrl_dist.cli.compose import load_config, parse_args
from jaxrl_dist.config import ConfigError
from jaxrl_dist.platform import use_unrolled_threefry
from jaxrl_dist.scheduling import learned, mdp, profile
from jaxrl_dist.trainers.rundir import writable_file


def _span(text: str) -> tuple:
    """`LO,HI` (0 <= LO <= HI) as a float pair, for argparse."""
    try:
        lo, hi = (float(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected LO,HI (two numbers), got {text!r}") from None
    if not 0 <= lo <= hi:
        raise argparse.ArgumentTypeError(f"expected 0 <= LO <= HI, got {text!r}")
    return lo, hi


def _above(low: float, kind=int, closed: bool = False, high: float = float("inf")):
    """An argparse type: a `kind` greater than `low` (at least `low` where `closed`), at most `high`."""

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {'an integer' if kind is int else 'a number'}, "
                                             f"got {text!r}") from None
        if value < low or (value == low and not closed) or value > high:
            bound = f"{'>=' if closed else '>'} {low}" + (f" and <= {high}" if high < float("inf") else "")
            raise argparse.ArgumentTypeError(f"expected {bound}, got {text!r}")
        return value

    return parse


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="jaxrl-dist scheduler")
    train = parser.add_subparsers(dest="action", metavar="ACTION", required=True).add_parser(
        "train", help="train (or fine-tune) a scheduler on the modeled clock", description="PPO on the "
        "scheduling MDP: each episode is a whole training run of the task (env=..., backend.envs_per_shard, "
        "algo.*), each step a round; the cost model (cost=...) prices it. Writes a msgpack file.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add = train.add_argument
    add("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides")
    add("--out", required=True, help="the scheduler file to write")
    add("--init-from", help="a scheduler file to fine-tune from (or scheduler.init_from=PATH)")
    add("--updates", type=_above(0), default=60, help="PPO updates of the scheduler")
    add("--episodes", type=_above(0), default=8, help="training runs side by side (one batch)")
    add("--rollout", type=_above(0), default=16, help="rounds per scheduler update")
    add("--max-rounds", type=_above(0), default=60, help="rounds before an episode is cut")
    add("--time-weight", type=_above(0.0, float, closed=True, high=1.0), default=0.5, help="reward weight of modeled time against dollars (0..1)")
    add("--target-bonus", type=_above(0.0, float, closed=True), default=10.0, help="reward for reaching "
        "run.target_return (under a limit: its share of the return range reached at the cut)")
    add("--budgets", type=_span, metavar="LO,HI", help="the budgets episodes draw, uniformly, in units of "
        "--max-rounds rounds at max_shards (default 0.05,0.5); each is none half the time")
    add("--deadlines", type=_span, metavar="LO,HI", help="the same for the deadlines (default 0.1,0.6)")
    add("--limit-reward", choices=("cost", "progress"), default="cost", help="episodes under a budget or "
        "deadline: priced per round as the others (cost), or rewarded only for the progress they end with")
    add("--features", metavar="base|all|A,B", help="what the scheduler sees: base (the default), all (base plus "
        "budget_rounds and time_rounds: what is left of a limit in rounds at the most shards), or names")
    add("--seed", type=_above(0, closed=True), default=0)
    add("--task", action="append", default=[], metavar="'KEY=VALUE ...'", help="one task of a scheduler "
        "trained over several (repeat it): its own overrides, after the common ones")
    add("--epochs", type=_above(0), default=4, help="the scheduler's PPO epochs per update")
    add("--lr", type=_above(0.0, float), default=3e-4, help="the scheduler's learning rate")
    add("--profile", metavar="PATH", help="latency profile (jaxrl-dist calibrate); default: the one shipped for "
        "env.id, else profile.Profile()'s defaults")
    return parser


def _task(args, extra: list) -> tuple:
    """`(task config, SchedOptions)` of one task: the common overrides, then its own."""
    cfg = load_config(list(args.overrides) + extra + ["backend=local"])
    limits = {k: v for k in ("budgets", "deadlines", "limit_reward") if (v := getattr(args, k)) is not None}
    try:
        cfg, opts = scheduler_training.task_and_options(cfg, args.max_rounds, args.time_weight,
                                                        args.target_bonus, args.profile, limits=limits)
    except ConfigError as err:  # a bad profile file
        raise ConfigError(("--profile: " if args.profile else "") + str(err)) from None
    print(f"{cfg.env.id}: profile {profile.profile_file(cfg.env.id, args.profile) or 'Profile() defaults'}")
    return cfg, opts


def main(argv: Sequence[str]) -> int:
    args = parse_args(_parser(), argv)
    writable_file(args.out, "--out")
    tasks = [_task(args, t.split()) for t in args.task or [""]]
    init_from = args.init_from or tasks[0][0].scheduler.init_from
    if init_from and not Path(init_from).is_file():
        raise ConfigError(f"scheduler.init_from: no such file {init_from}")
    try:
        init = learned.load(init_from) if init_from else None
    except ConfigError as err:
        raise ConfigError(f"scheduler.init_from: {err}") from None
    seen = scheduler_training.features_for(args.features, init)
    use_unrolled_threefry()
    envs = [mdp.SchedulingEnv(cfg, cfg.cost, opts._replace(features=seen), args.episodes) for cfg, opts in tasks]
    recipe = scheduler_training.Recipe(epochs=args.epochs, lr=args.lr)
    trained = scheduler_training.train_scheduler(envs, args.rollout, args.updates, args.seed, init, recipe=recipe)
    print(f"wrote {learned.save(trained, args.out)}")
    return 0
