"""Async against sync over remote actors: `python bench/async_vs_sync.py --regime remote`.

`--instances` real `jaxrl-dist serve` instances start once on loopback ports and
serve every run (their compiled rollouts stay warm). Each run puts a fresh
latency proxy (`tests/tools/faultproxy.py`) in front of each instance, seeded
with the run's seed: every chunk of every request waits normal(latency,
latency * `--jitter-frac`) ms each way, and with stragglers a share
`--straggler-share` of requests (one shard try, both directions) waits
`--straggler-factor` times that. Then the real CLI trains CartPole-v1 to
`run.target_return=475` on `backend=http backend.urls=[the proxies]`:

- `sync`: the round trainer, `scheduler=fixed scheduler.num_shards=B` (one round
  of `B` shards over the same instances, slot `s` on instance `s % instances`);
- `async`: `trainer=async asynchronous.max_staleness=S asynchronous.batch_chunks=B`, starting
  with `--actors` actors, the balancer free up to `--max-actors`.

Sync and async of one seed and setting run back to back, so a slow spell of
the shared machine hits both. Every process started here (instances, proxies,
CLI runs) is stopped by its PID at the end, also on an error.

Per run (`runs` in the JSON; the field names are fixed, a simulator is
calibrated on them): env steps/s after warm-up (`env_steps_per_s`, between
update 4 and the last, on the measured clock), wall time to the target from
the CLI process's start (`wall_to_target_s`: the record that reached 475, its
wall time minus the moment the process was started) and from the end of the
first update (`train_to_target_s`), the learner's median seconds per update
(`update_s_median`: its `learn_s`), an actor's median compute seconds per
chunk (`chunk_compute_s_median`: the serve instance's own clock, from the
start of the rollout to the encoded answer, as it reports it in each shard's
timings), the client's median seconds per shard request
(`chunk_roundtrip_s_median`: the HTTP backend's time from sending a try to
its whole answer, retries included), staleness max, dropped chunks, the
modeled cloud clock's steps/s and time to target beside the measured ones, the
load average before and after, and `proxy_delay_ms`: the proxies' sampled
delays merged (count, mean, max and stragglers summed or maxed over proxies;
p50 the median and p99 the largest of the proxies' own; `per_proxy` holds each).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))  # the fault proxy lives with the test tools
from async_vs_sync import RESULTS, WARMUP_UPDATES, stats, throughput  # noqa: E402
from common import cli_command, fmt, machine_info, markdown_table, print_table, read_jsonl, write_json  # noqa: E402

COMMON = ["env=cartpole", "backend=http", "cost=aws_lambda", "run.progress=false", "run.tensorboard=false",
          "run.target_return=475", "run.stop_at_target=true", "algo.total_timesteps=300000",
          "backend.shard_timeout=30"]


class Setting(NamedTuple):
    """One link: its mean latency, jitter and straggler share and factor."""

    latency_ms: float
    jitter_ms: float
    straggler_share: float
    straggler_factor: float

    @property
    def name(self) -> str:
        tail = f", {self.straggler_share:g} x{self.straggler_factor:g}" if self.straggler_share else ""
        return f"{self.latency_ms:g} ms{tail}"


class Mode(NamedTuple):
    name: str  # sync | async
    overrides: tuple
    max_staleness: int
    actors_start: int


def modes(args) -> list:
    B = args.batch_chunks
    sync = Mode("sync", ("trainer=sync", "scheduler=fixed", f"scheduler.num_shards={B}"), 0, B)
    asyn = Mode("async", ("trainer=async", f"asynchronous.max_staleness={args.max_staleness}",
                          f"asynchronous.batch_chunks={B}", f"asynchronous.actors={args.actors}",
                          f"asynchronous.max_actors={args.max_actors}"), args.max_staleness, args.actors)
    return [m for m in (sync, asyn) if m.name in args.modes.split(",")]


def settings(args) -> list:
    out = []
    for lat in (float(x) for x in args.latencies.split(",")):
        for kind in args.settings.split(","):
            share = args.straggler_share if kind == "stragglers" else 0.0
            if share and lat == 0:
                continue  # a straggler stretches the delay; at 0 ms there is none
            out.append(Setting(lat, lat * args.jitter_frac, share, args.straggler_factor))
    return out


@contextlib.contextmanager
def instances(n: int, token: str):
    """`n` serve instances on loopback ports; stopped by PID on the way out."""
    from jaxrl_dist.serve.local import LocalServer

    servers = []
    try:
        for _ in range(n):
            servers.append(LocalServer(token=token, timeout=120.0))
        yield servers
    finally:
        for s in servers:
            s.stop()


@contextlib.contextmanager
def proxies(servers: list, setting: Setting, seed: int, log_dir: Path):
    """A fresh latency proxy per instance for one run; yields them, stops them by PID
    and leaves their logs (`proxy{i}.json`) in `log_dir`."""
    from tools.faultproxy import FaultProxy

    started = []
    try:
        for i, s in enumerate(servers):
            started.append(FaultProxy(s.url, log_dir / f"proxy{i}.json", latency_ms=setting.latency_ms,
                                      jitter_ms=setting.jitter_ms, straggler_share=setting.straggler_share,
                                      straggler_factor=setting.straggler_factor, seed=seed * 100 + i))
        yield started
    finally:
        for p in started:
            p.stop()


def merge_delays(logs: list) -> dict:
    """The proxies' delay summaries as one (see the module doc)."""
    ds = [(log or {}).get("delays_ms", {}) for log in logs]
    ds = [d for d in ds if d.get("count")]
    count = sum(d["count"] for d in ds)
    return {"count": count, "mean": sum(d["mean"] * d["count"] for d in ds) / count if count else None,
            "p50": statistics.median(d["p50"] for d in ds) if ds else None,
            "p99": max((d["p99"] for d in ds), default=None), "max": max((d["max"] for d in ds), default=None),
            "stragglers": sum((log or {}).get("stragglers", 0) for log in logs),
            "requests": sum((log or {}).get("requests", 0) for log in logs), "per_proxy": ds}


def cli(overrides: list, run_dir: Path, token: str) -> tuple:
    """The real CLI as its own process; `(start time, return code)`. Its output goes
    to `run_dir/cli.log`."""
    cmd = cli_command()
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / "cli.log", "wb") as out:
        t0 = time.time()
        proc = subprocess.Popen(cmd + ["train", *overrides, f"run.dir={run_dir}"], stdout=out,
                                stderr=subprocess.STDOUT, env=dict(os.environ, JAXRL_DIST_TOKEN=token),
                                start_new_session=True)
        try:
            code = proc.wait(timeout=900)
        finally:
            if proc.poll() is None:
                os.kill(proc.pid, 9)
                proc.wait()
    return t0, code


def measure(records: list, summary: dict, t0: float) -> dict:
    """A run's figures from its metrics.jsonl records and summary.json (see the module doc)."""
    hit = next((r for r in records if (r.get("return_recent") or -1e9) >= 475.0), None)
    after = records[WARMUP_UPDATES:] or records
    compute = [x for r in after for x in r.get("shard_compute_s", [])]
    roundtrip = [x for r in after for x in r.get("shard_roundtrip_s", [])]
    learned = [r for r in records if "staleness_max" in r]
    med = lambda xs: statistics.median(xs) if xs else None  # noqa: E731
    return {"env_steps_per_s": throughput(records), "wall_to_target_s": hit and hit["time"] - t0,
            "train_to_target_s": hit and hit["time"] - records[0]["time"],
            "update_s_median": med([r["learn_s"] for r in after]),
            "chunk_compute_s_median": med(compute), "chunk_roundtrip_s_median": med(roundtrip),
            "staleness_max": max((r["staleness_max"] for r in learned), default=0),
            "staleness_mean": statistics.fmean(r["staleness_mean"] for r in learned) if learned else 0.0,
            "dropped": summary.get("dropped_chunks", 0),
            "actors_mean": statistics.fmean(r.get("actors_active", r["num_shards"]) for r in records),
            "modeled_env_steps_per_s": throughput(records, "cum_modeled_s"),
            "modeled_time_to_target_s": summary.get("time_to_target_s"),
            "summary_wall_to_target_s": summary.get("wall_to_target_s"),
            "updates": len(records), "env_steps": summary.get("env_steps"),
            "final_return": summary.get("final_return"), "retries": summary.get("retries"),
            "first_update_s": records[0]["time"] - t0,  # start-up: process start to the first update
            "wall_s": records[-1]["time"] - t0 if records else None}


def run_one(mode: Mode, setting: Setting, seed: int, servers: list, token: str, root: Path,
            args, extra=()) -> dict:
    run_dir = root / setting.name.replace(" ", "").replace(",", "_") / mode.name / f"seed{seed}"
    load0 = os.getloadavg()
    with proxies(servers, setting, seed, run_dir) as started:
        urls = ",".join(p.url for p in started)
        t0, code = cli([*COMMON, *mode.overrides, f"backend.urls=[{urls}]", f"seed={seed}", *extra],
                       run_dir, token)
    if code != 0:
        tail = (run_dir / "cli.log").read_text()[-1500:]
        raise RuntimeError(f"{mode.name} {setting.name} seed {seed}: the CLI exited {code}:\n{tail}")
    records = read_jsonl(run_dir / "metrics.jsonl")
    summary = json.loads((run_dir / "summary.json").read_text())
    logs = [json.loads(f.read_text()) for f in sorted(run_dir.glob("proxy*.json"))]
    return {"mode": mode.name, "max_staleness": mode.max_staleness, "instances": len(servers),
            "actors_start": mode.actors_start, "batch_chunks": args.batch_chunks,
            "latency_ms": setting.latency_ms, "jitter_ms": setting.jitter_ms,
            "straggler_share": setting.straggler_share,
            "straggler_factor": setting.straggler_factor if setting.straggler_share else 1.0,
            "seed": seed, "steps_per_chunk": records[0]["env_steps"] // records[0]["num_shards"],
            **measure(records, summary, t0), "proxy_delay_ms": merge_delays(logs),
            "loadavg_before": load0, "loadavg_after": os.getloadavg()}


def aggregate(runs: list) -> dict:
    """Mean, std and n of the headline figures per (setting, mode)."""
    groups = {}
    for r in runs:
        key = (r["latency_ms"], r["straggler_share"], r["mode"])
        groups.setdefault(key, []).append(r)
    keys = ("env_steps_per_s", "wall_to_target_s", "train_to_target_s", "modeled_env_steps_per_s",
            "modeled_time_to_target_s", "update_s_median", "chunk_compute_s_median",
            "chunk_roundtrip_s_median", "staleness_max", "dropped", "actors_mean", "first_update_s")
    agg = {k: {m: stats([r[m] for r in rs]) for m in keys} for k, rs in groups.items()}
    for k, rs in groups.items():  # the bound holds in every run, not on average
        agg[k]["staleness_max"]["max"] = max(r["staleness_max"] for r in rs)
    return agg


def ratios(agg: dict) -> dict:
    """async/sync per setting: steps/s, wall and training time to the target, the modeled ones."""
    out = {}
    for (lat, share, mode), a in agg.items():
        base = agg.get((lat, share, "sync"))
        if mode == "sync" or base is None:
            continue
        out[f"{lat:g}ms/{share:g}"] = {k: a[k]["mean"] / base[k]["mean"] for k in (
            "env_steps_per_s", "wall_to_target_s", "train_to_target_s", "modeled_env_steps_per_s",
            "modeled_time_to_target_s") if a[k]["mean"] is not None and base[k]["mean"]}
    return out


def cell(s: dict, digits: int = 3) -> str:
    return "—" if s["mean"] is None else f"{fmt(s['mean'], digits)} ± {fmt(s['std'], 2)}"


def table(agg: dict) -> tuple:
    headers = ["latency (ms)", "stragglers", "mode", "n", "env steps/s", "wall to 475 (s)", "start-up (s)",
               "training to 475 (s)",
               "modeled env steps/s", "modeled time to 475 (s)", "update (ms)", "chunk compute (ms)",
               "chunk round trip (ms)", "staleness max", "dropped", "actors"]
    ms = lambda s: cell({k: None if v is None or k == "n" else 1e3 * v for k, v in s.items()})  # noqa: E731
    rows = [[f"{lat:g}", f"{share:g}" if share else "none", mode, a["env_steps_per_s"]["n"],
             cell(a["env_steps_per_s"], 4), cell(a["wall_to_target_s"]), cell(a["first_update_s"]),
             cell(a["train_to_target_s"]),
             cell(a["modeled_env_steps_per_s"], 4), cell(a["modeled_time_to_target_s"]),
             ms(a["update_s_median"]), ms(a["chunk_compute_s_median"]), ms(a["chunk_roundtrip_s_median"]),
             fmt(a["staleness_max"]["max"]), cell(a["dropped"]),
             cell(a["actors_mean"])] for (lat, share, mode), a in sorted(agg.items())]
    return headers, rows


def plot(rat: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, key, title, goal in ((axes[0], "env_steps_per_s", "env steps/s, async / sync", 1.8),
                                 (axes[1], "wall_to_target_s", "wall time to 475, async / sync", 0.6)):
        for share, style in sorted({(k.split("/")[1], None) for k in rat}):
            pts = sorted((float(k.split("ms")[0]), v[key]) for k, v in rat.items()
                         if k.split("/")[1] == share and key in v)
            label = "no stragglers" if float(share) == 0 else f"stragglers ({float(share):g} of requests)"
            line, = ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=label)
            if key == "wall_to_target_s":  # the same without the start-up both share
                pts = sorted((float(k.split("ms")[0]), v["train_to_target_s"]) for k, v in rat.items()
                             if k.split("/")[1] == share and "train_to_target_s" in v)
                ax.plot([p[0] for p in pts], [p[1] for p in pts], "s:", color=line.get_color(),
                        label=label + ", training only")
        ax.axhline(1.0, color="gray", lw=0.8)
        ax.axhline(goal, color="tab:red", lw=0.8, ls="--", label=f"target {goal:g}")
        ax.set(xlabel="proxy latency each way (ms)", title=title)
        ax.legend(fontsize="x-small", framealpha=0.6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write(runs: list, meta: dict, out: Path) -> None:
    agg = aggregate(runs)
    rat = ratios(agg)
    headers, rows = table(agg)
    print_table("async against sync over remote actors", headers, rows)
    for k, v in rat.items():
        print(k, {m: round(x, 3) for m, x in v.items()})
    out.parent.mkdir(parents=True, exist_ok=True)
    write_json(out.with_suffix(".json"), {
        "meta": meta, "ratios": rat,
        "aggregate": {f"{lat:g}ms/{share:g}/{mode}": a for (lat, share, mode), a in agg.items()},
        "runs": runs})
    md = markdown_table(headers, rows) + "\n\nasync / sync (means over seeds):\n\n"
    md += "\n".join(f"- {k}: " + ", ".join(f"{m} {x:.3f}" for m, x in v.items()) for k, v in rat.items())
    out.with_suffix(".md").write_text(md + "\n")
    if rat:
        plot(rat, out.with_suffix(".png"))


def commit() -> str:
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE, capture_output=True, text=True)
    return out.stdout.strip()


def parse(argv) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="async against sync over remote actors (see bench/async_remote.py)")
    p.add_argument("--instances", type=int, default=4)
    p.add_argument("--latencies", default="0,10,20,50", help="ms each way, comma-separated")
    p.add_argument("--settings", default="none,stragglers")
    p.add_argument("--jitter-frac", type=float, default=0.25, help="jitter as a share of the latency")
    p.add_argument("--straggler-share", type=float, default=0.1)
    p.add_argument("--straggler-factor", type=float, default=5.0)
    p.add_argument("--seeds", default="0,1,2", help="seeds, comma-separated")
    p.add_argument("--modes", default="sync,async")
    p.add_argument("--batch-chunks", type=int, default=4, help="sync's shards per round, async's chunks per update")
    p.add_argument("--max-staleness", type=int, default=2)
    p.add_argument("--actors", type=int, default=4, help="async actors at the start (the trainer's default: one per chunk of a batch)")
    p.add_argument("--max-actors", type=int, default=8)
    p.add_argument("--extra", default="", help="more overrides for every run, space-separated")
    p.add_argument("--out", default=str(RESULTS / "async_remote"))
    p.add_argument("--from-json", help="only write the table, markdown and PNG again from a saved JSON")
    return p.parse_args(argv)


def rewrite(args) -> None:
    """`--from-json`: the outputs again from a saved run list (start-up filled in where
    an older run list lacks it: the wall to 475 less the training to 475)."""
    data = json.loads(Path(args.from_json).read_text())
    runs = data["runs"]
    for r in runs:
        if "first_update_s" not in r and r["wall_to_target_s"] is not None:
            r["first_update_s"] = r["wall_to_target_s"] - r["train_to_target_s"]
    write(runs, data["meta"], Path(args.out))


def main(argv=None) -> None:
    args = parse(argv)
    if args.from_json:
        return rewrite(args)
    token, root = secrets.token_hex(16), Path(tempfile.mkdtemp(prefix="async-remote-"))
    extra = tuple(args.extra.split())
    runs, started = [], time.time()
    with instances(args.instances, token) as servers:
        warm = Setting(0.0, 0.0, 0.0, 1.0)
        for mode in modes(args):  # untimed: compiles the instances' rollouts, fills the compile cache
            run_one(mode, warm, 99, servers, token, root / "warm", args, ("run.max_rounds=6", *extra))
        for setting in settings(args):
            for seed in (int(s) for s in args.seeds.split(",")):
                for mode in modes(args):  # back to back: a slow spell hits both alike
                    r = run_one(mode, setting, seed, servers, token, root, args, extra)
                    runs.append(r)
                    print(f"{setting.name} {mode.name} seed {seed}: {fmt(r['env_steps_per_s'])} steps/s, "
                          f"to 475 {fmt(r['wall_to_target_s'])} s (training {fmt(r['train_to_target_s'])}), "
                          f"update {fmt(r['update_s_median'])} s, round trip "
                          f"{fmt(r['chunk_roundtrip_s_median'])} s, staleness max {r['staleness_max']}, "
                          f"dropped {r['dropped']}, actors {fmt(r['actors_mean'])}, "
                          f"load {r['loadavg_before'][0]:.2f}", flush=True)
                write(runs, {**machine_info(), "args": vars(args), "run_root": str(root),
                             "bench_s": time.time() - started, "commit": commit()}, Path(args.out))


if __name__ == "__main__":
    main()
