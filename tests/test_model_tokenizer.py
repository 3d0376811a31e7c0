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
