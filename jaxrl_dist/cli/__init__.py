"""`jaxrl-dist`: a table of subcommands, each a module of this package imported when it runs.

Every bad config, whether Hydra/OmegaConf rejects the override or a check of
`jaxrl_dist.config` rejects the value, ends the process with exit code 2 and one line
on stderr naming the key, before anything is compiled.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys
from importlib.metadata import version
from pathlib import Path
from typing import Optional, Sequence

from jaxrl_dist.config import ConfigError, did_you_mean
from jaxrl_dist.platform import configure_cpu

EXIT_CONFIG_ERROR, EXIT_INTERRUPTED = 2, 130  # 130: the shell's code for Ctrl-C
# name -> one line of help; the module `jaxrl_dist.cli.<name>` has `main(argv) -> int`
COMMANDS = {
    "train": "train (a Hydra app: -m sweeps, launchers, --cfg, --info; see jaxrl-dist train --help)",
    "serve": "serve the actor function (POST /v1/rollout) with uvicorn",
    "eval": "evaluate a run's latest policy (writes RUN_DIR/eval.json)",
    "report": "plot runs and sweeps (PNG, markdown)",
    "scheduler": "train the learned scheduler (jaxrl-dist scheduler train ...)",
    "calibrate": "measure a latency profile for the modeled clock",
    "bench": "run the benchmark suite on this device (JSON, markdown, PNGs)",
    "launch": "train one run over several processes (JAX distributed)",
}
_EPILOG = """\
overrides (Hydra syntax):
  env=PRESET            a preset from jaxrl_dist/configs/env/ ({presets})
  env.id=ID env.suite=gymnax|envpool|brax|jumanji
                        any id of a suite, without a preset
  algo.lr=3e-4 algo.total_timesteps=1e6 seed=1
  trainer=fused num_seeds=4   several seeds in one program (the default trainer, sync, trains one)
  run.dir=DIR run.resume=DIR run.progress=false   (jaxrl-dist train --print-config: every key)

examples:
  jaxrl-dist train
  jaxrl-dist train trainer=fused env=hopper num_seeds=4
  jaxrl-dist train env.id=Acrobot-v1 env.suite=gymnax algo.total_timesteps=2e5
"""


def _usage() -> argparse.ArgumentParser:
    envs = sorted(p.stem for p in (Path(__file__).resolve().parent.parent / "configs" / "env").glob("*.yaml"))
    parser = argparse.ArgumentParser(prog="jaxrl-dist", description="PPO in JAX on gymnax, envpool and brax "
                                     "environments.", epilog=_EPILOG.format(presets=", ".join(envs)),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, text in COMMANDS.items():
        sub.add_parser(name, help=text, add_help=False)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    configure_cpu()  # before JAX starts: XLA reads its flags once
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--version"]:
        print(f"jaxrl-dist {version('jaxrl-dist')}")
        return 0
    if argv[:1] in (["-sc"], ["--shell-completion"]):  # Hydra's completion script asks the program
        argv = ["train", *argv]
    if argv and not argv[0].startswith("-") and argv[0] not in COMMANDS:
        print(f"error: unknown command {argv[0]!r}{did_you_mean(argv[0], list(COMMANDS), 0.6)}; "
              f"commands: {', '.join(COMMANDS)}", file=sys.stderr)
        return EXIT_CONFIG_ERROR
    if not argv or argv[0] not in COMMANDS:
        _usage().parse_args(argv)  # prints the usage (exit 0 for --help, 2 otherwise)
        return EXIT_CONFIG_ERROR
    try:
        return importlib.import_module(f"jaxrl_dist.cli.{argv[0]}").main(argv[1:])
    except ConfigError as err:  # a check deeper down names the key as well
        print(f"error: {' '.join(str(err).split())}", file=sys.stderr)
        return EXIT_CONFIG_ERROR
    except KeyboardInterrupt:  # Ctrl-C before a command's own handling starts (JAX still loading)
        print("stopped", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `jaxrl-dist report ... | head`: the reader left; nothing to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # Python's flush at exit would fail too
        return 1


if __name__ == "__main__":
    sys.exit(main())
