"""`jaxrl-dist bench`: the benchmark suite on this device, then its tables."""
from __future__ import annotations

import argparse
from typing import Sequence

from jaxrl_dist.tools import benchmark
from jaxrl_dist.cli.compose import presets
from jaxrl_dist.config import ConfigError

EPILOG = """\
cases, in priority order for an accelerator: {cases}

outputs (in --out): bench.json (written after every case), bench.md, bench_sps.png,
bench_time.png, bench_scaling.png; runs/CASE/ holds each case's run directory and log.

examples:
  jaxrl-dist bench --quick                     # the whole suite at small sizes, at most 90 s
  jaxrl-dist bench --budget-s 540 --out gpu    # full sizes; again with --resume for the rest
  jaxrl-dist bench --quick --cases cartpole_1 --profile cartpole_1
"""


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="jaxrl-dist bench", epilog=EPILOG.format(cases=", ".join(benchmark.ORDER)),
        formatter_class=argparse.RawDescriptionHelpFormatter, description="Run the standard suite, each case a "
        "`jaxrl-dist train` process (compile time recorded apart), and compare with published figures.")
    add = parser.add_argument
    add("--quick", action="store_true", help=f"small sizes; with no --budget-s, a "
        f"{benchmark.QUICK_BUDGET_S:.0f} s budget")
    add("--budget-s", type=float, metavar="S", help="never run past S seconds: a case that cannot start is "
        "skipped, one that runs out is killed (its finished chunks kept)")
    add("--cases", metavar="A,B", help="a subset of the cases (comma-separated)")
    add("--resume", action="store_true", help="keep the cases --out's bench.json already holds; run the others")
    add("--out", default="outputs/bench", metavar="DIR", help="output directory (default outputs/bench)")
    add("--profile", metavar="CASE", help="also write a JAX profiler trace of CASE (at its --quick size)")
    add("--repeats", type=int, default=1, help="runs per case; figures are medians (default 1)")
    add("--jobs", type=int, metavar="N", help="cases run side by side (default 1; with --quick 2)")
    add("--compile-cache", action="store_true", help="let cases use the persistent compile cache (default off)")
    args = parser.parse_args(argv)
    try:
        opts = benchmark.options(args.out, args.quick, args.budget_s, args.cases, args.resume,
                                 args.profile, args.repeats, args.compile_cache, args.jobs)
        data = benchmark.run_bench(opts, presets())
    except benchmark.BenchError as err:
        raise ConfigError(str(err)) from err
    except OSError as err:  # --out: a place nothing can be written
        raise ConfigError(f"--out {args.out}: cannot write {err.filename or ''} ({err.strerror or err})") from None
    print("\n" + benchmark.markdown(data))
    print("\n".join(f"wrote {p}" for p in data["written"]))
    return 1 if any(r["status"] == "failed" for r in data["cases"].values()) else 0
