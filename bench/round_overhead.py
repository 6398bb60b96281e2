"""The round trainer against its own compute: where a round's wall goes, through the CLI.

Every figure comes from real `jaxrl-dist train` processes (the path a user runs) and
their `summary.json` / `metrics.jsonl`; configurations run interleaved, `--repeats`
times each, and ratios are of medians measured in the same run.

- `local`: the round trainer on the local backend (`scheduler=fixed
  scheduler.num_shards=4 backend.envs_per_shard=4`) against the fused trainer with
  `env.num_envs=16` (the same batch per update: 16 envs x 128 steps, 4 epochs x 4
  minibatches), CartPole-v1, 5e5 steps: training env steps/s with compiles and the
  round trainer's start-up apart (`summary.json`'s `sps`), and the whole command's wall.
- `ray`: `backend=ray` (a local runtime), 4 shards, `backend.num_cpus=0.25`, 5e5 steps:
  the median round's phases, its host overhead (round wall minus the actors' slowest
  rollout and the learner update) against 10 ms plus the bytes moved at 1 GB/s, the
  start-up, the training time to a return of 475 (`train_to_target_s`: from the first
  round, start-up apart, as RLlib's script times itself) and the whole command.
- `cluster` (`--cluster`): the same to 475 (`run.stop_at_target=true`) on a two-node
  Ray cluster on loopback (`ray start`, two nodes, one CPU each), the cluster up before
  the clock starts: the whole command's wall.
- `rllib` (`--rllib PYTHON`): RLlib's PPO to 475 with one env runner
  (`../shared/peers/rllib_cartpole.py 475 600 1`) run by that interpreter, beside ours.

    python bench/round_overhead.py                  # local and ray, 3 repeats
    python bench/round_overhead.py --cluster --rllib /tmp/peers/rllib/bin/python
    python bench/round_overhead.py --configs ray --base /tmp/base   # against another checkout

Writes `bench/results/round_overhead.json` (`--out`).
"""
from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine_info, print_table, write_json  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
PEERS = Path(__file__).resolve().parents[2] / "shared" / "peers"
QUIET = ["run.progress=false", "run.tensorboard=false"]
CONFIGS = {
    "fused": ["trainer=fused", "env.num_envs=16"],
    "local": ["scheduler=fixed", "scheduler.num_shards=4", "backend.envs_per_shard=4"],
    "ray": ["backend=ray", "scheduler=fixed", "scheduler.num_shards=4", "backend.num_cpus=0.25"],
}
HOST_BUDGET_S, BYTES_PER_S = 0.010, 1e9  # the target: 10 ms plus the bytes moved at 1 GB/s
WARM_ROUNDS = 5  # rounds left out of the per-round medians (the first shapes' compiles)


def cli(args: list, run_dir: Path, timeout: float = 900, env: dict | None = None) -> dict:
    """One `jaxrl-dist train` process: its summary, records and whole wall."""
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "jaxrl_dist", "train", *args, *QUIET, f"run.dir={run_dir}"],
                         capture_output=True, text=True, timeout=timeout, env=dict(os.environ, **(env or {})))
    wall = time.perf_counter() - t0
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed ({out.returncode}):\n{out.stderr[-3000:]}")
    summary = json.loads((run_dir / "summary.json").read_text())
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {"summary": summary, "records": records, "command_s": wall}


def round_figures(run: dict) -> dict:
    """The median round's phases and host overhead, and the run's start-up and times."""
    recs, s = run["records"][WARM_ROUNDS:], run["summary"]
    phases = sorted({k for r in recs for k in r if k.startswith("phase_")})
    host = [r["round_s"] - r.get("phase_rollout_s", 0.0) - r["phase_learn_s"] for r in recs]
    moved = [r.get("bytes_sent", 0) + r.get("bytes_received", 0) for r in recs]
    return {"round_ms": 1e3 * statistics.median(r["round_s"] for r in recs),
            "phases_ms": {k[len("phase_"):-2]: 1e3 * statistics.median(r.get(k, 0.0) for r in recs) for k in phases},
            "host_ms": 1e3 * statistics.median(host), "bytes_moved": statistics.median(moved),
            "host_budget_ms": 1e3 * (HOST_BUDGET_S + statistics.median(moved) / BYTES_PER_S),
            "startup_s": s.get("startup_seconds"), "startup_phases_s": {
                k: v for k, v in (s.get("phase_seconds") or {}).items() if k.startswith("startup_")},
            "train_to_target_s": s.get("train_to_target_s"), "wall_to_target_s": s.get("wall_to_target_s"),
            "sps": s["sps"], "train_s": s["train_seconds"], "command_s": run["command_s"],
            "final_return": s["final_return"], "params_sha256": s["params_sha256"][:12]}


def bench_runs(names: list, repeats: int, tmp: Path, base: Path | None = None) -> dict:
    """Every config of `names`, interleaved, `repeats` times; per config the runs' figures.
    With `base` (another checkout), each config also runs from that checkout's package
    (`NAME@base`), beside this one's."""
    sides = {"": None} if base is None else {"": None, "@base": {"PYTHONPATH": str(base)}}
    out = {name + tag: [] for name in names for tag in sides}
    for i in range(repeats):
        for name in names:
            for tag, env in sides.items():
                run = cli(CONFIGS[name], tmp / f"{name}{tag}-{i}", env=env)
                fig = round_figures(run) if name != "fused" else {
                    "sps": run["summary"]["sps"], "train_s": run["summary"]["train_seconds"],
                    "compile_s": run["summary"]["compile_seconds"], "command_s": run["command_s"],
                    "final_return": run["summary"]["final_return"]}
                out[name + tag].append(fig)
                print(f"{name}{tag} #{i}: {json.dumps({k: v for k, v in fig.items() if not isinstance(v, dict)})}",
                      flush=True)
    return out


def median_of(runs: list, key: str):
    values = [r[key] for r in runs if r.get(key) is not None]
    return statistics.median(values) if values else None


class LoopbackCluster:
    """A two-node Ray cluster on loopback (`ray start`): a head and a worker, one CPU each."""

    def __init__(self, port: int = 6391):
        self.address = f"127.0.0.2:{port}"
        # drivers join with the cluster's own token (`ray start` makes none, and a fresh machine has no ~/.ray one)
        self.env = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
        env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", **self.env)
        ray = str(Path(sys.executable).with_name("ray"))
        self.procs = []
        common = ["--num-cpus=1", "--block", "--disable-usage-stats"]
        head = [ray, "start", "--head", f"--port={port}", "--node-ip-address=127.0.0.2",
                "--include-dashboard=false", *common]
        worker = [ray, "start", f"--address={self.address}", "--node-ip-address=127.0.0.3", *common]
        for cmd in (head, worker):
            self.procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                               start_new_session=True))
        self._wait_nodes(len(self.procs))

    def _wait_nodes(self, n: int, timeout: float = 120) -> None:
        check = ("import ray, sys, time\n"
                 f"end = time.time() + {timeout}\n"
                 "while True:  # the head's GCS takes a moment to listen\n"
                 "    try:\n"
                 "        ray.init(address=sys.argv[1], logging_level='error')\n"
                 "        break\n"
                 "    except ConnectionError:\n"
                 "        if time.time() > end: raise\n"
                 "        time.sleep(0.5)\n"
                 f"while sum(x['Alive'] for x in ray.nodes()) < {n} and time.time() < end:\n"
                 "    time.sleep(0.2)\n"
                 f"sys.exit(0 if sum(x['Alive'] for x in ray.nodes()) >= {n} else 1)\n")
        out = subprocess.run([sys.executable, "-c", check, self.address], capture_output=True, text=True,
                             timeout=timeout + 60, env=dict(os.environ, **self.env))
        if out.returncode != 0:
            self.stop()
            raise SystemExit(f"the loopback cluster did not bring up {n} node(s): {out.stderr[-1500:]}")

    def stop(self) -> None:
        for proc in self.procs:  # each `ray start --block` leads its own process group
            try:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        current = Path("/tmp/ray/ray_current_cluster")  # `ray start` leaves it; a later ray.init() would join it
        if current.exists() and current.read_text().strip() == self.address:
            current.unlink(missing_ok=True)


def bench_cluster(repeats: int, tmp: Path) -> list:
    """The whole command to 475 on a two-node cluster, a fresh one for each run, up before
    its clock starts (a run's actors leave the cluster some time after its driver exits)."""
    runs = []
    for i in range(repeats):
        cluster = LoopbackCluster()
        try:
            args = [*CONFIGS["ray"], f"backend.address={cluster.address}", "run.stop_at_target=true"]
            run = cli(args, tmp / f"cluster-{i}", env=cluster.env)
        finally:
            cluster.stop()
        runs.append(round_figures(run) | {"stop_reason": run["summary"].get("stop_reason")})
        print(f"cluster #{i}: command {run['command_s']:.1f} s, {runs[-1]['stop_reason']}", flush=True)
    return runs


def bench_rllib(python: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    out = subprocess.run([python, str(PEERS / "rllib_cartpole.py"), "475", "600", "1"], capture_output=True,
                         text=True, timeout=1200, env=env)
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith("seconds=")), None)
    if line is None:
        return {"error": f"rllib did not report: {out.stdout[-500:]} {out.stderr[-1500:]}"}
    fields = dict(part.split("=") for part in line.split())
    return {"seconds": float(fields["seconds"]), "env_steps": int(float(fields["env_steps"])),
            "return": float(fields["return"]), "reached": fields["reached"] == "True"}


def add_rllib(python: str) -> None:
    """RLlib's run beside the figures already in `round_overhead.json` (same hour)."""
    result = json.loads((RESULTS / "round_overhead.json").read_text())
    result["rllib"] = bench_rllib(python)
    print(f"rllib: {result['rllib']}", flush=True)
    if "seconds" in result["rllib"] and "ray" in result["runs"]:
        result["rllib_over_ray_to_475"] = result["rllib"]["seconds"] / median_of(result["runs"]["ray"],
                                                                                   "train_to_target_s")
    write_json(RESULTS / "round_overhead.json", result)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--configs", default="fused,local,ray")
    ap.add_argument("--cluster", action="store_true", help="the two-node loopback cluster too")
    ap.add_argument("--rllib", metavar="PYTHON", help="run RLlib's PPO to 475 with this interpreter")
    ap.add_argument("--rllib-only", action="store_true", help="add RLlib's figure to the existing results")
    ap.add_argument("--base", type=Path, metavar="CHECKOUT",
                    help="also run each config from this checkout's package, interleaved (NAME@base)")
    ap.add_argument("--out", type=Path, default=RESULTS / "round_overhead.json")
    args = ap.parse_args()
    if args.rllib_only:
        return add_rllib(args.rllib)
    out = args.out
    tmp = Path(tempfile.mkdtemp(prefix="round-overhead-"))
    result = {"machine": machine_info(), "repeats": args.repeats}
    if args.base:
        result["base"] = subprocess.run(["git", "-C", str(args.base), "rev-parse", "HEAD"],
                                        capture_output=True, text=True).stdout.strip()
    result["runs"] = bench_runs([c for c in args.configs.split(",") if c], args.repeats, tmp, args.base)
    runs = result["runs"]
    for name in [n for n in runs if f"{n}@base" in runs and median_of(runs[n], "host_ms") is not None]:
        result[f"{name}_host_over_base"] = median_of(runs[name], "host_ms") / median_of(runs[f"{name}@base"], "host_ms")
    write_json(out, result)  # kept as each part ends
    if "fused" in runs and "local" in runs:
        result["local_over_fused_sps"] = median_of(runs["local"], "sps") / median_of(runs["fused"], "sps")
    if args.cluster:
        result["cluster"] = bench_cluster(args.repeats, tmp)
        write_json(out, result)
    if args.rllib:
        result["rllib"] = bench_rllib(args.rllib)
        print(f"rllib: {result['rllib']}", flush=True)
        if "ray" in runs and "seconds" in result["rllib"]:
            result["rllib_over_ray_to_475"] = result["rllib"]["seconds"] / median_of(runs["ray"], "train_to_target_s")
    rows = [[name, f"{median_of(r, 'sps'):,.0f}", f"{median_of(r, 'command_s'):.1f}",
             "-" if median_of(r, "host_ms") is None else f"{median_of(r, 'host_ms'):.1f}",
             "-" if median_of(r, "startup_s") is None else f"{median_of(r, 'startup_s'):.1f}",
             "-" if median_of(r, "train_to_target_s") is None else f"{median_of(r, 'train_to_target_s'):.2f}"]
            for name, r in runs.items()]
    print_table("medians", ["config", "train env steps/s", "command s", "host ms/round", "start-up s",
                            "train s to 475"], rows)
    print({k: v for k, v in result.items() if k.endswith(("_sps", "_475", "_over_base"))})
    write_json(out, result)
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
