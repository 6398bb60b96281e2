"""Tests run JAX as the CLI and the benchmarks do: `configure_cpu()` before JAX starts,
and the unrolled CPU threefry lowering (the same bits, faster).

Besides matching what users run, this turns off XLA's concurrency-optimised CPU
scheduler, under which large vmapped programs (the learned scheduler's
scheduling MDP) were seen to hang now and then on 2 cores.
"""
from jaxrl_dist.platform import configure_cpu, use_unrolled_threefry

configure_cpu()
use_unrolled_threefry()


def runs_once(tmp_path_factory, prefix: str, make):
    """`run(key)`: `make(key, run_dir)` in a fresh directory the first time a key is
    asked for, its result after that (reference runs a module's tests compare to)."""
    made = {}

    def run(key):
        if key not in made:
            made[key] = make(key, tmp_path_factory.mktemp(f"{prefix}{key}"))
        return made[key]

    return run
