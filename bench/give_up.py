"""Every give-up path exits with its documented code, whatever round it happens in.

Runs the real CLI on `backend=http` against endpoints that fail at different points,
`--runs` times each, and records each process's exit code and whether it aborted
natively (`terminate called`, `FATAL`, a signal):

- `unreachable`: every endpoint unreachable from the first shard (a port nothing
  listens on), `backend.shard_timeout=2`, one shard a round;
- `dies`: a real `jaxrl-dist serve` on loopback, killed (SIGKILL) once the run has
  logged `--after` rounds.

Exit code 3 (the backend gave up; the last checkpoint is named) is documented for both.

    python bench/give_up.py --runs 5

Writes `bench/results/give_up.json`.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine_info, write_json  # noqa: E402

from jaxrl_dist.serve.local import LocalServer  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
TOKEN = "give-up-bench"
COMMON = ["backend=http", "backend.shard_timeout=2", "scheduler=fixed", "scheduler.num_shards=1",
          "run.progress=false", "run.tensorboard=false", "run.checkpoint_every=2"]
NATIVE = ("terminate called", "FATAL", "Aborted", "core dumped")


def cli(args: list, run_dir: Path) -> subprocess.Popen:
    env = dict(os.environ, JAXRL_DIST_TOKEN=TOKEN)
    return subprocess.Popen([sys.executable, "-m", "jaxrl_dist", "train", *COMMON, *args, f"run.dir={run_dir}"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def outcome(proc: subprocess.Popen) -> dict:
    _, err = proc.communicate(timeout=600)
    lines = err.strip().splitlines()
    return {"code": proc.returncode, "native_abort": any(word in err for word in NATIVE),
            "last_line": lines[-1][:300] if lines else ""}


def unreachable(run_dir: Path, after: int) -> dict:
    return outcome(cli(["backend.urls=[http://127.0.0.1:9]"], run_dir))


def dies(run_dir: Path, after: int) -> dict:
    server = LocalServer(token=TOKEN)
    try:
        proc = cli([f"backend.urls=[{server.url}]"], run_dir)
        metrics, deadline = run_dir / "metrics.jsonl", time.time() + 300
        while time.time() < deadline and proc.poll() is None and (
                not metrics.exists() or len(metrics.read_text().splitlines()) < after):
            time.sleep(0.05)
        rounds = len(metrics.read_text().splitlines()) if metrics.exists() else 0
    finally:
        server.stop()
    return outcome(proc) | {"killed_after_rounds": rounds}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--after", type=int, default=10, help="rounds logged before the endpoint is killed")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="give-up-"))
    result = {"machine": machine_info(), "runs": args.runs, "cases": {}}
    for name, case in (("unreachable", unreachable), ("dies", dies)):
        runs = []
        for i in range(args.runs):
            runs.append(case(tmp / f"{name}-{i}", args.after))
            print(f"{name} #{i}: {runs[-1]}", flush=True)
        result["cases"][name] = runs
    ok = all(r["code"] == 3 and not r["native_abort"] for runs in result["cases"].values() for r in runs)
    result["all_exit_3"] = ok
    print("every run exited 3 without a native abort" if ok else "NOT every run exited 3 cleanly")
    write_json(RESULTS / "give_up.json", result)


if __name__ == "__main__":
    main()
