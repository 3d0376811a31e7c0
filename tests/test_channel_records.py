NUM_GPUS = 0
"""A user's dataclass on a channel: refused with a message that says how to register
it (`dynarl.register_struct`, exported), and once registered it crosses between
workers and the controller as itself (docs/architecture.md's example, run as a script)."""

import pathlib
import re
import subprocess
import sys
from dataclasses import dataclass

import pytest

import dynarl
from dynarl.transport import wire
from dynarl.transport.wire import encode_blob

DOC = pathlib.Path(__file__).resolve().parents[1] / "docs" / "architecture.md"


def test_register_struct_is_exported():
    assert dynarl.register_struct is wire.register_struct and "register_struct" in dynarl.__all__


@dataclass
class Unregistered:
    x: int


class Plain:
    pass


@pytest.mark.parametrize("value,fragments", [
    pytest.param(Unregistered(1), ["cannot send a test_channel_records.Unregistered over the wire: a dataclass "
                                   "crosses once registered: decorate it with @dynarl.register_struct(CODE) "
                                   "above @dataclass, CODE a number in 100..127"], id="dataclass"),
    pytest.param(Plain(), ["cannot send a test_channel_records.Plain over the wire: send plain data",
                           "@dynarl.register_struct(CODE)"], id="other"),
])
def test_an_unsendable_value_is_refused_saying_how_to_send_it(value, fragments):
    with pytest.raises(TypeError) as info:
        encode_blob({"batch": value})
    for fragment in fragments:
        assert fragment in str(info.value)


def test_a_script_is_named_as_main_not_as_the_workers_import():
    cls = type("Batch", (), {"__module__": "__dynarl_main__"})
    assert wire.unsendable(cls).startswith("cannot send a __main__.Batch over the wire")


def test_the_docs_channel_example_runs_as_a_script(tmp_path):
    section = DOC.read_text().split("## Channels and records")[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    script = tmp_path / "channels.py"
    script.write_text(code)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == ("[Batch(ids=[0, 1], reward=0.0), Batch(ids=[1, 2], reward=0.5), "
                                  "Batch(ids=[2, 3], reward=1.0), Batch(ids=[3, 4], reward=1.5)]")
    # without the registration the producer's put is refused, saying how to fix it
    script.write_text(code.replace("@dynarl.register_struct(100)", ""))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 1
    assert "cannot send a __main__.Batch over the wire: a dataclass crosses once registered" in out.stderr
