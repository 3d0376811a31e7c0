"""docs/config.md is what the generator prints from the config dataclasses now, and
it names every key a config can set."""
from __future__ import annotations

import os

from dynarl.launch.config_doc import render, sections

DOC = os.path.join(os.path.dirname(__file__), "..", "docs", "config.md")


def test_committed_file_matches_the_code():
    with open(DOC) as fh:
        committed = fh.read()
    assert committed == render(), "docs/config.md is stale: python -m dynarl.launch.config_doc > docs/config.md"


def test_every_key_is_listed_with_its_default():
    from dynarl.components.workflows.config import TrainConfig, to_dict
    text = render()

    def keys(d, path=""):
        for k, v in d.items():
            key = f"{path}.{k}" if path else k
            yield key
            if isinstance(v, dict) and not key.endswith(("server_args", "engine_args")):
                yield from keys(v, key)
    for key in keys(to_dict(TrainConfig())):
        assert f"| `{key}` |" in text, key
    rows = {k: d for _, _, rs in sections(TrainConfig, TrainConfig(), "") for k, _, d, _ in rs}
    assert rows["rollout.engine.num_blocks"] == "2048"  # the rollout's default, not the engine class's 512
    assert rows["runtime.cluster.device_memory_gb"] == "null"
    assert rows["rollout.sglang"] == "null" and rows["rollout.sglang.tp_size"] == "1"


def test_meaning_is_the_field_docstring():
    text = render()
    line = next(l for l in text.splitlines() if l.startswith("| `memory.prompt_tokens` |"))
    assert "Prompt length the plan assumes" in line and "| `int` | `1024` |" in line
