"""`jaxrl-dist eval RUN_DIR eval.KEY=VALUE`: a run's latest policy, episodes side by side."""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Sequence

from jaxrl_dist.cli.compose import options, parse_args
from jaxrl_dist.config import ConfigError, EvalConfig, not_a_run_dir
from jaxrl_dist.platform import use_unrolled_threefry

EPILOG = """\
keys (eval.KEY=VALUE): episodes=10 deterministic=true seed=0 seed_index=0 max_steps=100000
  video=false (an MP4 of episode 0: RUN_DIR/eval.mp4) video_fps=30

examples:
  jaxrl-dist eval outputs/2026-12-01/10-00-00
  jaxrl-dist eval runs/a eval.episodes=100 eval.deterministic=false
"""


def eval_options(overrides: Sequence[str]) -> EvalConfig:
    """The checked `EvalConfig` of `eval.KEY=VALUE` overrides."""
    opts = options(EvalConfig, overrides, "eval")
    opts.check()
    return opts


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="jaxrl-dist eval", epilog=EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     description="Load the run's latest checkpoint (jaxrl_dist.load_policy), run "
                                     "one episode in each of eval.episodes envs side by side, and write the mean, "
                                     "std and per-episode returns and lengths to RUN_DIR/eval.json.")
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a run directory (config.yaml, checkpoints/)")
    parser.add_argument("overrides", nargs="*", default=[], metavar="eval.KEY=VALUE", help="eval options")
    args = parse_args(parser, argv)
    opts = eval_options(args.overrides)
    if not (Path(args.run_dir) / "config.yaml").is_file():
        raise ConfigError(not_a_run_dir(args.run_dir, "config.yaml"))
    use_unrolled_threefry()
    from jaxrl_dist.evaluation import evaluate  # imports JAX

    result = evaluate(args.run_dir, opts)
    shown = "-" if result["mean_return"] is None else f"{result['mean_return']:.2f} +- {result['std_return']:.2f}"
    print(f"{result['env_id']}: return {shown} over {result['episodes_ended']}/{result['episodes']} "
          f"episodes ({'deterministic' if opts.deterministic else 'sampled'}, checkpoint "
          f"{result['checkpoint_step']})")
    if "video" in result:
        print(f"wrote {result['video']} ({result['video_frames']} frames)")
    print(f"wrote {Path(args.run_dir) / 'eval.json'}")
    return 0
