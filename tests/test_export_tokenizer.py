NUM_GPUS = 0
"""`dynarl export` copies the source folder's tokenizer with its chat template, also where
newer transformers keep it (chat_template.jinja beside tokenizer_config.json)."""

import json

from dynarl.components.model.tokenizer import load_tokenizer
from dynarl.launch.export import copy_tokenizer_files
from qwen_tokenizer import QWEN25_TEMPLATE, write_qwen_tokenizer


def test_the_chat_template_file_goes_with_the_tokenizer(tmp_path):
    source = write_qwen_tokenizer(tmp_path / "source")
    config = json.loads((source / "tokenizer_config.json").read_text())
    (source / "chat_template.jinja").write_text(config.pop("chat_template"))
    (source / "tokenizer_config.json").write_text(json.dumps(config))
    (source / "model.safetensors").write_bytes(b"weights: not a tokenizer file")
    out = tmp_path / "out"
    out.mkdir()
    copied = copy_tokenizer_files(str(source), str(out))
    assert sorted(copied) == ["chat_template.jinja", "tokenizer.json", "tokenizer_config.json"]
    assert sorted(p.name for p in out.iterdir()) == sorted(copied)
    assert load_tokenizer(out).chat_template == QWEN25_TEMPLATE
    from transformers import AutoTokenizer
    assert AutoTokenizer.from_pretrained(str(out)).chat_template == QWEN25_TEMPLATE
