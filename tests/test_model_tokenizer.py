NUM_GPUS = 0

import json

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

from dynarl.components.model.config import TINY_CONFIGS
from dynarl.components.model.tokenizer import CharTokenizer, HFTokenizer, load_tokenizer


@pytest.mark.parametrize("text", ["", "12+34=46", "Hello, world!\n\tx"])
def test_char_round_trip(text):
    tok = CharTokenizer()
    ids = tok.encode(text, add_bos=True)
    assert ids[0] == tok.bos_id and all(i >= 3 for i in ids[1:])
    assert tok.decode(ids + [tok.eos_id, tok.pad_id]) == text
    assert tok.decode([tok.bos_id, *ids[1:], tok.eos_id], skip_special=False) == f"<bos>{text}<eos>"


def test_char_vocab_fits_tiny_models():
    assert all(CharTokenizer().vocab_size <= c.vocab_size for c in TINY_CONFIGS.values())


def test_char_rejects_unknown_characters_and_bad_alphabets():
    with pytest.raises(ValueError, match="'é'"):
        CharTokenizer().encode("café")
    with pytest.raises(ValueError, match="repeat"):
        CharTokenizer("aba")


def test_load_tokenizer_picks_the_folder_kind(tmp_path):
    CharTokenizer("0123456789+=").save(tmp_path / "char")
    tok = load_tokenizer(tmp_path / "char")
    assert isinstance(tok, CharTokenizer) and tok.encode("1+1=2") == [4, 13, 4, 14, 5]

    vocab = {"<|endoftext|>": 0, "<|im_start|>": 1, "<|im_end|>": 2, "hello": 3, "world": 4, "[UNK]": 5}
    hf = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    hf.pre_tokenizer = pre_tokenizers.Whitespace()
    hf.add_special_tokens(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    (tmp_path / "hf").mkdir()
    hf.save(str(tmp_path / "hf" / "tokenizer.json"))
    (tmp_path / "hf" / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>", "pad_token": None}))
    tok = load_tokenizer(tmp_path / "hf")
    assert isinstance(tok, HFTokenizer)
    assert (tok.bos_id, tok.eos_id, tok.pad_id, tok.vocab_size) == (1, 2, 0, 6)
    assert tok.encode("hello world", add_bos=True) == [1, 3, 4]
    assert tok.decode([1, 3, 4, 2]) == "hello world"

    with pytest.raises(FileNotFoundError):
        load_tokenizer(tmp_path)


QWEN_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
"""Qwen2.5's chat template, less its default system prompt and tools."""


def test_a_chat_template_formats_the_prompt_and_no_second_bos_is_added(tmp_path):
    from dynarl.components.tasks.dataset import DatasetConfig, load_dataset
    vocab = {"<|endoftext|>": 0, "<|im_start|>": 1, "<|im_end|>": 2, "user": 3, "assistant": 4, "hello": 5,
             "[UNK]": 6}
    hf = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    hf.pre_tokenizer = pre_tokenizers.Whitespace()
    hf.add_special_tokens(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    hf.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>", "bos_token": "<|im_start|>",
                                                                "chat_template": QWEN_TEMPLATE}))
    tok = load_tokenizer(tmp_path)
    text = tok.chat("hello")
    assert text == "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n"
    assert tok.encode(text, add_bos=True) == [1, 3, 5, 2, 1, 4]  # the template's own <|im_start|> only
    assert tok.encode("hello", add_bos=True) == [1, 5]
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"prompt": "hello", "answer": "1"}) + "\n")
    problems = load_dataset(DatasetConfig(path=str(rows), chat=True), chat=tok.chat).problems
    assert [p.prompt for p in problems] == [text]
    with pytest.raises(ValueError, match="no chat template"):
        load_dataset(DatasetConfig(path=str(rows), chat=True))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>"}))
    (tmp_path / "chat_template.jinja").write_text(QWEN_TEMPLATE)  # where transformers 5 saves it
    assert load_tokenizer(tmp_path).chat("hello") == text
