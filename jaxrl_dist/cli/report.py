"""`jaxrl-dist report RUN_DIR...`: runs on shared figures; each sweep directory on its own."""
from __future__ import annotations

import argparse
from typing import Sequence

from jaxrl_dist.config import ConfigError
from jaxrl_dist.tools.report import ReportError, report
from jaxrl_dist.tools.sweep_report import is_sweep, sweep_report


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="jaxrl-dist report", description="Plot run directories on shared figures: return against env "
        "steps, modeled and wall time; shards, dollars and the time breakdown per round. Figures whose keys a run "
        "lacks are skipped. A sweep directory (jaxrl-dist train -m) is reported on its own: jobs grouped by their "
        "overrides, seeds aggregated (mean curves with 95%% bootstrap bands, IQM of the final return and "
        "performance profiles with rliable, sweep.md).")
    parser.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run or sweep directories")
    parser.add_argument("--out", metavar="DIR", help="where the PNGs go (default the first RUN_DIR)")
    args = parser.parse_args(argv)
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
        raise ConfigError(str(err)) from err
    except OSError as err:  # --out: a place nothing can be written
        raise ConfigError(f"{err.filename}: {err.strerror or err}") from None
    print("\n".join(out))
    return 0
