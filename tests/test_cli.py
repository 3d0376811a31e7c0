NUM_GPUS = 0
"""The `dynarl` command line itself."""

import pytest


def test_the_command_line_help_lists_the_commands_and_a_bench_shows_its_own_options(capsys):
    from dynarl.launch.cli import COMMANDS, main
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert all(f"  {name} " in out for name in COMMANDS)
    with pytest.raises(SystemExit) as exited:
        main(["bench", "transport", "--help"])
    assert exited.value.code == 0 and "--no-ray" in capsys.readouterr().out
