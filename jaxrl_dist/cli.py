"""`jaxrl-dist` console script: `train`, `serve`, `report`, `scheduler train`, `calibrate`, `bench`, `launch`.

`train` is a Hydra application (`jaxrl_dist.app`); the other commands compose the
same packaged configs with Hydra's compose API (`jaxrl_dist.overrides`). Every bad
config, whether Hydra rejects the override or `jaxrl_dist.config` rejects the value,
ends the process with exit code 2 and one line on stderr naming the key, before
anything is compiled.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional, Sequence

from jaxrl_dist.overrides import (CONFIG_DIR, CliConfigError, compose, load_config, one_line,  # noqa: F401
                                  override_keys, presets)

EXIT_CONFIG_ERROR = 2
EXIT_BACKEND_ERROR = 3
# what `jaxrl-dist train` hands to Hydra: its arguments, and the shell-completion query
# (Hydra's completion script calls the program with `-sc query=SHELL`)
_HYDRA_FIRST = ("train", "-sc", "--shell-completion")

_EPILOG = """\
overrides (Hydra syntax):
  env=PRESET            a preset from jaxrl_dist/configs/env/ ({presets})
  env.id=ID env.suite=gymnax|envpool|brax
                        any gymnax, envpool or brax id without a preset
  algo.lr=3e-4 algo.total_timesteps=1e6 num_seeds=4 seed=1
  env.kwargs.NAME=VALUE extra arguments to the env maker
  run.dir=DIR           run directory (default outputs/YYYY-MM-DD/HH-MM-SS)
  run.checkpoint_every=N  checkpoint every N updates (and at the end)
  run.checkpoint_every_s=S  and after every S seconds of training (300; 0: off)
  run.resume=DIR        continue the run in DIR from its latest checkpoint, with the
                        config saved there (only run.progress/compile_cache apply)
  run.progress=false run.tensorboard=false run.compile_cache=false

examples:
  jaxrl-dist train
  jaxrl-dist train env=hopper num_seeds=4
  jaxrl-dist train env.id=Acrobot-v1 env.suite=gymnax algo.total_timesteps=2e5
"""


_SERVE_EPILOG = """\
The port is $PORT when set (the Cloud Run / Knative / Container Apps contract),
else --port, else serve.port. A token is required: --token, serve.token or
$JAXRL_DIST_TOKEN; serve.token='' serves without authentication.
$JAXRL_DIST_ALLOWED_ENVS (comma-separated ids) and $JAXRL_DIST_MAX_BODY_MB set
serve.allowed_envs and serve.max_body_mb; overrides and flags win over them.

examples:
  JAXRL_DIST_TOKEN=secret jaxrl-dist serve --port 8001
  jaxrl-dist serve --token secret 'serve.allowed_envs=[CartPole-v1]' serve.max_body_mb=16
"""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="jaxrl-dist", description="PPO in JAX on gymnax, envpool and brax environments.",
        epilog=_EPILOG.format(presets=", ".join(presets())),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    # listed for --help only: `train` goes to the Hydra app (`jaxrl-dist train --help`)
    sub.add_parser("train", help="train (a Hydra app: -m sweeps, launchers, --cfg, --info; "
                   "see jaxrl-dist train --help)")
    serve = sub.add_parser("serve", help="serve the actor function (POST /v1/rollout) with uvicorn",
                           epilog=_SERVE_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    serve.add_argument("--host", help="interface to bind (default serve.host, 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port (default $PORT, else serve.port)")
    serve.add_argument("--token", help="bearer token (default $JAXRL_DIST_TOKEN)")
    serve.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                       help="serve.* overrides, e.g. serve.max_body_mb=16")
    report = sub.add_parser("report", help="plot runs and sweeps (PNG, markdown)",
                            description="Plot one or more run directories on shared figures: return "
                            "against env steps, modeled and wall time; shards, dollars and the time "
                            "breakdown per round. Figures whose keys a run lacks are skipped. A sweep "
                            "directory (jaxrl-dist train -m) is reported on its own: jobs grouped by "
                            "their overrides, seeds aggregated (mean curves with 95%% bootstrap bands, "
                            "IQM of the final return and performance profiles with rliable, sweep.md).")
    report.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run or sweep directories")
    report.add_argument("--out", metavar="DIR", help="where the PNGs go (default the first RUN_DIR)")
    _scheduler_parser(sub)
    _calibrate_parser(sub)
    _eval_parser(sub)
    _bench_parser(sub)
    _launch_parser(sub)
    return parser


_BENCH_EPILOG = """\
cases, in priority order for an accelerator: {cases}

outputs (in --out): bench.json (written after every case), bench.md, bench_sps.png,
bench_time.png, bench_scaling.png; runs/CASE/ holds each case's run directory and log.

examples:
  jaxrl-dist bench --quick                     # the whole suite at small sizes, at most 90 s
  jaxrl-dist bench --budget-s 540 --out gpu    # full sizes; again with --resume for the rest
  jaxrl-dist bench --quick --cases cartpole_1 --profile cartpole_1
"""


def _bench_parser(sub) -> None:
    from jaxrl_dist.benchmark import ORDER, QUICK_BUDGET_S

    bench = sub.add_parser("bench", help="run the benchmark suite on this device (JSON, markdown, PNGs)",
                           description="Run the standard suite, each case a `jaxrl-dist train` process "
                           "(compile time recorded apart), and compare with published figures.",
                           epilog=_BENCH_EPILOG.format(cases=", ".join(ORDER)),
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    bench.add_argument("--quick", action="store_true",
                       help=f"small sizes; with no --budget-s, a {QUICK_BUDGET_S:.0f} s budget")
    bench.add_argument("--budget-s", type=float, metavar="S",
                       help="never run past S seconds: a case that cannot start is skipped, one that "
                       "runs out is killed (its finished chunks kept)")
    bench.add_argument("--cases", metavar="A,B", help="a subset of the cases (comma-separated)")
    bench.add_argument("--resume", action="store_true",
                       help="keep the cases --out's bench.json already holds (done, failed, or killed "
                       "after some chunks); run the others")
    bench.add_argument("--out", default="outputs/bench", metavar="DIR", help="output directory "
                       "(default outputs/bench)")
    bench.add_argument("--profile", metavar="CASE",
                       help="also write a JAX profiler trace of CASE (at its --quick size) to DIR/profile/")
    bench.add_argument("--repeats", type=int, default=1,
                       help="runs per case; figures are medians (default 1)")
    bench.add_argument("--jobs", type=int, metavar="N",
                       help="cases run side by side (default 1; with --quick 2); the scaling case "
                       "always runs alone")
    bench.add_argument("--compile-cache", action="store_true",
                       help="let cases use the persistent compile cache (default off: cold compiles)")


_LAUNCH_EPILOG = """\
Process 0 hosts JAX's coordinator on a free loopback port (or --coordinator) and
writes the run directory; process i > 0 logs to RUN_DIR/process_<i>/. A process
that exits with an error stops the others, with one line naming it.

examples:
  jaxrl-dist launch --processes 2 --devices-per-process 2 trainer=fused trainer.devices=all
  jaxrl-dist launch --processes 4 trainer=fused env=breakout_minatar trainer.devices=all num_seeds=8
"""


def _launch_parser(sub) -> None:
    launch = sub.add_parser("launch", help="train one run over several processes (JAX distributed)",
                            epilog=_LAUNCH_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    launch.add_argument("--processes", type=int, required=True, metavar="N", help="processes to start")
    launch.add_argument("--coordinator", metavar="HOST:PORT",
                        help="process 0's coordinator address (default 127.0.0.1 and a free port)")
    launch.add_argument("--devices-per-process", type=int, metavar="K",
                        help="CPU only: split each process's host into K devices")
    launch.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="jaxrl-dist train overrides")


_CALIBRATE_EPILOG = """\
backend=http without backend.urls starts `jaxrl-dist serve` on a loopback port for
the measurement (and its cold start); with backend.urls it uses those instances.

examples:
  jaxrl-dist calibrate env=cartpole backend=local
  jaxrl-dist calibrate env=hopper backend=local backend.envs_per_shard=2 --rounds 4 --shards 2
  jaxrl-dist calibrate env=cartpole backend=http --out profiles/cartpole-http.json
"""


def _calibrate_parser(sub) -> None:
    cal = sub.add_parser("calibrate", help="measure a latency profile for the modeled clock",
                         description="Run a few rounds of the round trainer on a real backend and "
                         "time them: seconds per env step of a shard, bytes per shard and seconds "
                         "per byte, the learner's seconds against batch size (a fitted line), "
                         "straggler spread, a fresh worker's start-up. Writes a JSON profile "
                         "(profile.Profile fields and how they were measured).",
                         epilog=_CALIBRATE_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    cal.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides (env=, backend=, ...)")
    cal.add_argument("--out", metavar="PATH", help="the profile to write (default profiles/<env.id>.json)")
    cal.add_argument("--rounds", type=int, default=5, help="rounds to run; the first compiles (default 5)")
    cal.add_argument("--shards", type=int, default=4,
                     help="shards per round (default 4; the local backend runs gymnax shards one per round)")
    cal.add_argument("--learner-shards", type=int, default=8,
                     help="time the learner at 1, 2, 4, ... up to this many shards (default 8)")
    cal.add_argument("--repeats", type=int, default=3, help="timed learner calls per size (default 3)")


_EVAL_EPILOG = """\
keys (eval.KEY=VALUE): episodes=10 deterministic=true seed=0 seed_index=0 max_steps=100000
  video=false (an MP4 of episode 0: RUN_DIR/eval.mp4) video_fps=30

examples:
  jaxrl-dist eval outputs/2026-12-01/10-00-00
  jaxrl-dist eval runs/a eval.episodes=100 eval.deterministic=false
"""


def _eval_parser(sub) -> None:
    ev = sub.add_parser("eval", help="evaluate a run's latest policy (writes RUN_DIR/eval.json)",
                        description="Load the run's latest checkpoint (jaxrl_dist.load_policy) and "
                        "run one episode in each of eval.episodes envs side by side; writes the mean, "
                        "std and per-episode returns and lengths to RUN_DIR/eval.json.",
                        epilog=_EVAL_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    ev.add_argument("run_dir", metavar="RUN_DIR", help="a run directory (config.yaml, checkpoints/)")
    ev.add_argument("overrides", nargs="*", metavar="eval.KEY=VALUE", help="eval options")


def eval_options(overrides: Sequence[str]):
    """The `EvalConfig` of `eval.KEY=VALUE` overrides; `CliConfigError` naming a bad key."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from jaxrl_dist.config import EvalConfig

    bad = [o for o in overrides if not o.startswith("eval.") or "=" not in o]
    if bad:
        raise CliConfigError(f"bad override '{bad[0]}': eval takes eval.KEY=VALUE")
    try:
        given = OmegaConf.from_dotlist([o[len("eval."):] for o in overrides])
        merged = OmegaConf.merge(OmegaConf.structured(EvalConfig), given)
        opts = EvalConfig(**OmegaConf.to_container(merged))
    except OmegaConfBaseException as err:
        key = getattr(err, "full_key", "") or ""
        raise CliConfigError(f"eval.{key}: {str(err).splitlines()[0]}") from None
    for key in ("episodes", "max_steps", "video_fps"):
        if getattr(opts, key) < 1:
            raise CliConfigError(f"eval.{key} must be positive, got {getattr(opts, key)}")
    return opts


def _eval(args) -> int:
    from jaxrl_dist.config import ConfigError
    from jaxrl_dist.envs import EnvMakeError

    opts = eval_options(args.overrides)
    if not (Path(args.run_dir) / "config.yaml").is_file():
        raise CliConfigError(f"{args.run_dir}: not a run directory (no config.yaml)")
    _prepare_jax()
    from jaxrl_dist.evaluation import evaluate

    try:
        result = evaluate(args.run_dir, opts)
    except (ConfigError, EnvMakeError) as err:
        raise CliConfigError(one_line(err)) from err
    shown = "-" if result["mean_return"] is None else f"{result['mean_return']:.2f} +- {result['std_return']:.2f}"
    print(f"{result['env_id']}: return {shown} over {result['episodes_ended']}/{result['episodes']} "
          f"episodes ({'deterministic' if opts.deterministic else 'sampled'}, checkpoint "
          f"{result['checkpoint_step']})")
    if "video" in result:
        print(f"wrote {result['video']} ({result['video_frames']} frames)")
    print(f"wrote {Path(args.run_dir) / 'eval.json'}")
    return 0


def _scheduler_parser(sub) -> None:
    sched = sub.add_parser("scheduler", help="train the learned scheduler")
    ssub = sched.add_subparsers(dest="scheduler_command", metavar="ACTION", required=True)
    train = ssub.add_parser("train", help="train (or fine-tune) a scheduler on the modeled clock",
                            description="PPO on the scheduling MDP: each episode is a whole training "
                            "run of the task (env=..., backend.envs_per_shard, algo.*), each step a "
                            "round; the cost model (cost=...) prices it. Writes a msgpack file.")
    train.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides")
    train.add_argument("--out", required=True, help="the scheduler file to write")
    train.add_argument("--init-from", help="a scheduler file to fine-tune from (or scheduler.init_from=PATH)")
    train.add_argument("--updates", type=int, default=60, help="PPO updates of the scheduler")
    train.add_argument("--episodes", type=int, default=8, help="training runs side by side")
    train.add_argument("--rollout", type=int, default=16, help="rounds per scheduler update")
    train.add_argument("--max-rounds", type=int, default=60, help="rounds before an episode is cut")
    train.add_argument("--time-weight", type=float, default=0.5,
                       help="reward weight of modeled time against dollars (0..1)")
    train.add_argument("--target-bonus", type=float, default=10.0)
    train.add_argument("--budgets", type=_span, metavar="LO,HI",
                       help="the budgets episodes draw, uniformly, in units of --max-rounds rounds at "
                       "max_shards (default 0.05,0.5); each is none half the time")
    train.add_argument("--deadlines", type=_span, metavar="LO,HI",
                       help="the same for the deadlines (default 0.1,0.6)")
    train.add_argument("--limit-reward", choices=("cost", "progress"), default="cost",
                       help="episodes under a budget or deadline: priced per round as the others "
                       "(cost), or rewarded only for the progress they end with (progress)")
    train.add_argument("--features", metavar="base|all|A,B",
                       help="what the scheduler sees: base (the default), all (base plus budget_rounds and "
                            "time_rounds: what is left of a limit in rounds at the most shards, so a tight "
                            "and a loose budget look different from the first round), or names")
    train.add_argument("--seed", type=int, default=0)
    train.add_argument("--task", action="append", default=[], metavar="'KEY=VALUE ...'",
                       help="one task of a scheduler trained over several (repeat it): its own "
                       "overrides, after the common ones; updates go to each task in turn")
    train.add_argument("--epochs", type=int, default=4, help="the scheduler's PPO epochs per update")
    train.add_argument("--lr", type=float, default=3e-4, help="the scheduler's learning rate")
    train.add_argument("--profile", metavar="PATH",
                       help="latency profile (jaxrl-dist calibrate); default: the one shipped for "
                       "env.id, else profile.Profile()'s defaults")


def _span(text: str) -> tuple:
    """`LO,HI` (0 <= LO <= HI) as a float pair, for argparse."""
    try:
        lo, hi = (float(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected LO,HI (two numbers), got {text!r}") from None
    if not 0 <= lo <= hi:
        raise argparse.ArgumentTypeError(f"expected 0 <= LO <= HI, got {text!r}")
    return lo, hi


def _prepare_jax() -> None:
    """What a command that runs JAX sets before its first jit (once its config is
    checked, so a bad override still fails before JAX loads): the unrolled CPU
    threefry lowering, faster and bit for bit the same."""
    from jaxrl_dist.platform import use_unrolled_threefry

    use_unrolled_threefry()


def _serve(args) -> int:
    import dataclasses
    import os

    bad = [o for o in args.overrides if not o.lstrip("+").startswith("serve.")]
    if bad:
        raise CliConfigError(f"bad override '{bad[0]}': serve takes serve.* keys only")
    from jaxrl_dist.serve import config_from_env

    try:
        cfg = config_from_env(load_config(args.overrides).serve)  # the environment, then flags
    except ValueError as err:
        raise CliConfigError(str(err)) from err
    changes = {k: v for k, v in (("host", args.host), ("port", args.port), ("token", args.token))
               if v is not None}
    cfg = dataclasses.replace(cfg, **changes)
    if cfg.token is None and not os.environ.get("JAXRL_DIST_TOKEN"):
        raise CliConfigError("serve.token: no token; pass --token, set JAXRL_DIST_TOKEN, "
                             "or serve.token='' to serve without authentication")
    _prepare_jax()
    from jaxrl_dist.serve import serve

    serve(cfg)
    return 0


def _report(args) -> int:
    """Run directories on shared figures; each sweep directory (`train -m`) on its own,
    its jobs grouped by overrides and seeds aggregated."""
    from jaxrl_dist.report import ReportError, report
    from jaxrl_dist.sweep_report import is_sweep, sweep_report

    sweeps = [p for p in args.runs if is_sweep(p)]
    runs = [p for p in args.runs if p not in sweeps]
    out = []
    try:
        for path in sweeps:
            lines, written, notes = sweep_report(path, args.out)
            out += [f"sweep {path}:", *lines] + [f"wrote {p}" for p in written] + notes
        if runs:
            lines, written, notes = report(runs, args.out)
            out += lines + [f"wrote {p}" for p in written] + notes
    except ReportError as err:
        raise CliConfigError(str(err)) from err
    print("\n".join(out))
    return 0


def _scheduler_train(args) -> int:
    """`jaxrl-dist scheduler train`: each task's config from the overrides, then PPO."""
    from jaxrl_dist.scheduling import learned
    from jaxrl_dist import scheduler_training
    from jaxrl_dist.config import ConfigError
    from jaxrl_dist.scheduling import mdp

    tasks = [_scheduler_task(args, t.split()) for t in args.task or [""]]
    init_from = args.init_from or tasks[0][0].scheduler.init_from
    if init_from and not Path(init_from).is_file():
        raise CliConfigError(f"scheduler.init_from: no such file {init_from}")
    init = learned.load(init_from) if init_from else None
    try:
        seen = scheduler_training.features_for(args.features, init)
    except ConfigError as err:
        raise CliConfigError(one_line(err)) from err
    _prepare_jax()
    envs = [mdp.SchedulingEnv(cfg, cfg.cost, opts._replace(features=seen), args.episodes) for cfg, opts in tasks]
    recipe = scheduler_training.Recipe(epochs=args.epochs, lr=args.lr)
    trained = scheduler_training.train_scheduler(envs, args.rollout, args.updates, args.seed, init,
                                                 recipe=recipe)
    print(f"wrote {learned.save(trained, args.out)}")
    return 0


def _scheduler_task(args, extra: list) -> tuple:
    """`(task config, SchedOptions)` of one task: the common overrides, then its own."""
    from jaxrl_dist import scheduler_training
    from jaxrl_dist.config import ConfigError
    from jaxrl_dist.scheduling import profile

    try:
        cfg, opts = scheduler_training.task_and_options(
            load_config(list(args.overrides) + extra + ["backend=local"]), args.max_rounds, args.time_weight,
            args.target_bonus, args.profile,
            limits={k: v for k in ("budgets", "deadlines", "limit_reward") if (v := getattr(args, k)) is not None})
    except ConfigError as err:  # a bad profile file (load_config reports config errors itself)
        flag = "--profile: " if args.profile else ""
        raise CliConfigError(flag + one_line(err)) from err
    print(f"{cfg.env.id}: profile {profile.profile_file(cfg.env.id, args.profile) or 'Profile() defaults'}")
    return cfg, opts


def _calibrate(args) -> int:
    """`jaxrl-dist calibrate`: measure, write the profile, print a summary."""
    from jaxrl_dist import calibrate
    from jaxrl_dist.scheduling.profile import save_profile
    from jaxrl_dist.backends import BackendError
    from jaxrl_dist.config import ConfigError

    backend = compose(args.overrides)["backend"]
    serve = calibrate.LoopbackServe() if backend["name"] == "http" and not backend["urls"] else None
    cfg = load_config(list(args.overrides) + (serve.overrides() if serve else []))
    opts = calibrate.Options(args.rounds, args.shards, args.learner_shards, args.repeats)
    _prepare_jax()
    try:
        profile, meta = calibrate.calibrate(cfg, opts, serve)
    except ConfigError as err:
        raise CliConfigError(one_line(err)) from err
    except BackendError as err:
        print(f"error: {one_line(err)}", file=sys.stderr)
        return EXIT_BACKEND_ERROR
    out = save_profile(profile, args.out or Path("profiles") / f"{cfg.env.id}.json", meta)
    print("\n".join(calibrate.summary(profile, meta) + [f"wrote {out}"]))
    return 0


def _bench(args) -> int:
    """`jaxrl-dist bench`: the suite, then its tables; exit 1 if a case failed."""
    from jaxrl_dist import benchmark

    try:
        opts = benchmark.options(args.out, args.quick, args.budget_s, args.cases, args.resume,
                                 args.profile, args.repeats, args.compile_cache, args.jobs)
        data = benchmark.run_bench(opts, presets())
    except benchmark.BenchError as err:
        raise CliConfigError(str(err)) from err
    print("\n" + benchmark.markdown(data))
    print("\n".join(f"wrote {p}" for p in data["written"]))
    return 1 if any(r["status"] == "failed" for r in data["cases"].values()) else 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    from jaxrl_dist.config import ConfigError
    from jaxrl_dist.platform import configure_cpu

    configure_cpu()  # before JAX starts: XLA reads its flags once
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in _HYDRA_FIRST:
        from jaxrl_dist import app

        return app.main(argv[1:] if argv[0] == "train" else argv)
    args = _parser().parse_args(argv)
    try:
        if args.command == "serve":
            return _serve(args)
        if args.command == "eval":
            return _eval(args)
        if args.command == "report":
            return _report(args)
        if args.command == "scheduler":
            return _scheduler_train(args)
        if args.command == "calibrate":
            return _calibrate(args)
        if args.command == "bench":
            return _bench(args)
        if args.command == "launch":
            from jaxrl_dist.launch import launch

            return launch(args.overrides, args.processes, args.coordinator, args.devices_per_process)
        raise AssertionError(args.command)  # train is routed to the Hydra app above
    except (CliConfigError, ConfigError) as err:  # a check deeper down names the key as well
        print(f"error: {one_line(err)}", file=sys.stderr)
        return EXIT_CONFIG_ERROR


if __name__ == "__main__":
    sys.exit(main())
