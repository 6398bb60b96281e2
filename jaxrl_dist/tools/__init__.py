"""Tools used by the CLI and the benchmarks (`bench/`), never imported by the runtime:
the benchmark suite (`benchmark`), plots of runs and sweeps (`report`, `sweep_report`,
`plots`), latency calibration (`calibrate`), the discrete-event simulator (`simulate`),
and the small file helpers they share (`files`).

The runtime (core, envs, backends, scheduling, trainers, serve) never imports this
package; `tests/test_layers.py` checks it."""
