"""`jaxrl-dist bench`: the standard benchmark suite, on whatever device is there.

Every case is a `jaxrl-dist train` run in a subprocess (`python -m jaxrl_dist train
trainer=fused ...`), the path a user runs. Its `summary.json` gives the compile
seconds apart from the training seconds; its `metrics.jsonl` gives steps/s per
chunk: the first chunk is the warm-up, and the steady figure is the median of the
others. A case killed at its limit keeps the figures of the chunks it finished.
One process per case lets the suite kill a case at the budget and give a case its
own XLA flags (the scaling case forces host devices on CPU). This process never
starts a JAX backend itself: on a GPU it would hold memory the cases need.

The cases, in priority order for an accelerator (`ORDER`): CartPole at 1, 64 and
2048 seeds (2048 seeds x 5e5 steps, wall time with compile, is the headline GPU
figure), MinAtar Breakout at 256 seeds x 1e7 steps, brax Hopper at many seeds,
envpool Pong's time to reach given scores, and the data-parallel learner's
scaling over 1..all devices (`trainer.devices`). `--budget-s` never lets the suite
run past its budget: a case that cannot start in what is left is skipped, one
that runs out of it is killed; the JSON is written after every case, and
`--resume` skips the cases it already holds (`done_before`), so a budget can be
spent in parts.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from importlib.util import find_spec
from pathlib import Path
from typing import NamedTuple, Optional, Sequence

from jaxrl_dist.config import TrainerConfig
from jaxrl_dist.tools.files import markdown_table, read_jsonl, write_json
from jaxrl_dist.tools.plots import figure, save

ORDER = ("cartpole_1", "cartpole_64", "cartpole_2048", "minatar_breakout", "brax_hopper", "pong_score",
         "scaling")
# every case: the fused trainer, no progress bar or event files, no mid-run checkpoint
COMMON = ("trainer=fused", "run.progress=false", "run.tensorboard=false", "run.checkpoint_every_s=0")
QUICK_BUDGET_S = 90.0  # --quick without --budget-s: the whole suite in at most this
# --quick without --jobs: two cases side by side; a small case is mostly process start and
# compile, one core's work each, so two at a time fit the suite in QUICK_BUDGET_S on 2 cores
QUICK_JOBS = 2
RESERVE_S = 6.0  # kept back from the budget for writing the outputs at the end
SCORES = (-20.0, -15.0, -10.0, 0.0, 10.0, 20.0)  # Pong returns whose first crossing is timed
JSON_FILE, MD_FILE = "bench.json", "bench.md"
DPI = 110  # of the PNGs
PROBE = ("from jaxrl_dist.platform import configure_cpu; configure_cpu(); import json; "
         "from jaxrl_dist.trainers.rundir import machine_info; print(json.dumps(machine_info()))")


class BenchError(ValueError):
    """A bad flag or output directory, named in one line."""


class Size(NamedTuple):
    overrides: tuple  # on top of the case's own
    cap_s: float  # the case is killed after this long (scaling: each of its runs)
    need_s: float  # the case is not started with less than this left


class Case(NamedTuple):
    name: str
    what: str
    overrides: tuple  # at both sizes
    full: Size
    quick: Size
    kind: str = "train"  # train | score (time to reach SCORES) | scaling (1..all devices)
    needs: tuple = ()  # modules that must be importable
    preset: Optional[str] = None  # the env preset it runs


def _cartpole(seeds: int, cap: float, quick: tuple, quick_cap: float = 45) -> Case:
    return Case(f"cartpole_{seeds}", f"CartPole-v1, {seeds} seed{'s' * (seeds > 1)} x 4 envs",
                ("env=cartpole", f"num_seeds={seeds}"), Size(("algo.total_timesteps=500000",), cap, 20),
                Size(quick, quick_cap, 8), preset="cartpole")


CASES = {c.name: c for c in (
    _cartpole(1, 60, ("algo.total_timesteps=8192",)),
    _cartpole(64, 90, ("algo.total_timesteps=2048",)),
    _cartpole(2048, 150, ("algo.num_steps=32", "algo.total_timesteps=128"), quick_cap=30),
    Case("minatar_breakout", "Breakout-MinAtar, 256 seeds x 64 envs",
         ("env=breakout_minatar",), Size(("num_seeds=256", "algo.total_timesteps=10000000"), 420, 60),
         # 256 seeds' one update alone took 24 s on 2 cores, past the cap beside another case
         Size(("num_seeds=8", "env.num_envs=4", "algo.num_steps=16", "algo.total_timesteps=64"), 30, 8),
         preset="breakout_minatar"),
    Case("brax_hopper", "brax Hopper (the brax_hopper preset), 256 seeds", ("env=brax_hopper",),
         Size(("num_seeds=256", "algo.total_timesteps=1000000"), 150, 60),
         Size(("num_seeds=2", "env.num_envs=4", "algo.num_steps=16", "algo.total_timesteps=64"), 60, 20),
         needs=("brax",), preset="brax_hopper"),
    Case("pong_score", "envpool Pong-v5, time to score", ("env=pong", "run.log_chunks=200"),
         Size(("env.num_envs=32", "algo.total_timesteps=10000000"), 100, 40),
         Size(("env.num_envs=4", "algo.num_steps=16", "algo.total_timesteps=64"), 30, 8),
         kind="score", needs=("envpool",), preset="pong"),
    Case("scaling", "CartPole-v1, 64 envs, 4 epochs x 4 minibatches, over 1..all devices",
         ("env=cartpole", "env.num_envs=64", "algo.minibatch_size=null", "algo.num_minibatches=4",
          "algo.update_epochs=4"), Size(("algo.total_timesteps=409600",), 45, 25),
         Size(("algo.total_timesteps=32768",), 40, 16), kind="scaling", preset="cartpole"),
)}
assert tuple(CASES) == ORDER


class Anchor(NamedTuple):
    """A published figure and the case it is set beside."""

    system: str
    task: str
    figure: str
    hardware: str
    case: str
    measure: str  # wall | sps | efficiency


ANCHORS = (
    Anchor("PureJaxRL", "CartPole PPO, 2048 agents x 5e5 steps", "~98 s (~10M steps/s)", "1x A100",
           "cartpole_2048", "wall"),
    Anchor("PureJaxRL", "MinAtar Breakout PPO, 256 agents x 1e7 steps", "~325 s (~7.9M steps/s)", "1x A100",
           "minatar_breakout", "wall"),
    Anchor("Stoix", "CartPole PPO, 5e5 steps, 256 envs", "~5.2 s", "not stated", "cartpole_1", "wall"),
    Anchor("Anakin", "actor-learner in one program", "~5M steps/s", "8-core TPU", "cartpole_2048", "sps"),
    Anchor("Cleanba", "Atari Breakout PPO over 1 to 8 devices", "-", "1 to 8 A100", "scaling", "efficiency"),
)


class Target(NamedTuple):
    """This project's figures to reach on one H200 GPU."""

    case: str
    what: str
    measure: str  # wall: at most `value` s | sps: at least `value` steps/s
    value: float


TARGETS = (Target("cartpole_2048", "<= 45 s wall incl. compile", "wall", 45.0),
           Target("minatar_breakout", ">= 16M env steps/s", "sps", 16e6),
           Target("brax_hopper", ">= 3M env steps/s", "sps", 3e6))


class Options(NamedTuple):
    out: Path
    quick: bool = False
    budget_s: Optional[float] = None
    cases: tuple = ORDER
    resume: bool = False
    profile: Optional[str] = None
    repeats: int = 1
    compile_cache: bool = False
    jobs: int = 1  # cases run side by side (the scaling case always alone)


def options(out, quick=False, budget_s=None, cases=None, resume=False, profile=None, repeats=1,
            compile_cache=False, jobs=None) -> Options:
    """Checked `Options`; `BenchError` naming the flag that is wrong."""
    names = [c.strip() for c in (cases or ",".join(ORDER)).split(",") if c.strip()]
    unknown = [n for n in names if n not in CASES]
    if unknown or not names:
        raise BenchError(f"--cases: unknown case {unknown[0] if unknown else '(none)'!r}; "
                         f"cases: {', '.join(ORDER)}")
    if profile is not None and (profile not in CASES or CASES[profile].kind == "scaling"):
        raise BenchError(f"--profile: {profile!r} is not a single-run case; one of "
                         f"{', '.join(n for n in ORDER if CASES[n].kind != 'scaling')}")
    if budget_s is not None and budget_s <= RESERVE_S:
        raise BenchError(f"--budget-s must be more than {RESERVE_S:g} s, got {budget_s:g}")
    if repeats < 1:
        raise BenchError(f"--repeats must be positive, got {repeats}")
    if jobs is not None and jobs < 1:
        raise BenchError(f"--jobs must be positive, got {jobs}")
    if budget_s is None and quick:
        budget_s = QUICK_BUDGET_S
    jobs = jobs or (QUICK_JOBS if quick else 1)
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise BenchError(f"--out: {out} is a file, not a directory")
    return Options(out, quick, budget_s, tuple(n for n in ORDER if n in names), resume, profile, repeats,
                   compile_cache, jobs)


# --- the budget ----------------------------------------------------------------------------


class Clock:
    """Seconds left before the budget's end, less what writing the outputs needs."""

    def __init__(self, budget_s: Optional[float]):
        self.start = time.monotonic()
        self.budget_s = budget_s

    def left(self) -> float:
        if self.budget_s is None:
            return math.inf
        return self.budget_s - RESERVE_S - (time.monotonic() - self.start)

    def elapsed(self) -> float:
        return time.monotonic() - self.start


# --- one `jaxrl-dist train` process --------------------------------------------------------


class Outcome(NamedTuple):
    status: str  # ok | failed | killed
    reason: Optional[str]
    process_seconds: float
    summary: Optional[dict]
    records: list


def _one_line(log: Path) -> str:
    """The line of a child's log that says why it failed: its last error, else its last line."""
    lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    errors = [ln for ln in lines if re.search(r"(^error:|Error\b|Exception\b|Killed)", ln)]
    line = (errors or lines or ["no output"])[-1]
    return line[:300]


def _read_records(run_dir: Path) -> list:
    """The run's records; a last line cut by the kill is dropped (`files.read_jsonl`)."""
    path = run_dir / "metrics.jsonl"
    return read_jsonl(path) if path.is_file() else []


_ACTIVE: set = set()  # the children running now, so an interrupted suite ends them all


def stop_children() -> None:
    """Kill the process group of every child still running (each is one case's run)."""
    for proc in list(_ACTIVE):
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def run_train(overrides: Sequence[str], run_dir: Path, limit_s: float, env: Optional[dict] = None) -> Outcome:
    """`python -m jaxrl_dist train OVERRIDES run.dir=RUN_DIR`, killed after `limit_s` seconds.

    The child runs in its own process group, so a kill also ends what it started;
    its output goes to `RUN_DIR.log`.
    """
    if run_dir.exists():
        shutil.rmtree(run_dir)  # a case run again (--resume) starts from a fresh run dir
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    log = run_dir.with_name(run_dir.name + ".log")
    cmd = [sys.executable, "-m", "jaxrl_dist", "train", *overrides, f"run.dir={run_dir}"]
    child_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    t0 = time.monotonic()
    with open(log, "w") as out:
        out.write("$ " + " ".join(cmd) + "\n")
        out.flush()
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=child_env,
                                start_new_session=True)
        _ACTIVE.add(proc)
        try:
            code = proc.wait(timeout=max(0.0, limit_s))
        except subprocess.TimeoutExpired:
            code = None
        finally:
            if proc.poll() is None:  # timed out, or this process was interrupted
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            _ACTIVE.discard(proc)
    seconds = time.monotonic() - t0
    try:
        records = _read_records(run_dir)
    except ValueError as err:  # a damaged line, not one cut at the end
        return Outcome("failed", str(err), seconds, None, [])
    summary_path = run_dir / "summary.json"
    summary = json.loads(summary_path.read_text()) if code == 0 and summary_path.is_file() else None
    if code is None:
        return Outcome("killed", f"killed at its {limit_s:.0f} s limit", seconds, None, records)
    if code != 0 or summary is None:
        return Outcome("failed", f"exit {code}: {_one_line(log)}", seconds, None, records)
    return Outcome("ok", None, seconds, summary, records)


# --- figures from a run ----------------------------------------------------------------------


def chunk_rates(records: list) -> list:
    """`[(env steps in the chunk, all seeds; steps/s)]` per chunk: a chunk's records share
    the one steps/s the runner measured for it."""
    chunks, prev_steps = [], 0
    for rec in records:
        sps, seeds = rec.get("sps"), len(rec.get("episode_return_sum") or [0])
        steps = (rec["env_steps"] - prev_steps) * seeds
        prev_steps = rec["env_steps"]
        if sps is None:
            continue
        if chunks and chunks[-1][1] == sps:
            chunks[-1] = (chunks[-1][0] + steps, sps)
        else:
            chunks.append((steps, sps))
    return chunks


def time_to_scores(records: list, scores: Sequence[float] = SCORES, window: int = 5) -> list:
    """The training seconds and env steps (all seeds) at which the mean return of the
    last `window` updates first reached each score."""
    out, clock, steps, recent, prev = [], 0.0, 0, [], 0
    pending = sorted(scores)
    for rec in records:
        seeds = len(rec.get("episode_return_sum") or [0])
        new = (rec["env_steps"] - prev) * seeds
        prev = rec["env_steps"]
        steps += new
        clock += new / rec["sps"] if rec.get("sps") else 0.0
        if rec.get("return") is not None:
            recent = (recent + [rec["return"]])[-window:]
        while pending and recent and sum(recent) / len(recent) >= pending[0]:
            out.append({"score": pending.pop(0), "train_seconds": clock, "env_steps": steps})
    return out


_SUMMARY_KEYS = ("wall_seconds", "compile_seconds", "train_seconds", "checkpoint_seconds", "sps",
                 "total_env_steps", "num_seeds", "num_updates", "final_return", "platform", "device_kind",
                 "device_count", "peak_rss_mb", "mesh")


def figures(outcome: Outcome) -> dict:
    """The run's figures: its summary's, or for a killed run what its chunks show."""
    chunks = chunk_rates(outcome.records)
    steady = [sps for _, sps in chunks[1:]] or [sps for _, sps in chunks]
    out = {"process_seconds": outcome.process_seconds,
           "sps_steady": statistics.median(steady) if steady else None, "chunks": len(chunks)}
    if outcome.summary is not None:
        out.update({k: outcome.summary.get(k) for k in _SUMMARY_KEYS})
    elif chunks:
        seconds = sum(steps / sps for steps, sps in chunks)
        total = sum(steps for steps, _ in chunks)
        out.update({"train_seconds": seconds, "total_env_steps": total, "sps": total / seconds,
                    "num_seeds": len(outcome.records[-1].get("episode_return_sum") or [0]),
                    "num_updates": outcome.records[-1]["update"]})
    returns = [r["return"] for r in outcome.records if r.get("return") is not None]
    out["best_return"] = max(returns) if returns else None
    return out


def _median_figures(runs: list) -> dict:
    """Repeats of one case: the median of each number, the rest from the first run."""
    out = dict(runs[0])
    for key, value in runs[0].items():
        values = [r.get(key) for r in runs]
        if isinstance(value, (int, float)) and not isinstance(value, bool) and None not in values:
            out[key] = statistics.median(values)
    return out


# --- the cases ---------------------------------------------------------------------------------


def _overrides(case: Case, opts: Options) -> list:
    size = case.quick if opts.quick else case.full
    cache = [] if opts.compile_cache else ["run.compile_cache=false"]  # compile seconds of a cold start
    return [*COMMON, *cache, *case.overrides, *size.overrides]


def skip_reason(case: Case, presets: Sequence[str], machine: dict) -> Optional[str]:
    """Why `case` cannot run here (None: it can)."""
    missing = [m for m in case.needs if find_spec(m) is None]
    if missing:
        return f"needs {missing[0]}, which is not installed"
    if case.preset is not None and case.preset not in presets:
        return f"env={case.preset}: no such env preset in this version"
    if case.kind == "scaling" and "devices" not in {f.name for f in dataclasses.fields(TrainerConfig)}:
        return "trainer.devices: this version's config has no such key"
    if case.kind == "scaling" and not machine.get("device_count"):
        return "the device count is unknown (the device probe failed)"
    return None


def device_counts(total: int) -> list:
    """1, 2, 4, ... up to `total`, and `total` itself."""
    counts = [2 ** i for i in range(int(math.log2(max(1, total))) + 1)]
    return counts + ([total] if counts[-1] != total else [])


def _forced_devices(n: int) -> dict:
    """`XLA_FLAGS` with `n` host devices (read once, as JAX starts: one process each)."""
    flags = re.sub(r"--xla_force_host_platform_device_count=\S+", "", os.environ.get("XLA_FLAGS", ""))
    return {"XLA_FLAGS": f"{flags.strip()} --xla_force_host_platform_device_count={n}".strip()}


_BOUND = {"cap": "case's own cap", "budget": "suite's budget (--budget-s)"}


def _shared_device(opts: Options) -> Optional[dict]:
    """Side by side, each case takes its share of an accelerator's memory (JAX would
    take 75% of it per process)."""
    return {"XLA_PYTHON_CLIENT_MEM_FRACTION": f"{0.9 / opts.jobs:.2f}"} if opts.jobs > 1 else None


def run_single(case: Case, opts: Options, clock: Clock, size: Size) -> dict:
    """A train or score case, `opts.repeats` times (the figures: each number's median)."""
    runs, last, bound = [], None, "cap"
    for i in range(opts.repeats):
        bound = "cap" if size.cap_s <= clock.left() else "budget"
        run_dir = opts.out / "runs" / (case.name if opts.repeats == 1 else f"{case.name}-{i}")
        last = run_train(_overrides(case, opts), run_dir, min(size.cap_s, clock.left()), _shared_device(opts))
        runs.append(figures(last))
        if last.status != "ok":
            break
    result = {"status": last.status, "reason": last.reason, "figures": _median_figures(runs),
              "side_by_side": opts.jobs}
    if opts.repeats > 1:
        result["runs"] = runs
    if last.status == "killed":
        result.update(limit=bound, reason=f"{last.reason}: the {_BOUND[bound]} ran out")
    if case.kind == "score":
        result["time_to_score"] = time_to_scores(last.records)
    return result


def _with_speedup(rows: list) -> list:
    """Speed-up over the 1-device run, and efficiency = speed-up / devices."""
    base = rows[0].get("sps") if rows and rows[0]["status"] == "ok" else None
    for row in rows:
        if base and row["status"] == "ok" and row.get("sps"):
            row["speedup"] = row["sps"] / base
            row["efficiency"] = row["speedup"] / row["devices"]
    return rows


def run_scaling(case: Case, opts: Options, clock: Clock, size: Size, machine: dict) -> dict:
    """The same run at 1, 2, 4, ... all devices (`trainer.devices`), one process each."""
    rows, result = [], {"status": "ok", "reason": None}
    for n in device_counts(int(machine["device_count"])):
        bound = "cap" if size.cap_s <= clock.left() else "budget"
        env = _forced_devices(n) if machine.get("platform") == "cpu" else None
        outcome = run_train([*_overrides(case, opts), f"trainer.devices={n}"],
                            opts.out / "runs" / case.name / f"devices_{n}", min(size.cap_s, clock.left()), env)
        rows.append({"devices": n, "status": outcome.status, "reason": outcome.reason, **figures(outcome)})
        if outcome.status != "ok":
            result = {"status": outcome.status, "reason": f"{n} devices: {outcome.reason}"}
            if outcome.status == "killed":
                result.update(limit=bound, reason=f"{result['reason']}: the {_BOUND[bound]} ran out")
            break
    ok = [r for r in _with_speedup(rows) if r["status"] == "ok"]
    return {**result, "figures": dict(ok[-1]) if ok else {}, "devices": rows}


def run_case(case: Case, opts: Options, clock: Clock, presets: Sequence[str], machine: dict) -> dict:
    """One case's result; `status` ok | failed | killed | skipped, with a one-line `reason`."""
    size = case.quick if opts.quick else case.full
    base = {"case": case.name, "what": case.what, "overrides": _overrides(case, opts)}
    why = skip_reason(case, presets, machine)
    if why is None and clock.left() < size.need_s:
        why = (f"budget: {max(0.0, clock.left()):.0f} s left (of --budget-s {opts.budget_s:g}, {RESERVE_S:g} s kept "
               f"to write the outputs), the case needs at least {size.need_s:.0f} s; --resume runs it later")
        base["limit"] = "budget"
    if why is not None:
        return {**base, "status": "skipped", "reason": why}
    t0 = time.monotonic()
    if case.kind == "scaling":
        result = run_scaling(case, opts, clock, size, machine)
    else:
        result = run_single(case, opts, clock, size)
    return {**base, **result, "seconds": time.monotonic() - t0}


def done_before(result: Optional[dict]) -> bool:
    """Whether `--resume` keeps a recorded case: finished, failed, or killed after some
    chunks (their steps/s are a measurement; on a device with minutes in all, a second
    call is better spent on the cases not yet run). A case skipped, or killed before its
    first chunk, runs again."""
    if not result:
        return False
    return result["status"] in ("ok", "failed") or (
        result["status"] == "killed" and bool((result.get("figures") or {}).get("sps")))


# --- the device, and the outputs -----------------------------------------------------------------


def probe_machine(limit_s: float) -> dict:
    """`machine_info()` of a child process that starts JAX as a case would (the CLI's CPU
    flags; no GPU memory held once it exits)."""
    env = {**os.environ, "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
    try:
        out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env,
                             timeout=max(1.0, min(120.0, limit_s)))
        if out.returncode == 0:
            return json.loads(out.stdout.strip().splitlines()[-1])
        tail = (out.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": f"device probe: exit {out.returncode}: {tail[:300]}"}
    except (subprocess.TimeoutExpired, json.JSONDecodeError, IndexError) as err:
        return {"error": f"device probe: {type(err).__name__}"}


def _load_previous(opts: Options, machine: dict) -> dict:
    """The cases a `--resume` keeps; `BenchError` if the JSON was measured elsewhere or otherwise."""
    path = opts.out / JSON_FILE
    if not opts.resume or not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise BenchError(f"--resume: {path} is not JSON ({err.msg})") from None
    if data.get("quick") != opts.quick:
        raise BenchError(f"--resume: {path} holds a {'quick' if data.get('quick') else 'full'} suite; "
                         f"run the same size or use another --out")
    then, now = data.get("machine", {}), machine
    keys = ("platform", "device_kind", "device_count")
    if "error" not in now and any(then.get(k) != now.get(k) for k in keys):
        raise BenchError(f"--resume: {path} was measured on {_device(then)}, this is {_device(now)}; "
                         f"use another --out")
    return {name: r for name, r in data.get("cases", {}).items() if done_before(r)}


def _device(machine: dict) -> str:
    if "error" in machine:
        return machine["error"]
    kind = machine.get("device_kind")
    if machine.get("platform") == "cpu":  # XLA calls every CPU "cpu": the figures name the host's model
        kind = f"{machine.get('cpu_model') or kind}, {machine.get('cpu_count')} cores"
    return f"{machine.get('platform')} x{machine.get('device_count')} ({kind})"


def _num(x, digits: int = 3) -> str:
    """3 significant digits; thousands separators for large numbers; '-' for none."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    if isinstance(x, str):
        return x
    if abs(x) >= 1e6:
        return f"{x / 1e6:.{digits}g}M"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    return f"{x:.{digits}g}"


def machine_line(machine: dict) -> str:
    if "error" in machine:
        return machine["error"]
    dirty = " (library modified)" if machine.get("library_dirty") else ""
    return (f"{machine.get('platform')} x{machine.get('device_count')} ({machine.get('device_kind')}); "
            f"host {machine.get('cpu_model')}, {machine.get('cpu_count')} cores; jax "
            f"{machine.get('jax_version')}; commit {(machine.get('commit') or '-')[:10]}{dirty}, library "
            f"hash {machine.get('library_hash')}; {machine.get('date')}")


def case_rows(data: dict) -> list:
    rows = []
    for name in ORDER:
        r = data["cases"].get(name)
        if r is None:
            continue
        f = r.get("figures", {})
        startup = (f["process_seconds"] - f["wall_seconds"]) if f.get("wall_seconds") is not None else None
        rows.append([name, r["status"], _num(f.get("num_seeds")), _num(f.get("total_env_steps")),
                     _num(f.get("compile_seconds")), _num(f.get("train_seconds")), _num(f.get("wall_seconds")),
                     _num(startup), _num(f.get("sps")), _num(f.get("sps_steady")), _num(f.get("final_return"))])
    return rows


CASE_HEADERS = ("case", "status", "seeds", "env steps (all seeds)", "compile s", "train s",
                "run wall s (incl. compile)", "process start s", "env steps/s", "steady env steps/s",
                "final return")


def _measured(r: Optional[dict], measure: str) -> str:
    if not r or not r.get("figures"):
        return f"not measured ({r['reason']})" if r and r.get("reason") else "not measured"
    f = r["figures"]
    if measure == "efficiency":
        rows = [d for d in r.get("devices", []) if d.get("efficiency") is not None]
        return ", ".join(f"{d['devices']}: {d['efficiency']:.2f}" for d in rows) or "-"
    if measure == "wall":
        wall = f.get("wall_seconds")
        return f"{_num(wall)} s incl. compile ({_num(f.get('sps'))} steps/s)" if wall else "-"
    return f"{_num(f.get('sps'))} steps/s"


def anchor_rows(data: dict) -> list:
    here = _device(data["machine"])
    return [[a.system, a.task, a.figure, a.hardware, f"{a.case}: {_measured(data['cases'].get(a.case), a.measure)}",
             here] for a in ANCHORS]


def target_rows(data: dict) -> list:
    rows = []
    for t in TARGETS:
        r = data["cases"].get(t.case)
        f = (r or {}).get("figures", {})
        value = f.get("wall_seconds" if t.measure == "wall" else "sps")
        full = not data.get("quick") and r and r["status"] == "ok"
        met = "-" if value is None or not full else (
            "met" if (value <= t.value if t.measure == "wall" else value >= t.value) else "not met")
        rows.append([t.case, t.what, _measured(r, t.measure), met])
    return rows


def _jobs_note(data: dict) -> str:
    jobs = data.get("jobs", 1)
    side_by_side = [n for n, c in data["cases"].items() if n != "scaling" and c.get("status") != "skipped"]
    return "" if jobs == 1 or len(side_by_side) < 2 else (f" Cases ran {jobs} at a time (--jobs {jobs}; scaling alone), sharing the "
                                 f"host: their seconds and steps/s are smoke figures, not measurements.")


def markdown(data: dict) -> str:
    quick = " (--quick sizes)" if data.get("quick") else ""
    lines = [f"# jaxrl-dist bench{quick}", "", f"Device: {machine_line(data['machine'])}", "",
             f"Suite: {data['elapsed_s']:.0f} s of a {_num(data.get('budget_s'))} s budget." + _jobs_note(data), "",
             markdown_table(CASE_HEADERS, case_rows(data)), ""]
    notes = [f"- {n}: {r['status']}: {r['reason']}" for n in ORDER
             if (r := data["cases"].get(n)) and r.get("reason")]
    lines += notes + ([""] if notes else [])
    scaling = data["cases"].get("scaling", {}).get("devices")
    if scaling:
        lines += ["## Scaling (trainer.devices)", "", markdown_table(
            ("devices", "status", "env steps/s", "compile s", "speed-up", "efficiency"),
            [[d["devices"], d["status"], _num(d.get("sps")), _num(d.get("compile_seconds")),
              _num(d.get("speedup")), _num(d.get("efficiency"))] for d in scaling]), ""]
    pong = data["cases"].get("pong_score")
    if pong and pong.get("figures"):
        reached = pong.get("time_to_score") or []
        table = markdown_table(("score (mean of 5 updates)", "train s", "env steps"),
                               [[d["score"], _num(d["train_seconds"]), _num(d["env_steps"])] for d in reached])
        lines += ["## Pong: time to score", "", f"Best return {_num(pong['figures'].get('best_return'))}; "
                  f"scores timed: {', '.join(f'{x:g}' for x in SCORES)}.", "",
                  table if reached else "No score reached.", ""]
    lines += ["## Against published figures", ""]
    if data.get("quick"):  # a few updates of each case: set beside a published full run, they would mislead
        lines += ["Not at --quick sizes: each case ran a few updates (the table above), which says nothing "
                  "against a published run of the full size; run the suite without --quick.", ""]
    else:
        lines += [markdown_table(("system", "task", "published", "their hardware", "here (case: measured)",
                                  "this device"), anchor_rows(data)), ""]
    lines += ["## Targets on one H200 GPU", ""]
    if data["machine"].get("platform") == "gpu":
        lines += [markdown_table(("case", "target", "measured", "met"), target_rows(data)), ""]
    else:  # a CPU's figures set against a GPU's targets would only mislead
        lines += [f"Not on this device ({data['machine'].get('platform')}): run the suite on a GPU.", ""]
    if data.get("profile"):
        p = data["profile"]
        lines += ["## Profile", "", f"{p['case']}: {p['status']}; {p.get('detail', '')}", ""]
    return "\n".join(lines)


# --- figures -----------------------------------------------------------------------------------


def plots(data: dict, out: Path) -> list:
    """PNGs: env steps/s per case, where each case's seconds went, and the scaling curve."""
    title = f"jaxrl-dist bench: {_device(data['machine'])}" + (" (--quick)" if data.get("quick") else "")
    done = [(n, data["cases"][n]) for n in ORDER if n in data["cases"] and data["cases"][n].get("figures")]
    written = []
    rates = [(n, r["figures"]["sps"]) for n, r in done if r["figures"].get("sps")]
    if rates:
        fig, axes = figure(width=7, height=0.5 * len(rates) + 1.5)
        ax = axes[0, 0]
        ax.barh([n for n, _ in rates][::-1], [v for _, v in rates][::-1], color="tab:blue")
        ax.set_xscale("log")
        ax.set_xlabel("env steps/s, all seeds (training, compile excluded)")
        ax.set_title(title, fontsize=9)
        written.append(save(fig, out / "bench_sps.png", dpi=DPI))
    parts = [(n, r["figures"]) for n, r in done if r["figures"].get("wall_seconds") is not None]
    if parts:
        fig, axes = figure(width=7, height=0.5 * len(parts) + 1.5)
        ax = axes[0, 0]
        names, left = [n for n, _ in parts], [0.0] * len(parts)
        for key, label in (("start", "process start"), ("compile_seconds", "compile"),
                           ("train_seconds", "train"), ("checkpoint_seconds", "checkpoint")):
            vals = [(f["process_seconds"] - f["wall_seconds"]) if key == "start" else (f.get(key) or 0.0)
                    for _, f in parts]
            ax.barh(names, vals, left=left, label=label)
            left = [a + b for a, b in zip(left, vals)]
        ax.invert_yaxis()
        ax.set_xlabel("seconds")
        ax.legend(fontsize=8)
        ax.set_title(title, fontsize=9)
        written.append(save(fig, out / "bench_time.png", dpi=DPI))
    rows = [d for d in data["cases"].get("scaling", {}).get("devices", []) if d.get("speedup")]
    if rows:
        fig, axes = figure(width=5, height=4)
        ax = axes[0, 0]
        n = [d["devices"] for d in rows]
        ax.plot(n, [d["speedup"] for d in rows], "o-", label="measured")
        ax.plot(n, n, "--", color="gray", label="linear")
        for d in rows:
            ax.annotate(f"{d['efficiency']:.2f}", (d["devices"], d["speedup"]), fontsize=8)
        ax.set_xlabel("devices (trainer.devices)")
        ax.set_ylabel("speed-up over 1 device (efficiency marked)")
        ax.legend(fontsize=8)
        ax.set_title(title, fontsize=9)
        written.append(save(fig, out / "bench_scaling.png", dpi=DPI))
    return written


# --- the profile --------------------------------------------------------------------------------


def check_trace(trace_dir: Path) -> dict:
    """The trace's files, and whether JAX's own reader loads them (its planes and events)."""
    files = sorted(p for p in trace_dir.rglob("*") if p.is_file())
    planes = [p for p in files if p.name.endswith(".xplane.pb")]
    info = {"files": [str(p.relative_to(trace_dir)) for p in files],
            "bytes": sum(p.stat().st_size for p in files)}
    if not planes:
        return {**info, "status": "failed", "detail": "no .xplane.pb file written"}
    try:
        from jax.profiler import ProfileData  # reads the file; starts no backend

        data = ProfileData.from_file(str(planes[0]))
        names = [plane.name for plane in data.planes]
        events = sum(1 for plane in data.planes for line in plane.lines for _ in line.events)
    except Exception as err:  # noqa: BLE001  (a reader error of any kind is the finding)
        return {**info, "status": "failed", "detail": f"{planes[0].name} does not load: {err}"}
    return {**info, "status": "ok", "planes": names, "events": events,
            "detail": f"{len(files)} files, {info['bytes'] / 2**20:.1f} MiB, {events:,} events in "
                      f"{len(names)} planes; open with TensorBoard's profile plugin or ui.perfetto.dev"}


def run_profile(opts: Options, clock: Clock) -> dict:
    """`opts.profile`'s case once more, at its --quick size (a full-size trace of thousands
    of updates runs to hundreds of MB), with `run.profile_dir`; not one of the timed runs."""
    case = CASES[opts.profile]
    trace_dir = opts.out / "profile" / case.name
    if trace_dir.exists():
        shutil.rmtree(trace_dir)
    if clock.left() < case.quick.need_s:
        return {"case": case.name, "status": "skipped", "detail": f"budget: {clock.left():.0f} s left"}
    quick = opts._replace(quick=True)
    outcome = run_train([*_overrides(case, quick), f"run.profile_dir={trace_dir}"],
                        opts.out / "profile" / f"{case.name}_run", min(case.quick.cap_s * 2, clock.left()))
    if outcome.status != "ok":
        return {"case": case.name, "status": outcome.status, "detail": outcome.reason}
    return {"case": case.name, "dir": str(trace_dir), **check_trace(trace_dir)}


# --- the suite ----------------------------------------------------------------------------------


def _say(line: str) -> None:
    print(line, flush=True)


def _case_line(name: str, r: dict) -> str:
    f = r.get("figures") or {}
    if r["status"] == "skipped":
        return f"[{name}] skipped: {r['reason']}"
    head = f"[{name}] {r['status']} in {r.get('seconds', 0):.1f} s"
    figs = (f": {_num(f.get('sps'))} env steps/s, compile {_num(f.get('compile_seconds'))} s, "
            f"run wall {_num(f.get('wall_seconds'))} s") if f.get("sps") else ""
    return head + figs + (f" ({r['reason']})" if r.get("reason") else "")


def _run_cases(opts: Options, clock: Clock, presets: Sequence[str], data: dict, path: Path) -> None:
    """Every case not kept from before, in priority order, `opts.jobs` at a time (the
    scaling case last and alone: it measures devices, which a neighbour would share);
    the JSON is written as each one ends."""
    lock = threading.Lock()

    def one(name: str) -> None:
        case = CASES[name]
        what = f"{case.what}, at --quick size ({' '.join(case.quick.overrides)})" if opts.quick else case.what
        _say(f"[{name}] {what}: starting at {clock.elapsed():.0f} s")
        result = run_case(CASES[name], opts, clock, presets, data["machine"])
        with lock:
            data["cases"][name] = result
            data["elapsed_s"] = clock.elapsed()
            write_json(path, data)
            _say(_case_line(name, result))

    todo = [n for n in opts.cases if n not in data["cases"]]
    for name in opts.cases:
        if name in data["cases"]:
            _say(f"[{name}] kept from {path} (--resume): {data['cases'][name]['status']}")
    alone = [n for n in todo if CASES[n].kind == "scaling" or opts.jobs == 1]
    with ThreadPoolExecutor(max_workers=opts.jobs) as pool:
        try:
            list(pool.map(one, [n for n in todo if n not in alone]))
        except BaseException:  # Ctrl-C reaches this thread: end the children the others wait on
            stop_children()
            raise
    for name in alone:
        one(name)


def run_bench(opts: Options, presets: Sequence[str]) -> dict:
    """Run the suite; writes `bench.json` after every case, then `bench.md` and the PNGs."""
    clock = Clock(opts.budget_s)
    opts.out.mkdir(parents=True, exist_ok=True)
    machine = probe_machine(clock.left())
    _say(f"device: {machine_line(machine)}")
    data = {"quick": opts.quick, "budget_s": opts.budget_s, "jobs": opts.jobs, "machine": machine,
            "order": list(ORDER), "cases": _load_previous(opts, machine), "elapsed_s": 0.0}
    path = opts.out / JSON_FILE
    try:
        _run_cases(opts, clock, presets, data, path)
        if opts.profile:
            data["profile"] = run_profile(opts, clock)
            _say(f"[profile {opts.profile}] {data['profile']['status']}: {data['profile'].get('detail')}")
    finally:
        stop_children()  # only after an interruption is any still running
        data["elapsed_s"] = clock.elapsed()
        data["cases"] = {n: data["cases"][n] for n in ORDER if n in data["cases"]}
        write_json(path, data)
    (opts.out / MD_FILE).write_text(markdown(data))
    data["written"] = [str(p) for p in (path, opts.out / MD_FILE, *plots(data, opts.out))]
    return data
