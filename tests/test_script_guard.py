NUM_GPUS = 0
"""The package docstring's example (what `help(dynarl)` shows) runs as a script, and a
script that starts its job outside `if __name__ == "__main__":` fails with
MainGuardMissing naming the script (workers import the script to find its classes)."""

import subprocess
import sys
import textwrap

import pytest

import dynarl


def docstring_example() -> str:
    """The indented block of dynarl.__doc__."""
    lines = dynarl.__doc__.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("    "))
    end = next(i for i in range(start, len(lines)) if lines[i] and not lines[i].startswith("    "))
    return textwrap.dedent("\n".join(lines[start:end]))


def run_script(path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=300)


def test_the_docstring_example_runs_as_a_script(tmp_path):
    script = tmp_path / "example.py"
    script.write_text(docstring_example())
    out = run_script(script)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[1, 1]"
    assert out.stderr == ""


@pytest.mark.parametrize("start,what", [
    pytest.param('print(dynarl.run(workflow, dynarl.RuntimeConfig(launcher="local")))', "dynarl.run()", id="run"),
    pytest.param("import asyncio\n\nasync def main():\n"
                 '    async with dynarl.Controller(dynarl.RuntimeConfig(launcher="local")) as ctl:\n'
                 "        return await workflow(ctl)\n\nprint(asyncio.run(main()))", "asyncio.run()", id="asyncio"),
])
def test_a_script_without_the_guard_is_told_where_to_put_it(tmp_path, start, what):
    code = docstring_example().split('if __name__ == "__main__":')[0] + start + "\n"
    script = tmp_path / "unguarded.py"
    script.write_text(code)
    out = run_script(script)
    assert out.returncode == 1
    last = out.stderr.strip().splitlines()[-1]
    assert last == (f"dynarl.core.script_guard.MainGuardMissing: {script} called {what} at its top level, which "
                    "runs again when a worker process imports the script to find its Worker class: put the code "
                    'that starts the job under `if __name__ == "__main__":`'), out.stderr[-2000:]
