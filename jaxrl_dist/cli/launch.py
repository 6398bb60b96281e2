"""`jaxrl-dist launch`: one training run over several processes on this host, supervised.

Each process is a `jaxrl-dist train` with `trainer.distributed.*` set (process 0
hosts JAX's coordinator on a free loopback port). They share one run directory:
process 0 writes the run's files and shows the bar, the others log into
`process_<i>/`, and every process writes its part of each checkpoint.

JAX's own runtime notices a dead peer only after its heartbeat timeout, and then
aborts with a long log (it also catches SIGTERM). The launcher watches the
processes instead: when one exits with an error it kills the others (SIGKILL, by
PID) and prints one line naming the process, its exit code and its log.

The processes run in a session of their own, so a signal reaches them once, from the
launcher: a Ctrl-C or a SIGTERM to the launcher is handed to each (stop after the
chunk, with a checkpoint; a second one stops at once). On Linux a process
whose launcher dies (killed outright, or its terminal closed) is killed with it.
"""
from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple, Optional, Sequence

from jaxrl_dist.cli.compose import load_config
from jaxrl_dist.cli.train import EXIT_INTERRUPTED, EXIT_PEER_LOST, LAUNCHER_ENV, RESUME_ENV
from jaxrl_dist.config import ConfigError
from jaxrl_dist.serve.local import free_port
from jaxrl_dist.trainers.parts import check_parts
from jaxrl_dist.trainers.rundir import check_fresh, check_usable, default_run_dir

POLL_S = 0.2
STOPPED = (EXIT_INTERRUPTED, 128 + signal.SIGTERM)  # a process that saved and stopped on a Ctrl-C or a SIGTERM


class Worker(NamedTuple):
    index: int
    proc: subprocess.Popen
    log: Optional[Path]  # None: process 0 writes to this terminal
    run_dir: Path


def _given(overrides: Sequence[str], key: str) -> Optional[str]:
    found = [o.split("=", 1)[1] for o in overrides if o.split("=", 1)[0].lstrip("+") == key]
    return found[-1] if found else None


def _command(overrides: Sequence[str], run_dir: Path, coordinator: str, n: int, i: int) -> list:
    given = [o for o in overrides if o.split("=", 1)[0].lstrip("+") != "run.dir"]  # its resolved path below
    cmd = [sys.executable, "-m", "jaxrl_dist", "train", *given, f"run.dir={run_dir}",
           f"hydra.run.dir={run_dir}", f"trainer.distributed.coordinator={coordinator}",
           f"trainer.distributed.num_processes={n}", f"trainer.distributed.process_id={i}"]
    if i:  # one bar and one .hydra/ (process 0's); the others' job logs in process_<i>/
        cmd += ["run.progress=false", "hydra.output_subdir=null",
                f"hydra.job_logging.handlers.file.filename={run_dir / f'process_{i}' / 'train.log'}"]
    return cmd


def _environment(processes: int, devices_per_process: Optional[int]) -> dict:
    again = f"jaxrl-dist launch --processes {processes}" + (
        f" --devices-per-process {devices_per_process}" if devices_per_process else "")
    env = dict(os.environ, **{LAUNCHER_ENV: str(os.getpid()), RESUME_ENV: again})
    if devices_per_process:  # CPU: split the host into this many devices per process
        flags = re.sub(r"--xla_force_host_platform_device_count=\S*", "", env.get("XLA_FLAGS", ""))
        env["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={devices_per_process}".strip()
    return env


def start(overrides: Sequence[str], processes: int, run_dir: Path, coordinator: str,
          devices_per_process: Optional[int] = None) -> list:
    """Start the processes; returns their `Worker`s."""
    env, workers = _environment(processes, devices_per_process), []
    for i in range(processes):
        log = None
        out = None
        if i:
            log = run_dir / f"process_{i}" / "output.log"
            log.parent.mkdir(parents=True, exist_ok=True)
            out = open(log, "wb")
        proc = subprocess.Popen(_command(overrides, run_dir, coordinator, processes, i), env=env,
                                stdout=out, stderr=subprocess.STDOUT if out else None,
                                start_new_session=True)
        if out:
            out.close()
        workers.append(Worker(i, proc, log, run_dir))
    return workers


def stop(workers: Sequence[Worker]) -> None:
    """Kill every process still running (SIGKILL: JAX's runtime catches SIGTERM) and reap it."""
    for w in workers:
        if w.proc.poll() is None:
            w.proc.send_signal(signal.SIGKILL)
    for w in workers:
        w.proc.wait()


def supervise(workers: Sequence[Worker]) -> int:
    """Wait for the processes: 0 when all succeed, 130 (143) when they stopped on a
    Ctrl-C (SIGTERM), which every process acts on at the same chunk, after a checkpoint,
    even where it reached one process only; else the first failure's exit code, after stopping the
    others and printing one line. A SIGINT or SIGTERM to the launcher meanwhile is
    handed to each running process; a third kills them all."""
    signals = []

    def forward(signum, frame):
        signals.append(signum)
        if len(signals) >= 3:
            raise KeyboardInterrupt
        for w in workers:
            if w.proc.poll() is None:
                w.proc.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        while True:
            codes = [w.proc.poll() for w in workers]
            # a process that lost its peer (EXIT_PEER_LOST) is named only when no other failed
            failed = min((w for w, c in zip(workers, codes) if c not in (None, 0, *STOPPED)), default=None,
                         key=lambda w: w.proc.returncode == EXIT_PEER_LOST)
            if failed is not None:
                return _fail(workers, failed)
            if None not in codes:  # 143 where a SIGTERM stopped them, as one `train` exits
                return max((c for c in codes if c in STOPPED), default=0)
            time.sleep(POLL_S)
    except KeyboardInterrupt:
        stop(workers)
        print("jaxrl-dist launch: killed every process (a third Ctrl-C or SIGTERM); nothing saved since the last "
              "checkpoint", file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _fail(workers: Sequence[Worker], failed: Worker) -> int:
    code = failed.proc.returncode
    others = [w for w in workers if w is not failed and w.proc.poll() is None]
    stop(workers)
    # process 0 writes to this terminal (its output is above) and its job log to RUN_DIR/train.log
    job_log = failed.run_dir / "train.log"
    where = f"; its log: {failed.log}" if failed.log else f"; its output is above, its job log: {job_log}"
    print(f"error: jaxrl-dist launch: process {failed.index} (pid {failed.proc.pid}) exited with code "
          f"{code}{where}; stopped the other {len(others)} running process(es)", file=sys.stderr, flush=True)
    return code if code > 0 else 1


def launch(overrides: Sequence[str], processes: int, coordinator: Optional[str] = None,
           devices_per_process: Optional[int] = None) -> int:
    """Run `jaxrl-dist train OVERRIDES` as `processes` processes of one run; the exit code."""
    if processes < 1:
        raise ConfigError(f"--processes must be positive, got {processes}")
    if any(o.split("=", 1)[0].startswith("trainer.distributed.") for o in overrides):
        raise ConfigError("trainer.distributed.*: jaxrl-dist launch sets these for each process")
    resume = _given(overrides, "run.resume")
    if _given(overrides, "trainer.devices") is None and not resume:  # one mesh over every process's devices
        overrides = [*overrides, "trainer.devices=all"]
    run_dir = Path(resume or _given(overrides, "run.dir") or default_run_dir()).resolve()
    if not resume:  # the config once here, not once a process (and one line)
        check_parts(load_config(overrides))
        check_usable(run_dir)
        check_fresh(run_dir)
    coordinator = coordinator or f"127.0.0.1:{free_port()}"
    workers = start(overrides, processes, run_dir, coordinator, devices_per_process)
    try:
        return supervise(workers)
    finally:
        stop(workers)


EPILOG = """\
Process 0 hosts JAX's coordinator on a free loopback port (or --coordinator) and
writes the run directory; the run uses every process's devices (trainer.devices=all); process i > 0 logs to RUN_DIR/process_<i>/. A process
that exits with an error stops the others, with one line naming it. Ctrl-C (or SIGTERM)
stops every process after the same chunk, with a checkpoint, and exits 130 (143).

examples:
  jaxrl-dist launch --processes 2 --devices-per-process 2 trainer=fused
  jaxrl-dist launch --processes 4 trainer=fused env=breakout_minatar num_seeds=8
"""


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="jaxrl-dist launch", epilog=EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--processes", type=int, required=True, metavar="N", help="processes to start")
    parser.add_argument("--coordinator", metavar="HOST:PORT",
                        help="process 0's coordinator address (default 127.0.0.1 and a free port)")
    parser.add_argument("--devices-per-process", type=int, metavar="K",
                        help="CPU only: split each process's host into K devices")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="jaxrl-dist train overrides")
    args = parser.parse_args(argv)
    return launch(args.overrides, args.processes, args.coordinator, args.devices_per_process)
