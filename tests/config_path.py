"""Where the run config travels: from the Hydra job into a sync run and into a fused run.

Runs `jaxrl-dist train` in this process (a tiny CartPole run of each trainer) under
`sys.setprofile` and follows the config: every call and return of a package function
that holds the run config (the `Config` dataclass, or Hydra's `DictConfig` before it
is checked) as an argument. That gives the sequence of modules the config is in, and
from it two figures per trainer:

- modules crossed: how many package modules the config passes through;
- climbs: how often it goes back up to a module that sits higher in the package's
  import order (a module's height is the longest chain of package imports below it,
  read from the source, `package_graph`), as when a caller gets it back and hands it down
  again: the back and forth a reader follows across files.

`--src DIR` measures another checkout (its `jaxrl_dist` comes first on the path), so
two revisions compare side by side:

    git worktree add /tmp/before REV
    python tests/config_path.py --src /tmp/before --out bench/results/config_path_before.json
    python tests/config_path.py --out bench/results/config_path.json
"""
from __future__ import annotations

import argparse
import functools
import json
import sys
import tempfile
import threading
from pathlib import Path

from package_graph import edges

TINY = ["env.num_envs=4", "algo.num_steps=32", "algo.minibatch_size=64", "algo.total_timesteps=512", "run.progress=false",
        "run.tensorboard=false", "run.compile_cache=false"]
RUNS = {"sync": ["trainer=sync", "scheduler=fixed", "scheduler.num_shards=2", "backend.envs_per_shard=2"],
        "fused": ["trainer=fused"]}


def heights(pkg: Path) -> dict:
    """Each module's height: 0 for one importing no package module, else one more than
    the highest module it imports."""
    deps = {m: {t for t, local in e if not local} for m, e in edges(pkg).items()}

    @functools.lru_cache(maxsize=None)
    def height(m: str, seen: frozenset = frozenset()) -> int:
        below = [height(d, seen | {m}) for d in deps[m] if d not in seen and d != "jaxrl_dist"]
        return 1 + max(below) if below else 0

    return {m: height(m) for m in deps}


# the package's layers, lowest first (DESIGN.md; `tests/test_layers.py` holds them), with
# the top-level modules that earlier revisions had where `tools/` and `serve/` are now
LAYER_OF = {"config": 0, "platform": 0, "registry": 0, "core": 1, "envs": 2, "backends": 3, "scheduling": 4,
            "trainers": 5, "serve": 6, "serve_protocol": 6, "serve_worker": 6, "scheduler_training": 7,
            "evaluation": 7, "tools": 8, "benchmark": 8, "report": 8, "sweep_report": 8, "calibrate": 8,
            "cli": 9, "__main__": 9}


def layer(mod: str) -> int:
    parts = mod.split(".")
    return LAYER_OF.get(parts[1], 8) if len(parts) > 1 else 10


def follow(overrides: list) -> tuple:
    """The modules the config is in, in order (consecutive repeats collapsed)."""
    from omegaconf import DictConfig

    from jaxrl_dist.cli import main
    from jaxrl_dist.config import Config

    trail: list = []
    calls: list = []  # `module.function` of each call, for a reader of the JSON

    def holds_config(frame) -> bool:
        return any(isinstance(v, (Config, DictConfig)) for v in frame.f_locals.values())

    def profile(frame, event, arg):
        if event not in ("call", "return"):
            return
        mod, name = frame.f_globals.get("__name__", ""), frame.f_code.co_name
        # a dataclass's generated methods (`dataclasses.replace` builds a new config: its
        # `__init__`, compiled from a string) are no code a reader follows
        generated = frame.f_code.co_filename == "<string>" or name == "<module>"
        if generated or not mod.startswith("jaxrl_dist") or not holds_config(frame):
            return
        if event == "call":
            calls.append(f"{mod}.{name}")
        else:  # back in the caller, if it holds the config too
            caller = frame.f_back
            mod = caller.f_globals.get("__name__", "") if caller else ""
            if not (mod.startswith("jaxrl_dist") and holds_config(caller)):
                return
        if not trail or trail[-1] != mod:
            trail.append(mod)

    sys.setprofile(profile)
    threading.setprofile(profile)  # the round trainer runs its rounds in a helper thread
    try:
        main(["train", *overrides])
    except SystemExit:
        pass
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
    return trail, calls


def figures(followed: tuple, height: dict) -> dict:
    trail, calls = followed
    climbs = sum(height.get(b, 0) > height.get(a, 0) for a, b in zip(trail, trail[1:]))
    layers = [layer(m) for m in trail]
    layer_climbs = sum(b > a for a, b in zip(layers, layers[1:]))
    return {"modules_crossed": len(set(trail)), "layer_climbs": layer_climbs, "module_climbs": climbs,
            "visits": len(trail), "trail": trail, "calls": calls}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--src", type=Path, help="a checkout whose jaxrl_dist to measure (default: this one)")
    ap.add_argument("--out", type=Path, help="write the figures here (JSON)")
    args = ap.parse_args()
    if args.src:
        sys.path.insert(0, str(args.src.resolve()))
    import jaxrl_dist

    pkg = Path(jaxrl_dist.__file__).parent
    height = heights(pkg)
    out = {"package": str(pkg)}
    for name, extra in RUNS.items():
        with tempfile.TemporaryDirectory() as tmp:
            out[name] = figures(follow([*extra, *TINY, f"hydra.run.dir={tmp}/run"]), height)
        f = out[name]
        print(f"{name}: {f['modules_crossed']} modules crossed, {f['layer_climbs']} climbs back up a layer "
              f"({f['module_climbs']} up the import order), {f['visits']} visits", flush=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
