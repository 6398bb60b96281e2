"""The package's layers, checked from the source (ast): no import cycle, no module
importing a layer above its own, no runtime module importing the tools, and no import
of the package's own modules tucked into a function (a sign of a concept in the wrong
place), except where a module defers loading JAX or an optional dependency on purpose."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

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


def modules() -> dict:
    out = {}
    for f in PKG.rglob("*.py"):
        rel = f.relative_to(PKG.parent).with_suffix("")
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        out[".".join(parts)] = f
    return out


MODS = modules()


def level(mod: str) -> int:
    if mod == "jaxrl_dist":
        return len(LAYERS)  # the package's lazy exports sit above everything
    top = mod.split(".")[1]
    return next(i for i, names in enumerate(LAYERS) if top in names)


def targets(mod: str, node) -> list:
    """The package modules an import statement loads."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        base = node.module or ""
        if node.level:
            here = mod.split(".") if MODS[mod].name == "__init__.py" else mod.split(".")[:-1]
            base = ".".join(here[: len(here) - node.level + 1] + ([base] if base else []))
        names = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODS else base for a in node.names]
    return [n for n in names if n in MODS]


def edges() -> dict:
    """`{module: {(target, local)}}`: `local` for an import inside a function."""
    out = {}
    for mod, path in MODS.items():
        tree = ast.parse(path.read_text())
        local = {id(n) for fn in ast.walk(tree) if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
                 for n in ast.walk(fn)}
        out[mod] = {(t, id(node) in local) for node in ast.walk(tree)
                    if isinstance(node, (ast.Import, ast.ImportFrom)) for t in targets(mod, node) if t != mod}
    return out


EDGES = edges()


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
