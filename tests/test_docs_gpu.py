"""docs/gpu.md stays true: its memory table is what the dry run prints now, and the
commands it names exist with the flags it gives."""
import pathlib
import re

from dynarl.launch import cli, doctor
from dynarl.launch.train import main as train_main

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOC = (ROOT / "docs" / "gpu.md").read_text()


def test_the_8xh100_memory_table_is_the_dry_runs(capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    assert train_main(["examples/grpo_qwen2.5_7b_8xh100.yaml", "--dry-run"]) == 0
    printed = capsys.readouterr().out.splitlines()
    start = printed.index(next(line for line in printed if line.startswith("device   peak GB")))
    table = [line.strip() for line in printed[start:start + 9]]
    in_doc = [line.strip() for line in DOC.splitlines() if re.match(r"\s+(device   peak GB|gpu\d\s)", line)]
    assert in_doc == table


def test_the_commands_it_names_exist():
    assert "doctor" in cli.COMMANDS
    for part in re.findall(r"- `(\w+)`", DOC.split("## The first check")[1].split("##")[0]):
        assert part in doctor.PARTS, part
    assert doctor.main(["--wheels"]) == 0  # the offline node's command the page gives
