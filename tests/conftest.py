"""Tests run JAX as the CLI and the benchmarks do: `configure_cpu()` before JAX starts,
and the unrolled CPU threefry lowering (the same bits, faster).

Besides matching what users run, this turns off XLA's concurrency-optimised CPU
scheduler, under which large vmapped programs (the learned scheduler's
scheduling MDP) were seen to hang now and then on 2 cores.
"""
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from jaxrl_dist.platform import configure_cpu, use_unrolled_threefry

configure_cpu()
use_unrolled_threefry()

import jax  # noqa: E402  (JAX starts here, after the flags above)

from jaxrl_dist.trainers import rundir  # noqa: E402


def runs_once(tmp_path_factory, prefix: str, make):
    """`run(key)`: `make(key, run_dir)` in a fresh directory the first time a key is
    asked for, its result after that (reference runs a module's tests compare to)."""
    made = {}

    def run(key):
        if key not in made:
            made[key] = make(key, tmp_path_factory.mktemp(f"{prefix}{key}"))
        return made[key]

    return run


def pytest_configure(config):
    """One cache directory for the whole run, made by pytest itself before its workers
    start (they, and the CLI processes tests start, inherit it): `XDG_CACHE_HOME`, so no
    test writes the user's own cache, and in it the persistent XLA compile cache that
    `run.compile_cache` uses (`rundir.enable_compile_cache`), on for every process of the
    run, the cache off or not. Many tests compile the same small programs."""
    if not hasattr(config, "workerinput"):
        os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="jaxrl-dist-suite-")
    path = rundir.enable_compile_cache()  # this process's (JAX is started above)
    os.environ.update(JAX_COMPILATION_CACHE_DIR=str(path), JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="-1",
                      JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=str(rundir.CACHE_MIN_COMPILE_SECS))


def pytest_unconfigure(config):
    if not hasattr(config, "workerinput"):
        shutil.rmtree(os.environ["XDG_CACHE_HOME"], ignore_errors=True)


@pytest.fixture(autouse=True)
def _the_runs_compile_cache():
    """A test that runs with a compile cache of its own (its own `XDG_CACHE_HOME`, to
    count hits) leaves its worker on the run's again, so later tests share programs."""
    before = jax.config.jax_compilation_cache_dir
    yield
    if jax.config.jax_compilation_cache_dir != before:
        rundir.enable_compile_cache(Path(before))
