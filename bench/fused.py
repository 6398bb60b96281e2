"""Throughput of the fused single-process path, in env steps per second.

For each env it measures (a) raw env stepping with random actions in one
jitted `lax.scan`, (b) rollouts only (policy + env, `make_rollout`) and (c)
full PPO training (`make_train_chunk`, the whole training in one call); for
envpool also envpool's own numpy API (`pool.step` in a Python loop). Then
seed scaling of CartPole training with `num_seeds`. Compile time is reported
apart from run time; run times are medians of several runs after a warm-up.

    python bench/fused.py [--quick] [--out bench/out/fused.json] [--markdown FILE] [--resume]
        [--only Pong-v5,seeds] [--modes numpy,raw,rollout] [--num-envs 4,1024]
    python bench/fused.py --render bench/results/fused.json   # markdown from a JSON

Runs unchanged on CPU, GPU or TPU (envpool steps on the host either way).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from pathlib import Path
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import fmt, machine_info, markdown_table, measure, print_table, write_json  # noqa: E402

from jaxrl_dist.trainers import fused  # noqa: E402
from jaxrl_dist.config import AlgoConfig, Config, EnvConfig  # noqa: E402
from jaxrl_dist.envs import make_env  # noqa: E402
from jaxrl_dist.core.rollout import make_rollout  # noqa: E402

try:  # the trainers' key implementation, so the timed code draws randomness the same way
    from jaxrl_dist.core.rng import key as make_key  # noqa: E402
except ImportError:
    make_key = jax.random.key


class Case(NamedTuple):
    """One env configuration; `train_steps` is total_timesteps per seed."""

    env_id: str
    suite: str
    num_envs: int  # per seed
    train_steps: int
    call_steps: int  # env steps per call of the raw and rollout benchmarks
    num_seeds: int = 1
    modes: tuple = ("numpy", "raw", "rollout", "train")


def cases(quick: bool) -> tuple[list[Case], list[Case]]:
    """(throughput cases, seed-scaling cases) at full or quick size."""
    if quick:
        envs = [Case("CartPole-v1", "gymnax", 4, 4_096, 16_384),
                Case("CartPole-v1", "gymnax", 1024, 131_072, 131_072, modes=("raw", "rollout")),
                Case("Pong-v5", "envpool", 8, 1_024, 256, modes=("numpy", "raw", "rollout")),
                Case("Hopper-v3", "envpool", 8, 2_048, 2_048)]
        return envs, [Case("CartPole-v1", "gymnax", 4, 4_096, 0, 4, ("train",))]
    # Pong trains for one update only: CNN gradients inside the update's scan are slow on CPU.
    envs = [Case("CartPole-v1", "gymnax", 4, 500_000, 262_144),
            Case("CartPole-v1", "gymnax", 64, 2_000_000, 2_097_152),
            Case("CartPole-v1", "gymnax", 1024, 2_097_152, 8_388_608),
            Case("Pong-v5", "envpool", 8, 1_024, 4_096),
            Case("Hopper-v3", "envpool", 8, 102_400, 32_768)]
    seeds = [Case("CartPole-v1", "gymnax", 4, 500_000, 0, s, ("train",)) for s in (1, 16, 64)]
    return envs, seeds


def make_config(case: Case, num_threads: int) -> Config:
    env = EnvConfig(id=case.env_id, suite=case.suite, num_envs=case.num_envs,
                    num_threads=num_threads)
    algo = AlgoConfig(total_timesteps=case.train_steps, num_steps=128, update_epochs=4,
                      num_minibatches=4, hidden_sizes=(64, 64), activation="tanh")
    return Config(env=env, algo=algo, num_seeds=case.num_seeds)


# --- the functions being timed: each maps state -> (state, aux) -------------------------


def _checksum(tree) -> jax.Array:
    """Sum of every leaf, so no output of the timed work can be dead-code eliminated."""
    return sum(jnp.sum(x.astype(jnp.float32)) for x in jax.tree.leaves(tree))


def _random_action(spec, num_envs: int, key):
    if spec.discrete:
        return jax.random.randint(key, (num_envs,), 0, spec.num_actions)
    return jax.random.uniform(key, (num_envs, spec.num_actions), minval=spec.action_low,
                              maxval=spec.action_high)


def raw_env_fn(env, length: int):
    """Jitted `run((env_state, key, acc))`: `length` random-action steps in one scan."""

    def env_step(carry, _):
        env_state, key, acc = carry
        key, act_key, step_key = jax.random.split(key, 3)
        action = _random_action(env.spec, env.num_envs, act_key)
        env_state, out = env.step(env_state, action, step_key)
        return (env_state, key, acc + _checksum((out.obs, out.reward, out.terminated))), None

    def run(state):
        state, _ = jax.lax.scan(env_step, state, None, length=length)
        return state, state[2]

    return jax.jit(run)


def raw_env_state(env, seed: int):
    env_state, _ = env.reset(make_key(seed))
    return env_state, make_key(seed + 1), jnp.zeros((), jnp.float32)


def rollout_fn(setup, env, rollouts: int):
    """Jitted `run((params, actor, key, acc))`: `rollouts` calls of `make_rollout`'s function."""
    rollout = make_rollout(env, setup.network, setup.rollout_opts)
    num_seeds = setup.cfg.num_seeds

    def one_rollout(carry, _):
        params, actor, key, acc = carry
        key, sub = jax.random.split(key)
        actor, traj, last_value = rollout(params, actor, jax.random.split(sub, num_seeds))
        return (params, actor, key, acc + _checksum((traj, last_value))), None

    def run(state):
        state, _ = jax.lax.scan(one_rollout, state, None, length=rollouts)
        return state, state[3]

    return jax.jit(run)


def rollout_state(setup, env, seed: int):
    runner = fused.init_runner(setup, env, seed)
    return runner.train.params, runner.actor, make_key(seed + 1), jnp.zeros((), jnp.float32)


def numpy_fn(pool, spec, length: int, seed: int = 0):
    """envpool's own API: `length` `pool.step` calls with pre-drawn random actions."""
    rng = np.random.default_rng(seed)
    n = pool.config["num_envs"]
    if spec.discrete:
        actions = rng.integers(0, spec.num_actions, (length, n), dtype=np.int32)
    else:
        actions = rng.uniform(spec.action_low, spec.action_high, (length, n, spec.num_actions))

    def run(state):
        for action in actions:
            obs, reward, *_ = pool.step(action)
        return state, float(reward.sum())

    return run


# --- running the cases -------------------------------------------------------------------


def final_return(metrics: dict, fraction: float = 0.1) -> float:
    """Mean return of the episodes completed in the last `fraction` of updates."""
    ret, count = np.asarray(metrics["episode_return_sum"]), np.asarray(metrics["episodes"])
    tail = max(1, math.ceil(ret.shape[0] * fraction))
    total = count[-tail:].sum()
    return float(ret[-tail:].sum() / total) if total else float("nan")


def bench_numpy(case: Case, env, opts):
    from jaxrl_dist.envs.envpool_env import make_pool

    pool = make_pool(case.env_id, env.num_envs, 0, opts.num_threads)
    length = max(1, case.call_steps // env.num_envs)

    def reset(_seed):
        pool.reset()

    stats, _ = measure(numpy_fn(pool, env.spec, length), reset, length * env.num_envs,
                       opts.runs, opts.min_run_s)
    pool.close()
    return stats


def bench_raw(case: Case, env, opts):
    length = max(1, case.call_steps // env.num_envs)
    return measure(raw_env_fn(env, length), lambda i: raw_env_state(env, i),
                   length * env.num_envs, opts.runs, opts.min_run_s)[0]


def bench_rollout(case: Case, env, setup, opts):
    per_rollout = setup.cfg.algo.num_steps * env.num_envs
    rollouts = max(1, case.call_steps // per_rollout)
    return measure(rollout_fn(setup, env, rollouts), lambda i: rollout_state(setup, env, i),
                   rollouts * per_rollout, opts.runs, opts.min_run_s)[0]


def bench_train(case: Case, env, setup, opts):
    updates = setup.derived.num_updates
    chunk = fused.make_train_chunk(setup, env, updates)
    steps = updates * setup.derived.batch_size * case.num_seeds
    stats, metrics = measure(chunk, lambda i: fused.init_runner(setup, env, i), steps,
                             opts.runs, fresh=True)
    returns = [final_return(m) for m in metrics]
    finite = [r for r in returns if not math.isnan(r)]
    stats.update(final_returns=returns, num_updates=updates,
                 final_return=float(np.mean(finite)) if finite else float("nan"))
    return stats


def row_key(row: dict) -> tuple:
    return row["env_id"], row["num_envs"], row["num_seeds"], row["mode"]


def run_case(case: Case, opts, done: set) -> list[dict]:
    """Every mode of one case not in `done`; one result row each."""
    cfg = make_config(case, opts.num_threads)
    env = make_env(case.env_id, case.num_envs * case.num_seeds, case.suite, 0, opts.num_threads)
    setup = fused.make_setup(cfg, env.spec)
    bench = {"numpy": lambda: bench_numpy(case, env, opts), "raw": lambda: bench_raw(case, env, opts),
             "rollout": lambda: bench_rollout(case, env, setup, opts),
             "train": lambda: bench_train(case, env, setup, opts)}
    base = {k: v for k, v in case._asdict().items() if k != "modes"}
    rows = []
    for mode in case.modes:
        if (mode == "numpy" and case.suite != "envpool") or row_key({**base, "mode": mode}) in done:
            continue
        print(f"[bench] {case.env_id} envs={case.num_envs} seeds={case.num_seeds} {mode}",
              flush=True)
        rows.append({**base, "mode": mode, **opts.revision, **least_contended(bench[mode], opts)})
    return rows


def least_contended(bench, opts) -> dict:
    """`bench()`, measured again (up to `opts.retries` times) while other processes
    kept more than `opts.max_other_cpu` of the cores busy; the least contended result."""
    best = bench()
    for _ in range(opts.retries):
        if (best.get("other_cpu") or 0.0) <= opts.max_other_cpu:
            break
        print(f"[bench]   others used {best['other_cpu']:.0%} of the CPU: measuring again",
              flush=True)
        again = bench()
        best = min(best, again, key=lambda r: r.get("other_cpu") or 0.0)
    return best


def add_ratios(rows: list[dict]) -> None:
    """`vs_numpy`: each envpool row's throughput over envpool's own numpy-API throughput."""
    base = {(r["env_id"], r["num_envs"]): r["steps_per_s"] for r in rows if r["mode"] == "numpy"}
    for r in rows:
        ref = base.get((r["env_id"], r["num_envs"]))
        r["vs_numpy"] = r["steps_per_s"] / ref if ref else None


def summarize(rows: list[dict], seed_rows: list[dict]) -> dict:
    def pick(env_id, mode, num_envs=None, key="steps_per_s"):
        found = [r[key] for r in rows if r["env_id"] == env_id and r["mode"] == mode
                 and num_envs in (None, r["num_envs"])]
        return found[0] if found else None

    most_seeds = max(seed_rows, key=lambda r: r["num_seeds"]) if seed_rows else None
    return {
        "pong_rollout_vs_numpy": pick("Pong-v5", "rollout", key="vs_numpy"),
        "pong_rollout_vs_numpy_target": 0.85,
        "cartpole_4env_final_return": pick("CartPole-v1", "train", 4, key="final_return"),
        "max_seeds": most_seeds and most_seeds["num_seeds"],
        "max_seeds_wall_s": most_seeds and most_seeds["median_s"],
        "max_seeds_wall_s_target": 100.0 if most_seeds and most_seeds["num_seeds"] == 64 else None,
    }


# --- tables ------------------------------------------------------------------------------

THROUGHPUT_HEADERS = ["env", "envs", "mode", "steps/run", "compile s", "median s", "steps/s",
                      "vs envpool numpy", "final return", "others' CPU"]
SEED_HEADERS = ["seeds", "envs (total)", "steps/run", "compile s", "wall s (median)",
                "steps/s (all seeds)", "steps/s per seed", "final return", "others' CPU"]


OTHER_CPU_NOTE = ("others' CPU: share of all cores used by other processes during the timed "
                  "runs; a large value means the figure is depressed by contention")


def pct(x) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


def throughput_rows(rows: list[dict]) -> list[list[str]]:
    return [[r["env_id"], r["num_envs"], r["mode"], fmt(r["steps_per_run"]), fmt(r["compile_s"]),
             fmt(r["median_s"]), fmt(r["steps_per_s"]), fmt(r.get("vs_numpy")),
             fmt(r.get("final_return")), pct(r.get("other_cpu"))] for r in rows]


def seed_rows_table(rows: list[dict]) -> list[list[str]]:
    return [[r["num_seeds"], r["num_envs"] * r["num_seeds"], fmt(r["steps_per_run"]),
             fmt(r["compile_s"]), fmt(r["median_s"]), fmt(r["steps_per_s"]),
             fmt(r["steps_per_s"] / r["num_seeds"]), fmt(r["final_return"]),
             pct(r.get("other_cpu"))] for r in rows]


def revision_line(data: dict) -> str:
    """Which source revisions the rows were measured at (several after --resume)."""
    revs = sorted({(r.get("commit"), r.get("library_hash"), r.get("library_dirty"))
                   for r in data["results"] + data["seed_scaling"]}, key=str)
    text = ", ".join(f"{c} (library hash {h}{', modified from HEAD' if d else ''})"
                     for c, h, d in revs)
    return f"rows measured at {text}"


def meta_lines(meta: dict) -> list[str]:
    v = meta["versions"]
    dirty = " (library modified from HEAD)" if meta["library_dirty"] else ""
    return [f"commit {meta['commit']}{dirty}, library hash {meta['library_hash']}, {meta['date']}",
            f"{meta['platform']}: {', '.join(meta['devices'])} ({meta['device_kind']}); "
            f"host CPU {meta['cpu_model']}, {meta['cpu_count']} cores",
            f"jax {v['jax']}, jaxlib {v['jaxlib']}, flax {v['flax']}, optax {v['optax']}, "
            f"gymnax {v['gymnax']}, envpool {v['envpool']}, numpy {v['numpy']}"]


def summary_lines(s: dict) -> list[str]:
    return [f"Pong rollout / envpool numpy: {fmt(s['pong_rollout_vs_numpy'])} "
            f"(target >= {s['pong_rollout_vs_numpy_target']})",
            f"CartPole 4-env final return (last 10% of updates): "
            f"{fmt(s['cartpole_4env_final_return'])}",
            f"{s['max_seeds']} seeds wall time per run: {fmt(s['max_seeds_wall_s'])} s"
            + (f" (target <= {s['max_seeds_wall_s_target']:g} s)"
               if s["max_seeds_wall_s_target"] else "")]


def render_markdown(data: dict) -> str:
    """The whole result as markdown (for RESULTS.md)."""
    lines = meta_lines(data["meta"]) + [revision_line(data), OTHER_CPU_NOTE]
    parts = ["\n".join(f"- {line}" for line in lines),
             "### Throughput (env steps/s)",
             markdown_table(THROUGHPUT_HEADERS, throughput_rows(data["results"])),
             "### Seed scaling (CartPole-v1, 4 envs x 128 steps per seed)",
             markdown_table(SEED_HEADERS, seed_rows_table(data["seed_scaling"])),
             "### Summary", "\n".join(f"- {line}" for line in summary_lines(data["summary"]))]
    return "\n\n".join(parts) + "\n"


def print_console(data: dict) -> None:
    print("\n".join(meta_lines(data["meta"]) + [revision_line(data)]))
    print_table("Throughput (env steps/s)", THROUGHPUT_HEADERS, throughput_rows(data["results"]))
    print_table("Seed scaling (CartPole-v1)", SEED_HEADERS, seed_rows_table(data["seed_scaling"]))
    print("\n".join(summary_lines(data["summary"])))


# --- main --------------------------------------------------------------------------------


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="tiny sizes, to check the script works")
    p.add_argument("--out", default="bench/out/fused.json", help="JSON output path")
    p.add_argument("--markdown", help="also write the tables as markdown to this path")
    p.add_argument("--render", metavar="JSON", help="print markdown of an existing JSON and exit")
    p.add_argument("--runs", type=int, default=None, help="timed runs per measurement (>= 3)")
    p.add_argument("--min-run-s", type=float, default=None,
                   help="raw/rollout/numpy runs repeat calls until a run lasts this long")
    p.add_argument("--num-threads", type=int, default=0, help="envpool threads (0: envpool's choice)")
    p.add_argument("--only", default="", help="comma list of env ids to run, plus 'seeds'")
    p.add_argument("--modes", default="",
                   help="comma list of modes to run (numpy, raw, rollout, train); default all")
    p.add_argument("--num-envs", default="",
                   help="comma list of per-seed env counts to run; default all")
    p.add_argument("--skip-seeds", action="store_true",
                   help="run no seed-scaling case (--only ENV_ID selects that env's too)")
    p.add_argument("--max-other-cpu", type=float, default=0.15,
                   help="measure again when other processes used more than this share of the CPU")
    p.add_argument("--retries", type=int, default=2, help="at most this many such re-measurements")
    p.add_argument("--resume", action="store_true",
                   help="keep the rows already in --out and run only the missing ones")
    args = p.parse_args(argv)
    args.runs = args.runs or 3
    args.min_run_s = args.min_run_s if args.min_run_s is not None else (0.1 if args.quick else 2.0)
    return args


def selected(case_list: list[Case], only: str, tag: str | None = None) -> list[Case]:
    if not only:
        return case_list
    names = set(only.split(","))
    return [c for c in case_list if c.env_id in names or tag in names]


def filtered(case_list: list[Case], opts) -> list[Case]:
    """`case_list` restricted to `--num-envs` and `--modes` (each: no restriction when empty)."""
    modes = set(opts.modes.split(",")) if opts.modes else None
    sizes = {int(n) for n in opts.num_envs.split(",")} if opts.num_envs else None
    kept = []
    for case in case_list:
        if modes:
            case = case._replace(modes=tuple(m for m in case.modes if m in modes))
        if case.modes and (not sizes or case.num_envs in sizes):
            kept.append(case)
    return kept


def finish(data: dict) -> dict:
    add_ratios(data["results"])
    data["summary"] = summarize(data["results"], data["seed_scaling"])
    return data


def run_all(opts, data: dict) -> dict:
    """Run every selected case not already in `data`, saving the JSON after each."""
    env_cases, seed_cases = cases(opts.quick)
    done = {row_key(r) for r in data["results"] + data["seed_scaling"]}
    for section, case_list in (("results", selected(env_cases, opts.only)),
                               ("seed_scaling", [] if opts.skip_seeds
                                else selected(seed_cases, opts.only, "seeds"))):
        for case in filtered(case_list, opts):
            data[section] += run_case(case, opts, done)
            write_json(opts.out, finish(data))
    return data


def start_data(opts) -> dict:
    """Fresh results with this machine's description, or the saved ones with --resume."""
    if opts.resume and Path(opts.out).exists():
        return json.loads(Path(opts.out).read_text())
    ppo = dataclasses.asdict(make_config(cases(opts.quick)[0][0], opts.num_threads).algo)
    ppo.pop("total_timesteps")
    meta = {**machine_info(), "quick": opts.quick, "runs": opts.runs, "min_run_s": opts.min_run_s,
            "num_threads": opts.num_threads, "ppo": ppo}
    return {"meta": meta, "results": [], "seed_scaling": []}


def main(argv=None) -> dict:
    opts = parse_args(argv)
    if opts.render:
        print(render_markdown(json.loads(Path(opts.render).read_text())))
        return {}
    info = machine_info()
    opts.revision = {"commit": info["commit"], "library_dirty": info["library_dirty"],
                     "library_hash": info["library_hash"]}
    data = run_all(opts, start_data(opts))
    print_console(data)
    if opts.markdown:
        Path(opts.markdown).write_text(render_markdown(data))
    print(f"wrote {opts.out}")
    return data


if __name__ == "__main__":
    main()
