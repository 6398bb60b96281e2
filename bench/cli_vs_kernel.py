"""`jaxrl-dist train` as a user runs it, against the fused kernel it calls, interleaved.

(a) kernel: bench/fused.py's train case (CartPole-v1, 4 envs x 128 steps, 4 epochs
    x 4 minibatches, 5e5 steps): `fused.make_train_chunk` over the whole training in
    one call. Each round starts a fresh process that compiles it, warms it up and
    times three calls on fresh runners (built outside the clock); the round's
    figure is their median.
(b) cli: `python -m jaxrl_dist.cli train trainer=fused env.id=CartPole-v1` in a
    subprocess on a pseudo-terminal (so the progress bar draws as in a terminal),
    default logging on (progress bar, TensorBoard, JSONL); its steps/s is `sps` of
    the run's summary.json (train time, compile and checkpoint writes apart), and
    `incl. checkpoint` counts the checkpoint writes in.
(c) paired (`--paired`): one process on a pseudo-terminal runs the CLI's `main`
    (what `python -m jaxrl_dist.cli` runs), then (a) in the same process; its
    figure is the ratio of the two.

On this shared 2-core VM a whole process can run ~15% faster or slower than the
next, so (a) and (b) each start a process every round, and (c) compares within one.
Every round runs each measurement once, in a rotating order; figures are medians
over the rounds after one warm-up round (which also fills the CLI's compile cache,
a fresh one under a temp directory). `--baseline-tree DIR` adds the kernel, the CLI
(and the pair) of another source tree (e.g. an export of an earlier commit, with
that tree's bench/fused.py); `--threefry` the kernel without the unrolled CPU
threefry lowering.

    python bench/cli_vs_kernel.py [--rounds 5] [--paired] [--threefry]
        [--baseline-tree DIR --baseline-label NAME] [--out FILE]
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
KERNEL_RUNS = 3


# --- in a child process: the kernel, and the CLI then the kernel -----------------------------


def kernel_runs(fb, runs: int = KERNEL_RUNS) -> dict:
    """bench/fused.py's CartPole 4-env train case: compile, warm up, time `runs` calls."""
    import jax
    from common import _CpuSample, other_cpu

    case = fb.Case("CartPole-v1", "gymnax", 4, 500_000, 262_144)
    env = fb.make_env(case.env_id, case.num_envs * case.num_seeds, case.suite, 0, 0)
    setup = fb.fused.make_setup(fb.make_config(case, 0), env.spec)
    updates = setup.derived.num_updates
    start = time.perf_counter()
    chunk = fb.fused.make_train_chunk(setup, env, updates).lower(fb.fused.init_runner(setup, env, 0)).compile()
    compile_s = time.perf_counter() - start
    jax.block_until_ready(chunk(fb.fused.init_runner(setup, env, 0)))  # warm-up
    sps, sample = [], _CpuSample()
    for seed in range(1, runs + 1):
        runner = jax.block_until_ready(fb.fused.init_runner(setup, env, seed))
        t0 = time.perf_counter()
        jax.block_until_ready(chunk(runner))
        sps.append(updates * setup.derived.batch_size * case.num_seeds / (time.perf_counter() - t0))
    return {"sps": statistics.median(sps), "runs": sps, "compile_s": compile_s,
            "other_cpu": other_cpu(sample, _CpuSample()), "library": fb.fused.__file__}


def child(bench_dir: str, what: str, run_dir: str) -> None:
    """Print one JSON line: `kernel`, `rolled` (kernel without the unrolled threefry),
    or `paired` (the CLI's main into `run_dir`, then the kernel)."""
    sys.path.insert(0, bench_dir)  # the measured tree's own bench/fused.py and common.py
    if what == "rolled":  # common.py opts in on import; this child measures JAX's own lowering
        from jaxrl_dist import platform

        platform.use_unrolled_threefry = lambda: False
    out = {}
    if what == "paired":
        from jaxrl_dist.cli import compose as cli

        if cli.main([*cli_args(Path(bench_dir).parent), f"run.dir={run_dir}"]) != 0:
            raise SystemExit("jaxrl-dist train failed")
        out["cli_sps"] = json.loads((Path(run_dir) / "summary.json").read_text())["sps"]
    import fused as fb

    out.update(kernel_runs(fb))
    if what == "paired":
        out["kernel_sps"], out["sps"] = out["sps"], out["cli_sps"] / out["sps"]  # the ratio
    print("RESULT " + json.dumps(out), flush=True)


# --- the parent: subprocesses on a pseudo-terminal -------------------------------------------


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


def run_process(cmd: list, tree: Path, cache: Path) -> tuple:
    """`cmd` with `tree` on PYTHONPATH, the CLI's own XLA flags and a terminal;
    `(output, others' CPU share over its life)`."""
    env = dict(os.environ, PYTHONPATH=str(tree), XDG_CACHE_HOME=str(cache), TERM="xterm-256color")
    env.pop("XLA_FLAGS", None)  # configure_cpu sets them, as for a user
    busy, child_cpu, t0 = _busy_seconds(), _children_cpu(), time.perf_counter()
    code, output = in_terminal(cmd, env, tree)
    wall = time.perf_counter() - t0
    if code != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({code}):\n{output[-3000:]}")
    others = (_busy_seconds() - busy) - (_children_cpu() - child_cpu)
    return output, max(0.0, others) / (wall * (os.cpu_count() or 1))


def run_child(tree: Path, what: str, run_dir: Path, cache: Path) -> dict:
    cmd = [sys.executable, str(HERE / "cli_vs_kernel.py"), "--child", what, str(tree / "bench"),
           str(run_dir)]
    output, others = run_process(cmd, tree, cache)
    line = next(x for x in reversed(output.splitlines()) if x.startswith("RESULT "))
    row = json.loads(line[len("RESULT "):])
    return row | {"other_cpu": others if what == "paired" else row["other_cpu"]}


def run_cli(tree: Path, run_dir: Path, cache: Path) -> dict:
    """One `jaxrl-dist train` of source tree `tree`: its summary's figures."""
    cmd = [sys.executable, "-m", "jaxrl_dist.cli", *cli_args(tree), f"run.dir={run_dir}"]
    _, others = run_process(cmd, tree, cache)
    summary = json.loads((run_dir / "summary.json").read_text())
    row = {key: summary.get(key) for key in ("sps", "train_seconds", "compile_seconds",
                                             "checkpoint_seconds", "wall_seconds", "final_return")}
    # a summary without checkpoint_seconds had the writes inside train_seconds
    saving = summary.get("checkpoint_seconds") or 0.0
    row["sps_incl_checkpoint"] = summary["total_env_steps"] / (summary["train_seconds"] + saving)
    return row | {"other_cpu": others}


# --- rounds and the report -------------------------------------------------------------------


def measurements(opts, tmp: Path) -> dict:
    """name -> `measure(round) -> row`."""
    trees = {"": REPO}
    if opts.baseline_tree:
        trees[f" at {opts.baseline_label}"] = Path(opts.baseline_tree).resolve()
    found = {}
    for i, (suffix, tree) in enumerate(trees.items()):
        cache = tmp / f"cache{i}"
        found["kernel" + suffix] = lambda r, t=tree, c=cache: run_child(t, "kernel", tmp / "k", c)
        if opts.threefry and not suffix:
            found["kernel rolled-threefry"] = lambda r, t=tree, c=cache: run_child(t, "rolled", tmp / "k", c)
        found["cli" + suffix] = lambda r, t=tree, c=cache, i=i: run_cli(t, tmp / f"cli{r}-{i}", c)
        if opts.paired:
            found["paired" + suffix] = lambda r, t=tree, c=cache, i=i: run_child(
                t, "paired", tmp / f"pair{r}-{i}", c)
    return found


def run_rounds(opts, tmp: Path) -> dict:
    found = measurements(opts, tmp)
    names = list(found)
    rows = {name: [] for name in names}
    for r in range(opts.rounds + 1):  # round 0 warms up (and fills the compile caches)
        for name in names[r % len(names):] + names[:r % len(names)]:
            row = found[name](r)
            figure = f"{row['sps']:.3f} CLI/kernel" if name.startswith("paired") else f"{row['sps']:,.0f} steps/s"
            print(f"[round {r}{' warm-up' if r == 0 else ''}] {name}: {figure} "
                  f"(others' CPU {row['other_cpu']:.0%})", flush=True)
            if r:
                rows[name].append(row)
    return rows


def summarize(rows: dict) -> dict:
    """Medians, and the ratios: the CLI over the kernel (by its summary's `sps`, and with
    the checkpoint writes counted in), within one process (paired), and this tree's
    kernel and CLI over the other kernels and CLIs."""
    med = {name: statistics.median(r["sps"] for r in rs) for name, rs in rows.items()}
    incl = {name: statistics.median(r["sps_incl_checkpoint"] for r in rs)
            for name, rs in rows.items() if name.startswith("cli")}
    out = {"median": med, "median_incl_checkpoint": incl,
           "cli over kernel": med["cli"] / med["kernel"],
           "cli incl. checkpoint over kernel": incl["cli"] / med["kernel"]}
    for name in med:
        kind, _, variant = name.partition(" ")  # "kernel at 1ac28e9" -> "kernel", "at 1ac28e9"
        if variant and kind != "paired":
            out[f"{kind} over {name}"] = med[kind] / med[name]
        if kind == "cli" and variant.startswith("at "):
            out[f"{name} over kernel {variant}"] = med[name] / med[f"kernel {variant}"]
        if kind == "paired":
            out[f"{name}: cli over kernel in one process"] = med[name]
    return out


def report(data: dict) -> str:
    meta, summary = data["meta"], data["summary"]
    lines = [f"commit {meta['commit']}{' (library modified)' if meta['library_dirty'] else ''}, "
             f"{meta['cpu_model']}, {meta['cpu_count']} cores, {meta['date']}",
             "| measurement | median | runs | incl. checkpoint writes (median) "
             "| others' CPU (median) |", "|---|---|---|---|---|"]
    for name, rs in data["rows"].items():
        fmt = "{:.3f}" if name.startswith("paired") else "{:,.0f}"
        runs = ", ".join(fmt.format(r["sps"]) for r in rs)
        incl = summary["median_incl_checkpoint"].get(name)
        other = statistics.median(r["other_cpu"] for r in rs)
        lines.append(f"| {name} | {fmt.format(summary['median'][name])} | {runs} | "
                     f"{'-' if incl is None else f'{incl:,.0f}'} | {other:.0%} |")
    lines += [f"- {key}: {value:.3f}" for key, value in summary.items() if not key.startswith("median")]
    return "\n".join(lines)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=5, help="timed rounds after the warm-up (>= 3)")
    p.add_argument("--paired", action="store_true", help="also the CLI then the kernel in one process")
    p.add_argument("--baseline-tree", help="also the kernel and the CLI of this source tree")
    p.add_argument("--baseline-label", default="baseline", help="its name in the table")
    p.add_argument("--threefry", action="store_true",
                   help="also the kernel with JAX's own (rolled) CPU threefry lowering")
    p.add_argument("--out", default="bench/out/cli_vs_kernel.json")
    p.add_argument("--child", nargs=3, metavar=("WHAT", "BENCH_DIR", "RUN_DIR"), help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv=None) -> None:
    opts = parse_args(argv)
    if opts.child:
        what, bench_dir, run_dir = opts.child
        return child(bench_dir, what, run_dir)
    sys.path.insert(0, str(HERE))
    from common import machine_info, write_json

    meta = machine_info()
    with tempfile.TemporaryDirectory(prefix="cli_vs_kernel-") as tmp:
        rows = run_rounds(opts, Path(tmp))
    data = {"meta": meta, "cli_args": CLI_ARGS, "kernel_runs_per_round": KERNEL_RUNS, "rows": rows,
            "summary": summarize(rows)}
    write_json(opts.out, data)
    print(report(data))
    print(f"wrote {opts.out}")


if __name__ == "__main__":
    main()
