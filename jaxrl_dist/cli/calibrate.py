"""`jaxrl-dist calibrate`: time a few rounds on a real backend; write a latency profile."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

from jaxrl_dist.tools import calibrate
from jaxrl_dist.backends import BackendError
from jaxrl_dist.cli.compose import compose, load_config, parse_args
from jaxrl_dist.platform import use_unrolled_threefry
from jaxrl_dist.scheduling.profile import save_profile
from jaxrl_dist.trainers.rundir import writable_file

EPILOG = """\
backend=http without backend.urls starts `jaxrl-dist serve` on a loopback port for
the measurement (and its cold start); with backend.urls it uses those instances.

examples:
  jaxrl-dist calibrate env=cartpole backend=local
  jaxrl-dist calibrate env=hopper backend=local backend.envs_per_shard=2 --rounds 4 --shards 2
  jaxrl-dist calibrate env=cartpole backend=http --out profiles/cartpole-http.json
"""


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="jaxrl-dist calibrate", epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Run a few rounds of the round trainer on a real backend and time them: seconds per env "
        "step of a shard, bytes per shard and seconds per byte, the learner's seconds against batch size (a "
        "fitted line), straggler spread, a fresh worker's start-up. Writes a JSON profile.")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides (env=, backend=, ...)")
    parser.add_argument("--out", metavar="PATH", help="the profile to write (default profiles/<env.id>.json)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds to run; the first compiles (default 5)")
    parser.add_argument("--shards", type=int, default=4, help="shards per round (default 4)")
    parser.add_argument("--learner-shards", type=int, default=8,
                        help="time the learner at 1, 2, 4, ... up to this many shards (default 8)")
    parser.add_argument("--repeats", type=int, default=3, help="timed learner calls per size (default 3)")
    args = parse_args(parser, argv)
    composed = compose(args.overrides)
    backend = composed["backend"]
    out = writable_file(args.out or Path("profiles") / f"{composed['env']['id']}.json", "--out")
    serve = calibrate.LoopbackServe() if backend["name"] == "http" and not backend.get("urls") else None
    cfg = load_config(list(args.overrides) + (serve.overrides() if serve else []))
    opts = calibrate.Options(args.rounds, args.shards, args.learner_shards, args.repeats)
    use_unrolled_threefry()
    try:
        profile, meta = calibrate.calibrate(cfg, opts, serve)
    except BackendError as err:
        print(f"error: {' '.join(str(err).split())}", file=sys.stderr)
        return 3
    out = save_profile(profile, out, meta)
    print("\n".join(calibrate.summary(profile, meta) + [f"wrote {out}"]))
    return 0
