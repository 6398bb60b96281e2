"""`jaxrl-dist train` as a user runs it, against the fused kernel it calls, interleaved.

(a) kernel: bench/fused.py's train case (CartPole-v1, 4 envs x 128 steps, 4 epochs
    x 4 minibatches, 5e5 steps): `fused.make_train_chunk` over the whole training in
    one call, compiled and warmed up in a long-lived child process, then one timed
    call per round on a fresh runner (built outside the clock).
(b) cli: `python -m jaxrl_dist.cli train trainer=fused env.id=CartPole-v1` in a
    subprocess on a pseudo-terminal (so the progress bar draws as in a terminal),
    default logging on (progress bar, TensorBoard, JSONL); its steps/s is `sps` of
    the run's summary.json (train time, compile apart).

Every round runs each measurement once, in a rotating order; figures are medians
over the rounds after one warm-up round (which also fills the CLI's compile cache,
a fresh one under the output's temp directory). Options add more kernels to the
same rounds: `--baseline-tree DIR` the kernel of another source tree (e.g. an
export of an earlier commit, run with that tree's bench/fused.py), `--threefry`
the kernel without the unrolled CPU threefry lowering.

    python bench/cli_vs_kernel.py [--rounds 5] [--baseline-tree DIR] [--threefry] [--out FILE]
"""
from __future__ import annotations

import argparse
import fcntl
import json
import os
import pty
import resource
import statistics
import struct
import subprocess
import sys
import tempfile
import termios
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
CLI_ARGS = ["train", "trainer=fused", "env.id=CartPole-v1"]


def cli_args(tree: Path) -> list:
    """`CLI_ARGS` as `tree` spells them: trees from before the trainer group chose the
    fused trainer with `backend=fused`."""
    grouped = (tree / "jaxrl_dist" / "configs" / "trainer").is_dir() or (tree / "configs" / "trainer").is_dir()
    return CLI_ARGS if grouped else [a.replace("trainer=fused", "backend=fused") for a in CLI_ARGS]


# --- the kernel, in a child process: compile and warm up once, then one timed call per request


def kernel_child(rolled: bool) -> None:
    """Serve `run SEED` lines on stdin with one JSON line each; the tree is `sys.path[0]`'s parent."""
    if rolled:  # common.py opts in on import; this child measures JAX's own lowering
        from jaxrl_dist import platform

        platform.use_unrolled_threefry = lambda: False
    import fused as fb  # the tree's own bench/fused.py (and common.py)
    from common import _CpuSample, other_cpu

    run, compile_s = _kernel(fb)
    print(json.dumps({"ready": True, "compile_s": compile_s, "library": fb.fused.__file__}), flush=True)
    for line in sys.stdin:
        seed = int(line.split()[1])
        sample = _CpuSample()
        seconds, steps = run(seed)
        print(json.dumps({"sps": steps / seconds, "seconds": seconds,
                          "other_cpu": other_cpu(sample, _CpuSample())}), flush=True)


def _kernel(fb):
    """bench/fused.py's CartPole 4-env train case: `(run(seed) -> (seconds, steps), compile_s)`."""
    import jax

    case = fb.Case("CartPole-v1", "gymnax", 4, 500_000, 262_144)
    cfg = fb.make_config(case, 0)
    env = fb.make_env(case.env_id, case.num_envs * case.num_seeds, case.suite, 0, 0)
    setup = fb.fused.make_setup(cfg, env.spec)
    updates = setup.derived.num_updates
    start = time.perf_counter()
    chunk = fb.fused.make_train_chunk(setup, env, updates).lower(fb.fused.init_runner(setup, env, 0)).compile()
    compile_s = time.perf_counter() - start
    jax.block_until_ready(chunk(fb.fused.init_runner(setup, env, 0)))  # warm-up

    def run(seed: int):
        runner = jax.block_until_ready(fb.fused.init_runner(setup, env, seed))
        t0 = time.perf_counter()
        jax.block_until_ready(chunk(runner))
        return time.perf_counter() - t0, updates * setup.derived.batch_size * case.num_seeds

    return run, compile_s


class Kernel:
    """The parent's handle on a kernel child running source tree `tree`."""

    def __init__(self, tree: Path, rolled: bool = False):
        env = dict(os.environ, PYTHONPATH=str(tree))
        cmd = [sys.executable, str(HERE / "cli_vs_kernel.py"), "--child", str(tree / "bench")]
        self.proc = subprocess.Popen(cmd + (["--rolled"] if rolled else []), cwd=tree, env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.info = self._reply()

    def _reply(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"kernel child exited ({self.proc.wait()})")
        return json.loads(line)

    def run(self, seed: int) -> dict:
        self.proc.stdin.write(f"run {seed}\n")
        self.proc.stdin.flush()
        return self._reply()

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()


# --- the CLI, as a user runs it --------------------------------------------------------------


def _busy_seconds() -> float:
    ticks = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def in_terminal(cmd: list, env: dict, cwd: Path) -> tuple:
    """Run `cmd` with a pseudo-terminal (120 x 40) as stdout and stderr; `(code, output)`."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=slave, stderr=slave, env=env,
                            cwd=cwd)
    os.close(slave)
    out = bytearray()
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        out += data
    code = proc.wait()
    os.close(master)
    return code, out.decode(errors="replace")


def run_cli(tree: Path, run_dir: Path, cache: Path, extra: list) -> dict:
    """One `jaxrl-dist train` run of source tree `tree`; its summary's figures, and
    others' CPU over the whole process."""
    env = dict(os.environ, PYTHONPATH=str(tree), XDG_CACHE_HOME=str(cache), TERM="xterm-256color")
    env.pop("XLA_FLAGS", None)  # the CLI sets its own, as for a user
    cmd = [sys.executable, "-m", "jaxrl_dist.cli", *cli_args(tree), f"run.dir={run_dir}", *extra]
    busy, child, t0 = _busy_seconds(), _children_cpu(), time.perf_counter()
    code, output = in_terminal(cmd, env, tree)
    wall = time.perf_counter() - t0
    if code != 0:
        raise RuntimeError(f"jaxrl-dist train failed ({code}):\n{output[-3000:]}")
    others = (_busy_seconds() - busy) - (_children_cpu() - child)
    summary = json.loads((run_dir / "summary.json").read_text())
    row = {key: summary.get(key) for key in ("sps", "train_seconds", "compile_seconds",
                                             "checkpoint_seconds", "wall_seconds", "final_return")}
    # a summary without checkpoint_seconds had the writes inside train_seconds
    saving = summary.get("checkpoint_seconds") or 0.0
    row["sps_incl_checkpoint"] = summary["total_env_steps"] / (summary["train_seconds"] + saving)
    return row | {"other_cpu": max(0.0, others) / (wall * (os.cpu_count() or 1)), "process_s": wall}


# --- rounds and the report -------------------------------------------------------------------


def measurements(opts, tmp: Path) -> tuple:
    """`({name: measure(round) -> row}, {name: Kernel})`; the kernel children start here."""
    kernels = {"kernel": Kernel(REPO)}
    if opts.threefry:
        kernels["kernel rolled-threefry"] = Kernel(REPO, rolled=True)
    trees = {"cli": REPO}
    if opts.baseline_tree:
        base = Path(opts.baseline_tree).resolve()
        kernels[f"kernel at {opts.baseline_label}"] = Kernel(base)
        trees[f"cli at {opts.baseline_label}"] = base
    found = {name: (lambda r, k=k: k.run(r)) for name, k in kernels.items()}
    extra = opts.cli_args.split() if opts.cli_args else []
    for i, (name, tree) in enumerate(trees.items()):
        found[name] = lambda r, t=tree, i=i: run_cli(t, tmp / f"run{r}-{i}", tmp / f"cache{i}", extra)
    return found, kernels


def run_rounds(opts, tmp: Path) -> dict:
    found, kernels = measurements(opts, tmp)
    names = list(found)
    rows = {name: [] for name in names}
    try:
        for r in range(opts.rounds + 1):  # round 0 warms up (and fills the compile cache)
            order = names[r % len(names):] + names[:r % len(names)]
            for name in order:
                row = found[name](r)
                print(f"[round {r}{' warm-up' if r == 0 else ''}] {name}: {row['sps']:,.0f} steps/s "
                      f"(others' CPU {row['other_cpu']:.0%})", flush=True)
                if r:
                    rows[name].append(row)
    finally:
        for k in kernels.values():
            k.close()
    return {"rows": rows, "kernels": {name: k.info for name, k in kernels.items()}}


def summarize(rows: dict) -> dict:
    """Medians, and the ratios: the CLI over its kernel (for each tree, by its summary's
    `sps` and with the checkpoint writes counted in), this tree's kernel and CLI over
    the other kernels and CLIs."""
    med = {name: statistics.median(r["sps"] for r in rs) for name, rs in rows.items()}
    incl = {name: statistics.median(r["sps_incl_checkpoint"] for r in rs)
            for name, rs in rows.items() if name.startswith("cli")}
    out = {"median_sps": med, "median_sps_incl_checkpoint": incl,
           "cli over kernel": med["cli"] / med["kernel"],
           "cli incl. checkpoint over kernel": incl["cli"] / med["kernel"]}
    for name in med:
        kind, _, variant = name.partition(" ")  # "kernel at 1ac28e9" -> "kernel", "at 1ac28e9"
        if variant:
            out[f"{kind} over {name}"] = med[kind] / med[name]
        if kind == "cli" and variant.startswith("at "):
            out[f"{name} over kernel {variant}"] = med[name] / med[f"kernel {variant}"]
    return out


def report(data: dict) -> str:
    meta, summary = data["meta"], data["summary"]
    lines = [f"commit {meta['commit']}{' (library modified)' if meta['library_dirty'] else ''}, "
             f"{meta['cpu_model']}, {meta['cpu_count']} cores, {meta['date']}",
             "| measurement | median steps/s | runs (steps/s) | incl. checkpoint writes (median) "
             "| others' CPU (median) |", "|---|---|---|---|---|"]
    for name, rs in data["rows"].items():
        runs = ", ".join(f"{r['sps']:,.0f}" for r in rs)
        incl = summary["median_sps_incl_checkpoint"].get(name)
        other = statistics.median(r["other_cpu"] for r in rs)
        lines.append(f"| {name} | {summary['median_sps'][name]:,.0f} | {runs} | "
                     f"{'-' if incl is None else f'{incl:,.0f}'} | {other:.0%} |")
    lines += [f"- {key}: {value:.3f}" for key, value in summary.items() if not key.startswith("median")]
    return "\n".join(lines)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=5, help="timed rounds after the warm-up (>= 3)")
    p.add_argument("--baseline-tree", help="also the kernel and the CLI of this source tree")
    p.add_argument("--baseline-label", default="baseline", help="its name in the table")
    p.add_argument("--threefry", action="store_true",
                   help="also the kernel with JAX's own (rolled) CPU threefry lowering")
    p.add_argument("--cli-args", default="", help="extra overrides for the CLI runs")
    p.add_argument("--out", default="bench/out/cli_vs_kernel.json")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--rolled", action="store_true", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv=None) -> None:
    opts = parse_args(argv)
    if opts.child:
        sys.path.insert(0, opts.child)
        return kernel_child(opts.rolled)
    sys.path.insert(0, str(HERE))
    from common import machine_info, write_json

    meta = machine_info()
    with tempfile.TemporaryDirectory(prefix="cli_vs_kernel-") as tmp:
        data = run_rounds(opts, Path(tmp))
    data = {"meta": meta, "cli_args": CLI_ARGS + opts.cli_args.split(), **data,
            "summary": summarize(data["rows"])}
    write_json(opts.out, data)
    print(report(data))
    print(f"wrote {opts.out}")


if __name__ == "__main__":
    main()
