"""`jaxrl-dist train trainer=fused` (CartPole, defaults) with `logger.wandb=true` against
without, interleaved in one run: the steps/s of each run's summary (training time; the
W&B start-up and finish are set-up, outside it), medians over rounds after a warm-up.

Each run is a fresh process on a pseudo-terminal (progress bar, TensorBoard and JSONL
on, as a user runs it; `common.run_in_terminal`). W&B runs offline
(`WANDB_MODE=offline`): it writes its run file locally through its service process,
which an online run does too before it uploads.

    python bench/wandb_overhead.py [--rounds 6] [--out bench/results/wandb_overhead.json]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from common import REPO, machine_info, run_in_terminal, write_json  # noqa: E402

ARGS = ["train", "trainer=fused", "env.id=CartPole-v1"]


def one_run(wandb: bool, run_dir: Path, cache: Path) -> dict:
    os.environ["WANDB_MODE"] = "offline"
    cmd = [sys.executable, "-m", "jaxrl_dist.cli", *ARGS, f"run.dir={run_dir}"] + (["logger.wandb=true"] if wandb else [])
    _, others = run_in_terminal(cmd, REPO, cache)
    summary = json.loads((run_dir / "summary.json").read_text())
    return {"sps": summary["sps"], "wall_seconds": summary["wall_seconds"], "other_cpu": others}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--out", default="bench/results/wandb_overhead.json")
    opts = p.parse_args()

    rows = {"off": [], "wandb": []}
    with tempfile.TemporaryDirectory(prefix="wandb_overhead-") as tmp:
        tmp = Path(tmp)
        for r in range(opts.rounds + 1):  # round 0 warms the compile cache up
            order = ("off", "wandb") if r % 2 else ("wandb", "off")
            for name in order:
                row = one_run(name == "wandb", tmp / f"{name}{r}", tmp / "cache")
                print(f"[round {r}{' warm-up' if r == 0 else ''}] {name}: {row['sps']:,.0f} steps/s", flush=True)
                if r:
                    rows[name].append(row)
    med = {k: statistics.median(x["sps"] for x in v) for k, v in rows.items()}
    ratio = med["wandb"] / med["off"]
    write_json(opts.out, {"meta": machine_info(), "rows": rows, "median": med, "wandb_over_off": ratio})
    print(f"median steps/s: off {med['off']:,.0f}, wandb {med['wandb']:,.0f}; wandb/off {ratio:.3f}")


if __name__ == "__main__":
    main()
