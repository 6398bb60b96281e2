"""Tests run JAX as the CLI and the benchmarks do: `configure_cpu()` before JAX starts,
and the unrolled CPU threefry lowering (the same bits, faster).

Besides matching what users run, this turns off XLA's concurrency-optimised CPU
scheduler, under which large vmapped programs (the learned scheduler's
scheduling MDP) were seen to hang now and then on 2 cores.
"""
from jaxrl_dist.platform import configure_cpu, use_unrolled_threefry

configure_cpu()
use_unrolled_threefry()
