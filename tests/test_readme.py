"""The README's library example runs as written."""
import re
from pathlib import Path

import numpy as np

README = Path(__file__).resolve().parents[1] / "README.md"


def python_blocks():
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_library_example_runs(capsys):
    blocks = python_blocks()
    assert blocks, "README has no python example"
    namespace = {}
    exec(compile(blocks[0], "README.md", "exec"), namespace)
    metrics = namespace["metrics"]
    assert metrics["return_mean"].shape == (100_000 // 512, 1)
    assert np.isfinite(np.asarray(metrics["loss"])).all()
    assert capsys.readouterr().out.strip()


def test_ci_runs_the_readme_test_command():
    commands = re.findall(r"```bash\n(python3 -m venv .*?)\n```", README.read_text())
    assert len(commands) == 2, commands  # the Quickstart's two commands
    ci = (README.parent / ".ci" / "run").read_text()
    assert commands[1] in ci.splitlines()
