"""Tests run JAX as the CLI and the benchmarks do: `configure_cpu()` before JAX starts,
and the unrolled CPU threefry lowering (the same bits, faster).

Besides matching what users run, this turns off XLA's concurrency-optimised CPU
scheduler, under which large vmapped programs (the learned scheduler's
scheduling MDP) were seen to hang now and then on 2 cores.
"""
import os
import shutil
import sys
import tempfile

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


_CACHE = {"made": None}


def pytest_configure(config):
    """One cache directory for the whole run, made by pytest itself before its workers
    start (they, and the CLI processes tests start, inherit it): `XDG_CACHE_HOME`, so no
    test writes the user's own cache, and in it the persistent XLA compile cache that
    `run.compile_cache` uses, on for every run. Many tests compile the same small programs."""
    if hasattr(config, "workerinput"):
        return
    made = _CACHE["made"] = tempfile.mkdtemp(prefix="jaxrl-dist-suite-")
    settings = {"jax_compilation_cache_dir": os.path.join(made, "jaxrl-dist", "xla"),
                "jax_persistent_cache_min_compile_time_secs": 0.1, "jax_persistent_cache_min_entry_size_bytes": -1}
    os.environ.update(XDG_CACHE_HOME=made, **{key.upper(): str(value) for key, value in settings.items()})
    if "jax" in sys.modules:  # a run without workers (-n0) started JAX above
        for key, value in settings.items():
            sys.modules["jax"].config.update(key, value)


def pytest_unconfigure(config):
    if _CACHE["made"]:
        shutil.rmtree(_CACHE["made"], ignore_errors=True)
