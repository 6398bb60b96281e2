"""The package's layers, checked from the source (ast): no import cycle, no module
importing a layer above its own, no runtime module importing the tools, and no import
of the package's own modules tucked into a function (a sign of a concept in the wrong
place), except where a module defers loading JAX or an optional dependency on purpose."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest
from package_graph import edges, modules

PKG = Path(__file__).resolve().parents[1] / "jaxrl_dist"

# lowest first; a module may import its own layer and the ones below
LAYERS = [
    ("config", "platform", "registry"),
    ("core",),
    ("envs",),
    ("backends",),
    ("scheduling",),
    ("trainers",),
    ("serve",),
    ("scheduler_training", "evaluation"),
    ("tools",),
    ("cli", "__main__"),
]
# what runs a training or serves shards; the tools (used by the CLI and bench/) sit apart
RUNTIME = ("config", "platform", "registry", "core", "envs", "backends", "scheduling", "trainers", "serve")
# where a function-local import of the package's own modules is deliberate
LAZY = {
    "jaxrl_dist": "`import jaxrl_dist` loads nothing heavy (public names resolve on first use)",
}
# the entry package imports each command's module when it runs (importlib), and a command
# defers JAX past its config checks with a few imports inside functions: at most this many
MAX_CLI_LOCAL_IMPORTS = 10


MODS = modules(PKG)


def level(mod: str) -> int:
    if mod == "jaxrl_dist":
        return len(LAYERS)  # the package's lazy exports sit above everything
    top = mod.split(".")[1]
    return next(i for i, names in enumerate(LAYERS) if top in names)


EDGES = edges(PKG)


def test_every_module_has_a_layer():
    assert all(level(m) >= 0 for m in MODS)


def test_no_import_cycle():
    graph = {m: {t for t, _ in es} for m, es in EDGES.items() if m != "jaxrl_dist"}
    state, cycles = {}, []

    def visit(m, path):
        state[m] = 1
        for t in graph.get(m, ()):
            if state.get(t) == 1:
                cycles.append(path[path.index(t):] + [t])
            elif t not in state:
                visit(t, path + [t])
        state[m] = 2

    for m in graph:
        if m not in state:
            visit(m, [m])
    assert cycles == [], cycles


def test_no_upward_import():
    up = [(m, t) for m, es in EDGES.items() for t, _ in es if level(t) > level(m)]
    assert up == [], up


def top(mod: str) -> str:
    return mod.split(".")[1] if "." in mod else mod


def test_the_runtime_never_imports_the_tools():
    """Whatever the layer order says, no runtime module imports `jaxrl_dist.tools`, not
    even inside a function: the tools may change without touching a training or a server."""
    assert set(RUNTIME) <= {top(m) for m in MODS}  # each name still a module or package
    found = sorted((m, t) for m, es in EDGES.items() for t, _ in es if top(m) in RUNTIME and top(t) == "tools")
    assert found == [], found


def entry(mod: str) -> bool:
    return mod.startswith("jaxrl_dist.cli")


def test_no_function_local_import_of_the_package():
    tucked = sorted((m, t) for m, es in EDGES.items() for t, local in es if local and m not in LAZY and not entry(m))
    assert tucked == [], tucked


def test_the_entry_package_defers_few_imports():
    tucked = [(m, t) for m, es in EDGES.items() for t, local in es if local and entry(m)]
    assert len(tucked) <= MAX_CLI_LOCAL_IMPORTS, tucked


@pytest.mark.parametrize("mod", sorted(LAZY))
def test_lazy_modules_exist(mod):
    assert mod in MODS


MAX_FUNCTION_LINES = 50


def test_no_function_over_50_lines():
    """Short functions (the design's rule): a longer one is split where its steps are."""
    long = [f"{mod}.{fn.name}: {fn.end_lineno - fn.lineno + 1} lines" for mod, path in MODS.items()
            for fn in ast.walk(ast.parse(path.read_text()))
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and fn.end_lineno - fn.lineno + 1 > MAX_FUNCTION_LINES]
    assert not long, long
