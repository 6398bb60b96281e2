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


def test_a_config_in_code_starts_from_the_dataclasses_and_load_config_from_the_clis():
    """As the README says: `Config()` trains fused with no preset applied, while
    `load_config` is what the CLI trains on the same overrides (sync, the env's preset)."""
    import jaxrl_dist

    mine = jaxrl_dist.from_dict({"env": {"id": "Acrobot-v1"}})
    assert (mine.trainer.name, mine.run.target_return) == ("fused", None)
    cli = jaxrl_dist.load_config(["env.id=Acrobot-v1", "algo.lr=3e-4"])
    assert (cli.trainer.name, cli.scheduler.name, cli.run.target_return, cli.algo.lr) == \
        ("sync", "learned", -100.0, 3e-4)


def test_ci_runs_the_readme_test_command():
    commands = re.findall(r"```bash\n(python3 -m venv .*?)\n```", README.read_text())
    assert len(commands) == 2, commands  # the Quickstart's two commands
    ci = (README.parent / ".ci" / "run").read_text()
    assert commands[1] in ci.splitlines()


def test_readme_one_file_experiment_registers_a_loss_and_trains(tmp_path, monkeypatch):
    """The Extending section's registry example: a loss of the caller's, chosen by name."""
    from jaxrl_dist.core.ppo import LOSSES

    block = next(b for b in python_blocks() if "LOSSES.register" in b)
    monkeypatch.chdir(tmp_path)  # the run goes to outputs/DATE/TIME
    namespace = {}
    try:
        exec(compile(block, "README.md", "exec"), namespace)
    finally:
        LOSSES._builtin.pop("halved_entropy", None)
    summary = namespace["summary"]
    assert summary.env_steps == 20_000 // 512 * 512 and summary.final_return is not None
    saved = (Path(summary.run_dir) / "config.yaml").read_text()
    assert "loss: halved_entropy" in saved and Path(summary.run_dir).is_relative_to(tmp_path / "outputs")
