"""Whether two models read the same token ids (a teacher or a critic beside the policy):
the same vocabulary size and the same tokenizer, judged by what encodes their text."""
from __future__ import annotations

import json
import os
from typing import Any

from dynarl.components.model.tokenizer import CHAR_TOKENIZER_FILE, DEFAULT_ALPHABET
from dynarl.transport.errors import ConfigError

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt", "tokenizer.model")


def same_tokens(model: Any, other: Any, field_: str, why: str) -> None:
    """`other` (a ModelSpec) reads `model`'s token ids: the same vocabulary and tokenizer."""
    mine, theirs = model.config().vocab_size, other.config().vocab_size
    if mine != theirs or tokenizer_key(other) != tokenizer_key(model):
        raise ConfigError(field_, f"{why}: its tokenizer must be the policy's (vocab {theirs} vs the policy's "
                                  f"{mine}, or other tokenizer files)")


def tokenizer_key(spec: Any) -> tuple:
    """What encodes a spec's text: a character tokenizer's alphabet (a built-in model's,
    or the char_tokenizer.json `dynarl export` writes for one), else its tokenizer files."""
    if spec.path is None:
        return ("char", DEFAULT_ALPHABET)
    files = tokenizer_files(spec.path)
    char = os.path.join(spec.path, CHAR_TOKENIZER_FILE)
    if not files and os.path.isfile(char):
        with open(char) as f:
            return ("char", json.load(f).get("alphabet"))
    return ("files", files)


def tokenizer_files(folder: str) -> dict[str, bytes]:
    """The tokenizer files of an HF folder, by name (two tokenizers with the same files
    encode alike)."""
    out = {}
    for name in TOKENIZER_FILES:
        path = os.path.join(folder, name)
        if os.path.isfile(path):
            with open(path, "rb") as f:
                out[name] = f.read()
    return out
