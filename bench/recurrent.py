"""Recurrent policies: speed against PureJaxRL's GRU PPO, and whether memory matters.

Three parts, each through the CLI a user runs (`python -m jaxrl_dist train ...`):

- `speed`: PureJaxRL's `ppo_rnn.py` (GRU 128, CartPole-v1, 4 envs x 128 steps, 4 epochs x
  4 minibatches; `../shared/peers/purejaxrl_rnn_cartpole.py`) and `jaxrl-dist train
  trainer=fused algo.network=gru` at the same config, interleaved `--repeats` times; env
  steps/s of training (compile apart) and the median ratio.
- `memory`: CartPole-v1 with its velocities hidden (`env=cartpole_po`), fused trainer,
  8 seeds, 1e6 steps, GRU against the MLP at the same config; and `env=memory_chain`
  (bsuite's MemoryChain), GRU against the MLP, 8 seeds. Mean final return over seeds,
  with each seed's.
- `unroll`: the GRU at `network_options.unroll` 1, 4 and 16 at the speed config (a knob).

    python bench/recurrent.py [--parts speed,memory] [--repeats 3] [--steps 500000]
        [--peer-python /tmp/peers/venv/bin/python] [--peer-dir /tmp/peers/purejaxrl/purejaxrl]
        [--out bench/results/recurrent.json]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine_info, print_table, write_json  # noqa: E402

PEERS = Path(__file__).resolve().parents[2] / "shared" / "peers"
QUIET = ["run.progress=false", "run.tensorboard=false"]
# PureJaxRL's ppo_rnn.py config, as jaxrl-dist overrides (its obs and rewards are not normalised)
ANCHOR = ["trainer=fused", "algo.network=gru", "env.id=CartPole-v1", "env.num_envs=4", "algo.num_steps=128",
          "algo.update_epochs=4", "algo.minibatch_size=null", "algo.num_minibatches=4", "algo.lr=2.5e-4", "algo.hidden_sizes=[128,128]",
          "algo.activation=relu", "algo.network_options.hidden_size=128", "env.normalize_obs=false",
          "env.normalize_reward=false", "run.log_chunks=1"]
MEMORY = {  # name -> the preset's overrides; each runs with the GRU and with the MLP
    "cartpole_po": ["trainer=fused", "env=cartpole_po", "num_seeds=8"],
    "memory_chain": ["trainer=fused", "env=memory_chain", "num_seeds=8"],
}


def cli(args: list, run_dir: Path, timeout: float = 3600) -> dict:
    """One `jaxrl-dist train` process: its summary."""
    out = subprocess.run([sys.executable, "-m", "jaxrl_dist", "train", *args, *QUIET, f"run.dir={run_dir}"],
                         capture_output=True, text=True, timeout=timeout)
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed ({out.returncode}):\n{out.stderr[-3000:]}")
    return json.loads((run_dir / "summary.json").read_text())


def peer(python: str, peer_dir: str, steps: int) -> dict:
    """One run of PureJaxRL's ppo_rnn.py (its printed figures)."""
    out = subprocess.run([python, str(PEERS / "purejaxrl_rnn_cartpole.py"), peer_dir, "4", str(steps), "1"],
                         capture_output=True, text=True, timeout=3600)
    if out.returncode != 0:
        raise SystemExit(f"purejaxrl_rnn_cartpole.py failed:\n{out.stderr[-3000:]}")
    figures = dict(re.findall(r"(\w+)=([\d.]+)", out.stdout.splitlines()[-1]))
    return {k: float(v) for k, v in figures.items()}


def speed(args, tmp: Path) -> dict:
    """Interleaved runs of the peer and ours; medians and the median of the paired ratios."""
    rows = []
    for i in range(args.repeats):
        theirs = peer(args.peer_python, args.peer_dir, args.steps)
        ours = cli(ANCHOR + [f"algo.total_timesteps={args.steps}"], tmp / f"speed-{i}")
        rows.append({"peer_sps": theirs["sps"], "peer_compile_s": theirs["compile_s"],
                     "peer_return": theirs["final_return"], "ours_sps": ours["sps"],
                     "ours_compile_s": ours["compile_seconds"], "ours_return": ours["final_return"],
                     "ratio": ours["sps"] / theirs["sps"]})
        print(json.dumps(rows[-1]), flush=True)
    med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    return {"runs": rows, "median": med, "steps": args.steps}


def unroll(args, tmp: Path) -> dict:
    out = {}
    for u in (1, 4, 16):
        s = cli(ANCHOR + [f"algo.total_timesteps={args.steps}", f"algo.network_options.unroll={u}"],
                tmp / f"unroll-{u}")
        out[u] = {"sps": s["sps"], "compile_s": s["compile_seconds"]}
        print(json.dumps({"unroll": u, **out[u]}), flush=True)
    return out


def memory(args, tmp: Path) -> dict:
    out = {}
    for name, overrides in MEMORY.items():
        for network in ("mlp", "gru"):
            s = cli(overrides + [f"algo.network={network}"], tmp / f"{name}-{network}")
            out[f"{name}/{network}"] = {"final_return": s["final_return"], "returns_per_seed": s["returns_per_seed"],
                                        "env_steps": s["env_steps"], "train_s": s["train_seconds"],
                                        "compile_s": s["compile_seconds"]}
            print(json.dumps({"case": f"{name}/{network}", **out[f"{name}/{network}"]}), flush=True)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--parts", default="speed,memory")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--steps", type=int, default=500_000)
    p.add_argument("--peer-python", default="/tmp/peers/venv/bin/python")
    p.add_argument("--peer-dir", default="/tmp/peers/purejaxrl/purejaxrl")
    p.add_argument("--out", default="bench/results/recurrent.json")
    args = p.parse_args()
    parts = {"speed": speed, "memory": memory, "unroll": unroll}
    result = {"machine": machine_info(), "started": time.strftime("%Y-%m-%d %H:%M:%S")}
    with tempfile.TemporaryDirectory(prefix="bench-recurrent-") as tmp:
        for part in args.parts.split(","):
            result[part] = parts[part](args, Path(tmp))
            write_json(Path(args.out), result)  # each part as it ends
    if "speed" in result:
        m = result["speed"]["median"]
        print_table("GRU PPO, CartPole-v1, 4 envs x 128 steps (medians)", ["", "env steps/s", "compile s"],
                    [["PureJaxRL ppo_rnn.py", f"{m['peer_sps']:,.0f}", f"{m['peer_compile_s']:.1f}"],
                     ["jaxrl-dist fused gru", f"{m['ours_sps']:,.0f}", f"{m['ours_compile_s']:.1f}"],
                     ["ratio (median of pairs)", f"{m['ratio']:.2f}x", ""]])
    if "memory" in result:
        print_table("Memory: mean final return over seeds", ["case", "return", "per seed"],
                    [[k, f"{v['final_return']:.3f}", " ".join(f"{x:.2f}" for x in v["returns_per_seed"])]
                     for k, v in result["memory"].items()])


if __name__ == "__main__":
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    main()
