NUM_GPUS = 0

import pathlib
import re
import shlex
import subprocess
import sys

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def test_embedding_example_runs_as_a_script(tmp_path):
    """Run as a user would: the Worker class lives in the script's __main__."""
    code = re.search(r"```python\n(.*?)```", README.read_text(), re.S).group(1)
    script = tmp_path / "example.py"
    script.write_text(code)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[11, 12]"
    assert "rejected" not in out.stderr  # the workers' normal close is not a rejected connection


def test_readme_has_exactly_the_two_setup_commands_and_ci_runs_the_test_one():
    text = README.read_text()
    commands = [line.strip() for line in text.splitlines() if line.startswith("    pip install")]
    assert len(commands) == 2
    assert commands[0].endswith("dynarl train")
    ci = (README.parent / ".ci" / "run").read_text()
    assert commands[1] in ci
    assert shlex.split(commands[1])[:3] == ["pip", "install", "torch==2.13.0"]
