"""What a round costs on each backend, against the fused trainer at the same batch.

For each env, backend and shard count `n`, the round trainer runs `--warmup`
rounds (compiles, actor and function start-up; reported apart) and then
`--rounds` timed rounds. Per round (medians): dispatch, transfer and wait
time, learn time, round time, bytes each way, and

- busy: the busiest worker's compute time (`rounds.busy_seconds`);
- overhead = round - learn - busy: what gathering a round adds to the
  busiest worker's compute, and overhead per shard = overhead / n;
- payload rate = bytes sent and received / overhead;
- env steps/s = n * envs_per_shard * num_steps / round time, and its ratio
  to the fused trainer's steps/s on `n * envs_per_shard` envs, measured in the
  same run (`bench.common.measure`, compile apart, median of 3).

`--learning` adds the learning targets: CartPole-v1 to 475 on every backend,
and the whole `jaxrl-dist train backend=ray` process timed from its start
(Ray's start included).

    python bench/backends.py                 # the full grid (CPU: Pong at a small shard size)
    python bench/backends.py --quick         # a smoke run
    python bench/backends.py --learning --only-learning
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import cli_command, fmt, machine_info, markdown_table, measure, print_table, read_jsonl, write_json  # noqa: E402


from jaxrl_dist.trainers import fused  # noqa: E402
from jaxrl_dist.cli.compose import load_config  # noqa: E402
from jaxrl_dist.envs import make_env  # noqa: E402
from jaxrl_dist.trainers.sync import RoundTrainer  # noqa: E402
from jaxrl_dist.serve.local import LocalServer  # noqa: E402

TOKEN = "bench-token"
LEARN_STEPS = 300_000  # 4 shards x 4 envs x 128 steps: 147 rounds
RESULTS = Path(__file__).resolve().parent / "results"
# per env: shard size and PPO sizes; Pong's are small so 2 CPU cores finish the grid
SIZES = {
    "CartPole-v1": {"envs_per_shard": 4, "num_steps": 128, "num_minibatches": 4, "update_epochs": 4},
    "Pong-v5": {"envs_per_shard": 2, "num_steps": 32, "num_minibatches": 2, "update_epochs": 1},
}


class _Records:
    """A logger that keeps the records, as the JSON lines the file logger would write."""

    def __init__(self):
        self.records = []

    def log(self, records):
        self.records.extend(r.to_json() for r in records)


def _overrides(env_id: str, backend: str, n: int, rounds: int, run_dir, urls) -> list:
    size = SIZES[env_id]
    steps = rounds * n * size["envs_per_shard"] * size["num_steps"]
    out = [f"env.id={env_id}", f"backend={backend}", f"backend.envs_per_shard={size['envs_per_shard']}",
           f"backend.max_shards={max(n, 1)}", f"scheduler.num_shards={n}",
           f"algo.num_steps={size['num_steps']}", f"algo.num_minibatches={size['num_minibatches']}",
           f"algo.update_epochs={size['update_epochs']}", f"algo.total_timesteps={steps}",
           f"run.dir={run_dir}", "run.progress=false", "run.tensorboard=false",
           "backend.shard_timeout=600"]
    if backend == "http":
        out += [f"backend.urls=[{','.join(urls)}]", f"backend.token={TOKEN}"]
    return out


def _median(records, key):
    return statistics.median(r[key] for r in records)


def bench_rounds(env_id: str, backend: str, n: int, opts, urls) -> dict:
    """Warm-up rounds, then timed rounds, of one (env, backend, n)."""
    total = opts.warmup + opts.rounds
    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_config(_overrides(env_id, backend, n, total, tmp, urls))
        t0 = time.perf_counter()
        trainer = RoundTrainer(cfg, Path(tmp), False)
        sink = _Records()
        trainer.run(sink, [])
        trainer.ckpt.close()
        wall = time.perf_counter() - t0
    warm, timed = sink.records[:opts.warmup], sink.records[opts.warmup:]
    size = SIZES[env_id]
    row = {"env_id": env_id, "backend": backend, "num_shards": n,
           "envs_per_shard": size["envs_per_shard"], "num_steps": size["num_steps"],
           "warmup_s": sum(r["round_s"] for r in warm), "total_wall_s": wall}
    for key in ("dispatch_s", "transfer_s", "wait_s", "learn_s", "round_s", "busy_s",
                "bytes_sent", "bytes_received", "shard_s_median"):
        row[key] = _median(timed, key)
    overheads = [r["round_s"] - r["learn_s"] - r["busy_s"] for r in timed]
    row["overhead_s"] = statistics.median(overheads)
    row["overhead_per_shard_ms"] = 1000 * row["overhead_s"] / n
    moved = row["bytes_sent"] + row["bytes_received"]
    row["payload_mb_per_s"] = moved / 1e6 / row["overhead_s"] if row["overhead_s"] > 0 else None
    row["bytes_per_shard"] = moved / n
    row["steps_per_s"] = n * size["envs_per_shard"] * size["num_steps"] / row["round_s"]
    row["retries"] = sum(r["retries"] for r in sink.records)
    return row


def bench_fused(env_id: str, n: int, opts) -> dict:
    """The fused trainer on `n * envs_per_shard` envs, same PPO sizes, `--rounds` updates."""
    size = SIZES[env_id]
    num_envs = n * size["envs_per_shard"]
    steps = max(1, opts.fused_updates) * num_envs * size["num_steps"]
    cfg = load_config([f"env.id={env_id}", f"env.num_envs={num_envs}",
                       f"algo.num_steps={size['num_steps']}",
                       f"algo.num_minibatches={size['num_minibatches']}",
                       f"algo.update_epochs={size['update_epochs']}", f"algo.total_timesteps={steps}"])
    env = make_env(env_id, num_envs, seed=0)
    setup = fused.make_setup(cfg, env.spec)
    updates = setup.derived.num_updates
    K = 1 if setup.loop_free else updates
    chunk = fused.make_train_chunk(setup, env, K)
    runs = 1 if setup.loop_free else 3
    if setup.loop_free:  # one update per call: time a Python loop over `updates` calls
        chunk = chunk.lower(fused.init_runner(setup, env, 0)).compile()

        def loop(runner):
            for _ in range(updates):
                runner, metrics = chunk(runner)
            return runner, metrics

        stats, _ = measure(loop, lambda i: fused.init_runner(setup, env, i), steps, runs, fresh=True)
    else:
        stats, _ = measure(chunk, lambda i: fused.init_runner(setup, env, i), steps, runs, fresh=True)
    return {"env_id": env_id, "num_envs": num_envs, "steps_per_s": stats["steps_per_s"],
            "compile_s": stats["compile_s"], "times_s": stats["times_s"]}


def learning_runs(opts, urls) -> list:
    """CartPole-v1 to 475 on every backend; the Ray run timed as a whole process."""
    rows = []
    for backend in opts.backends:
        with tempfile.TemporaryDirectory() as tmp:
            args = [*cli_command(), "train", f"backend={backend}", "scheduler.num_shards=4",
                    "backend.envs_per_shard=4", f"algo.total_timesteps={LEARN_STEPS}",
                    f"run.dir={tmp}", "run.progress=false", f"seed={opts.seed}"]
            if backend == "http":
                args += [f"backend.urls=[{','.join(urls)}]"]
            t0, start = time.perf_counter(), time.time()
            env = dict(os.environ, JAXRL_DIST_TOKEN=TOKEN)  # the CLI takes no token as an override
            out = subprocess.run(args, capture_output=True, text=True, timeout=1800, env=env)
            wall = time.perf_counter() - t0
            if out.returncode:
                raise RuntimeError(f"{backend}: {out.stderr[-2000:]}")
            summary = json.loads((Path(tmp) / "summary.json").read_text())
            records = read_jsonl(Path(tmp) / "metrics.jsonl")
        crossing = next((r for r in records if (r["return"] or 0) >= 475), None)
        rows.append({"backend": backend, "final_return": summary["final_return"],
                     "process_wall_s": wall, "train_s": summary["train_seconds"],
                     "rounds": summary["rounds"], "params_sha256": summary["params_sha256"],
                     "first_475_round": crossing and crossing["round"],
                     "first_475_env_steps": crossing and crossing["env_steps"],
                     # from the process's start: Ray's start, imports and compiles included
                     "first_475_s": crossing and crossing["time"] - start})
        print(f"learning {backend}: final {summary['final_return']:.1f}, process {wall:.1f} s", flush=True)
    return rows


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--envs", default="CartPole-v1,Pong-v5")
    p.add_argument("--backends", default="local,ray,http")
    p.add_argument("--shards", default="1,2,4,8,16,32")
    p.add_argument("--pong-shards", default="1,2,4,8", help="Pong's shard counts (CPU-bound here)")
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--fused-updates", type=int, default=10)
    p.add_argument("--servers", type=int, default=2, help="function instances for http")
    p.add_argument("--learning", action="store_true", help="add the CartPole-to-475 runs")
    p.add_argument("--seed", type=int, default=0, help="seed of the learning runs")
    p.add_argument("--only-learning", action="store_true")
    p.add_argument("--quick", action="store_true", help="smoke run: 1-2 shards, 3 rounds")
    p.add_argument("--out", default=str(RESULTS / "backends.json"))
    opts = p.parse_args()
    opts.envs, opts.backends = opts.envs.split(","), opts.backends.split(",")
    opts.shards = [int(x) for x in opts.shards.split(",")]
    opts.pong_shards = [int(x) for x in opts.pong_shards.split(",")]
    if opts.quick:
        opts.shards, opts.pong_shards, opts.rounds, opts.warmup, opts.fused_updates = [1, 2], [1], 3, 1, 3
    return opts


def table_rows(rows, fused_sps):
    out = []
    for r in rows:
        base = fused_sps.get((r["env_id"], r["num_shards"]))
        out.append([r["env_id"], r["backend"], r["num_shards"], fmt(1000 * r["dispatch_s"]),
                    fmt(1000 * r["transfer_s"]), fmt(1000 * r["wait_s"]), fmt(1000 * r["busy_s"]),
                    fmt(1000 * r["learn_s"]), fmt(1000 * r["round_s"]), fmt(r["overhead_per_shard_ms"]),
                    fmt(r["bytes_per_shard"] / 1e3), fmt(r["payload_mb_per_s"]), fmt(r["steps_per_s"]),
                    fmt(base), fmt(r["steps_per_s"] / base if base else None)])
    return out


HEADERS = ["env", "backend", "n", "dispatch ms", "transfer ms", "wait ms", "busy ms", "learn ms",
           "round ms", "overhead/shard ms", "kB/shard", "payload MB/s", "steps/s", "fused steps/s",
           "ratio"]


def main() -> None:
    opts = parse()
    data = {"meta": machine_info(), "args": vars(opts), "sizes": SIZES, "rows": [], "fused": [],
            "learning": []}
    servers = [LocalServer(token=TOKEN) for _ in range(opts.servers)] if "http" in opts.backends else []
    urls = [s.url for s in servers]
    try:
        if not opts.only_learning:
            for env_id in opts.envs:
                counts = opts.pong_shards if env_id == "Pong-v5" else opts.shards
                for n in counts:
                    data["fused"].append(bench_fused(env_id, n, opts))
                    for backend in opts.backends:
                        row = bench_rounds(env_id, backend, n, opts, urls)
                        data["rows"].append(row)
                        print(f"{env_id} {backend} n={n}: round {1000 * row['round_s']:.1f} ms, "
                              f"overhead/shard {row['overhead_per_shard_ms']:.2f} ms, "
                              f"{row['steps_per_s']:,.0f} steps/s", flush=True)
                        write_json(opts.out, data)
        if opts.learning or opts.only_learning:
            data["learning"] = learning_runs(opts, urls)
            write_json(opts.out, data)
    finally:
        for s in servers:
            s.stop()
    fused_sps = {(f["env_id"], f["num_envs"] // SIZES[f["env_id"]]["envs_per_shard"]): f["steps_per_s"]
                 for f in data["fused"]}
    rows = table_rows(data["rows"], fused_sps)
    print_table("rounds per backend (medians of timed rounds)", HEADERS, rows)
    md = [markdown_table(HEADERS, rows)]
    if data["learning"]:
        lrows = [[r["backend"], fmt(r["final_return"]), fmt(r["process_wall_s"]), fmt(r["train_s"]),
                  r["first_475_round"], fmt(r["first_475_s"]), r["params_sha256"][:12]]
                 for r in data["learning"]]
        lh = ["backend", "final return", "process wall s", "train s", "first round >= 475",
              "first 475 at s", "params"]
        print_table(f"CartPole-v1, 4 shards x 4 envs, {LEARN_STEPS:,} steps", lh, lrows)
        md.append(markdown_table(lh, lrows))
    Path(opts.out).with_suffix(".md").write_text("\n\n".join(md) + "\n")
    write_json(opts.out, data)


if __name__ == "__main__":
    main()
