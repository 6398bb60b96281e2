"""The file helpers the tools and the benchmarks (`bench/`) share, written once: JSON out
(`write_json`), a markdown table (`markdown_table`) and the records of a JSONL file in
(`read_jsonl`, with the one rule for a cut-off last line: the run logger's own, which a
resumed run reads its history with)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

from jaxrl_dist.trainers.logger import read_jsonl


def _plain(value):
    """What `json` cannot write by itself: numpy and JAX scalars and arrays as Python
    numbers and lists; a record with `to_json` (a run's `RunSummary`) as its mapping;
    anything else numeric as a float (else `TypeError`)."""
    if hasattr(value, "tolist"):
        return value.tolist()
    if hasattr(value, "to_json"):
        return value.to_json()
    return float(value)


def write_json(path, data) -> Path:
    """`data` as indented JSON at `path`, its folder made if need be. Written to a
    temporary file beside it, then renamed: a process killed mid-write (a suite stopped
    at its budget) leaves the previous file whole. Returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=_plain) + "\n")
    tmp.replace(path)
    return path


def markdown_table(headers: Sequence, rows: Sequence[Sequence]) -> str:
    """A GitHub markdown table (no trailing newline); cells are written with `str`."""
    lines = ["| " + " | ".join(str(h) for h in headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


__all__ = ["write_json", "markdown_table", "read_jsonl"]
