"""The package's modules and their imports, read from the source (ast), for the layer
tests and the config-path measurement (`tests/config_path.py`)."""
from __future__ import annotations

import ast
from pathlib import Path


def modules(pkg: Path) -> dict:
    """`{dotted module name: file}` of every module under the package folder `pkg`."""
    out = {}
    for f in pkg.rglob("*.py"):
        rel = f.relative_to(pkg.parent).with_suffix("")
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        out[".".join(parts)] = f
    return out


def targets(mods: dict, mod: str, node) -> list:
    """The package modules an import statement of `mod` loads."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        base = node.module or ""
        if node.level:
            here = mod.split(".") if mods[mod].name == "__init__.py" else mod.split(".")[:-1]
            base = ".".join(here[: len(here) - node.level + 1] + ([base] if base else []))
        names = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
    return [n for n in names if n in mods]


def edges(pkg: Path) -> dict:
    """`{module: {(target, local)}}`: `local` for an import inside a function."""
    mods = modules(pkg)
    out = {}
    for mod, path in mods.items():
        tree = ast.parse(path.read_text())
        local = {id(n) for fn in ast.walk(tree) if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
                 for n in ast.walk(fn)}
        out[mod] = {(t, id(node) in local) for node in ast.walk(tree)
                    if isinstance(node, (ast.Import, ast.ImportFrom)) for t in targets(mods, mod, node) if t != mod}
    return out
