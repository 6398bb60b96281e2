"""A trained scheduler against fixed shard counts on its own scheduling MDP (modeled clock).

Runs `--episodes` inner training runs of the task side by side for each policy
(the scheduler's greedy choice, then fixed n = 1, 2, 4, ..., max) from the same
keys, and prints each policy's mean episode return (the MDP's reward: modeled
time and dollars per round, plus the bonus for reaching the target), how often
the target was reached, rounds per episode and the mean n. This is the
modeled clock only; `bench/RESULTS.md` says which real-run comparisons exist.

    python bench/scheduler_mdp.py jaxrl_dist/presets/schedulers/CartPole-v1.msgpack
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine_info, write_json  # noqa: E402  (configures the CPU first)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from jaxrl_dist import scheduler_training  # noqa: E402
from jaxrl_dist.cli.compose import load_config  # noqa: E402
from jaxrl_dist.scheduling import learned, mdp, profile  # noqa: E402
from jaxrl_dist.core.networks import make_network  # noqa: E402


def make_env(trained: learned.Trained, overrides: list, episodes: int, limits: bool,
             task: str | None = None, budget: float | None = None) -> mdp.SchedulingEnv:
    """The MDP the scheduler was trained on for `task` (default: its first task), or,
    for a task outside its set, that task's MDP (`overrides` give its config) on the
    scale a live run would use; `limits`: its episodes draw budgets and deadlines as
    `SchedOptions`' defaults do (else none, the MDP before limits)."""
    m = trained.meta
    env_id = task or m["env_id"]
    entry = learned.task_entry(trained, env_id)
    base = [f"env.id={env_id}", f"scheduler.max_shards={m['max_shards']}", "backend=local"]
    full = load_config(base + ([f"run.target_return={entry['target_return']}"] if entry else []) + overrides)
    cfg, opts = scheduler_training.task_and_options(
        full, (entry or m)["max_rounds"], m["time_weight"], m["target_bonus"],
        profile.Profile(**entry["profile"]) if entry else None, learned.scale_for(trained, full))
    if not limits:
        opts = opts._replace(budgets=(0.0, 0.0), deadlines=(0.0, 0.0))
    if budget is not None:  # every episode the same budget, no deadline
        opts = opts._replace(budgets=(budget, budget), deadlines=(0.0, 0.0), no_limit=0.0,
                             limit_reward="progress")
    opts = opts._replace(features=mdp.FEATURES)  # every feature: each policy picks its own (`greedy`)
    return mdp.SchedulingEnv(cfg, cfg.cost, opts, episodes)


def play(env, choose, seed: int) -> dict:
    """Every episode once from `seed`'s keys; the returns of their first runs."""
    E = env.num_envs
    step = jax.jit(env.step)
    state, obs = env.reset(jax.random.key(seed))
    total, rounds, ended, reached, ns = np.zeros(E), np.zeros(E), np.zeros(E, bool), np.zeros(E, bool), []
    limited, ret_col = np.zeros(E, bool), env.opts.features.index("return")
    for t in range(env.opts.max_rounds):
        action = choose(obs)
        ns.append(np.asarray(action)[~ended] + 1)
        state, out = step(state, action, jax.random.fold_in(jax.random.key(seed), t))
        live = ~ended
        total += np.where(live, np.asarray(out.reward), 0.0)
        rounds += live
        # an episode also ends, terminated, before a round past its limit: reached only at the target
        at_target = np.asarray(out.final_obs[:, ret_col]) >= target_feature(env) - 1e-6
        reached |= live & np.asarray(out.terminated) & at_target
        limited |= live & np.asarray(out.terminated) & ~at_target
        ended |= np.asarray(out.terminated | out.truncated)
        obs = out.obs
        if ended.all():
            break
    return {"return_mean": float(total.mean()), "return_std": float(total.std()),
            "reached": float(reached.mean()), "limited": float(limited.mean()), "rounds": float(rounds.mean()),
            "mean_n": float(np.concatenate(ns).mean())}


def target_feature(env: mdp.SchedulingEnv) -> float:
    """The `return` feature's value at the target return."""
    s = env.opts.scale
    return (env.opts.target_return - s.return_lo) / max(s.return_hi - s.return_lo, 1e-6)


def greedy(trained: learned.Trained, env: mdp.SchedulingEnv):
    """`choose(obs[E, F]) -> actions[E]`: the trained policy's argmax over its own features
    (found by name among those `env` gives)."""
    cols = jnp.asarray(mdp.feature_columns(trained.meta["features"], env.opts.features))
    spec = env.spec._replace(obs_shape=(len(cols),))
    net = make_network(spec, "mlp", tuple(trained.meta["hidden_sizes"]), trained.meta["activation"])
    params = jax.tree.map(jnp.asarray, trained.params)
    return jax.jit(lambda o: jnp.argmax(net.apply(params, o[:, cols]).logits, -1))


def plan(spec: str, env: mdp.SchedulingEnv):
    """`choose` for a hand-written schedule: "4x5,2" runs 4 shards for 5 rounds, then 2
    (the last entry repeats); the round comes from the `round_frac` feature."""
    ns = []
    for part in spec.split(","):
        n, _, times = part.partition("x")
        ns += [int(n)] * int(times or 1)
    ns, col, R = jnp.asarray(ns), env.opts.features.index("round_frac"), env.opts.scale.max_rounds
    return lambda o: ns[jnp.minimum(jnp.round(o[:, col] * R).astype(jnp.int32), len(ns) - 1)] - 1


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("scheduler", help="a trained scheduler file")
    p.add_argument("overrides", nargs="*", help="the task's config overrides it was trained with")
    p.add_argument("--task", help="the env id to play (default: the scheduler's first task); one "
                   "outside its set plays zero-shot, on that task's config from the overrides")
    p.add_argument("--episodes", type=int, default=16)
    p.add_argument("--seed", type=int, default=123)
    p.add_argument("--learned-only", action="store_true",
                   help="only the scheduler (the fixed rows depend on the MDP and --seed alone)")
    p.add_argument("--limits", action="store_true",
                   help="episodes draw budgets and deadlines (default: none, the MDP before limits)")
    p.add_argument("--budget", type=float, metavar="X",
                   help="every episode has a budget of X x max_rounds reference rounds, no deadline, and "
                        "earns its progress at the cut (--limit-reward progress)")
    p.add_argument("--plan", action="append", default=[], metavar="SPEC",
                   help="a hand-written schedule to play too: N or NxK entries, comma-separated, the last "
                        "repeating (4x5,2: 4 shards for 5 rounds, then 2)")
    p.add_argument("--out", default=str(Path(__file__).parent / "results" / "scheduler_mdp.json"))
    opts = p.parse_args()
    trained = learned.load(opts.scheduler)
    env = make_env(trained, opts.overrides, opts.episodes, opts.limits, opts.task, opts.budget)
    M = env.opts.max_shards
    policies = {"learned": greedy(trained, env)}
    for n in sorted({1, 2, max(1, M // 2), M}) if not opts.learned_only else ():
        policies[f"fixed {n}"] = lambda o, n=n: jnp.full((env.num_envs,), n - 1)
    policies.update({f"plan {spec}": plan(spec, env) for spec in opts.plan})
    rows = {}
    for name, choose in policies.items():
        rows[name] = play(env, choose, opts.seed)
        r = rows[name]
        print(f"{name:14s} return {r['return_mean']:8.2f} +- {r['return_std']:.2f}  reached "
              f"{r['reached']:.2f}  limited {r['limited']:.2f}  rounds {r['rounds']:.1f}  mean n {r['mean_n']:.2f}", flush=True)
    write_json(opts.out, {"meta": machine_info(), "scheduler": opts.scheduler, "task": env.task_cfg.env.id,
                          "trained": trained.meta, "episodes": opts.episodes, "limits": opts.limits,
                          "budget": opts.budget,
                          "rows": rows})


if __name__ == "__main__":
    main()
