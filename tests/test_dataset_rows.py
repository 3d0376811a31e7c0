NUM_GPUS = 0
"""Hostile dataset rows (components/tasks/rows.py, dataset.py): each is skipped and
counted with its row number and reason, none ends the load, and none is held whole
or tokenized when it is too long to be a prompt."""
import json

import pytest

from dynarl.components.model.spec import prompt_check
from dynarl.components.model.tokenizer import CharTokenizer, HFTokenizer
from dynarl.components.tasks.dataset import MAX_REASON, DatasetConfig, load_dataset
from dynarl.components.tasks.rows import Malformed, jsonl_rows, parse_json


def row(prompt: str = "1+1=", answer: object = "2") -> str:
    return json.dumps({"prompt": prompt, "answer": answer})


class CountingFile:
    """A binary file that records the size of every read it is asked for."""

    def __init__(self, path):
        self.file, self.reads = open(path, "rb"), []

    def readline(self, limit=-1):
        line = self.file.readline(limit)
        self.reads.append(len(line))
        return line

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.file.close()


def test_an_over_long_line_is_skipped_in_bounded_reads_and_the_next_lines_keep_their_numbers(tmp_path, monkeypatch):
    from dynarl.components.tasks import rows as rows_module
    cap = 100
    lines = [row(), row("x" * 5000), row("y" * (cap - len(row("")))), row("3+3=", "6")]
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join(lines))  # the last line without a newline
    opened = []
    monkeypatch.setattr(rows_module, "SKIP_PIECE", 50)  # the rest of a line is passed over 50 bytes at a time
    monkeypatch.setattr(rows_module, "open", lambda p, mode: opened.append(CountingFile(p)) or opened[-1],
                        raising=False)
    rows = list(jsonl_rows(str(path), cap))
    assert max(opened[0].reads) == cap + 1 and sum(opened[0].reads) == path.stat().st_size
    assert [n for n, _ in rows] == [1, 2, 3, 4]
    assert rows[1][1].reason == (f"line of {len(lines[1])} bytes, more than task.dataset.max_row_bytes ({cap}); "
                                 "not read")
    assert len(lines[2]) == cap and rows[2][1]["prompt"].startswith("y")  # exactly the cap: read
    assert rows[3][1] == {"prompt": "3+3=", "answer": "6"}


def test_an_over_long_last_line_without_a_newline_is_counted_whole(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text(row() + "\n" + row("z" * 3000))
    (_, first), (number, skipped) = jsonl_rows(str(path), 64)
    assert first["prompt"] == "1+1=" and number == 2
    assert skipped.reason.startswith(f"line of {len(row('z' * 3000))} bytes")


@pytest.mark.parametrize("line, reason", [
    pytest.param("[" * 100_000, "JSON nested too deeply to read", id="nested"),
    pytest.param('{"prompt": "1+1=", "answer": ' + "7" * 5000 + "}",
                 "JSON not readable (Exceeds the limit (4300 digits) for integer string conversion)", id="digits"),
    pytest.param("{broken", "not valid JSON (Expecting property name enclosed in double quotes)", id="broken"),
])
def test_json_the_parser_cannot_hold_is_a_reason_not_an_exception(line, reason):
    parsed = parse_json(line)
    assert isinstance(parsed, Malformed) and parsed.reason == reason


def test_hostile_rows_in_a_file_are_skipped_and_counted_and_the_rest_load(tmp_path):
    path = tmp_path / "d.jsonl"
    lines = [row(), "[" * 100_000, '{"prompt": "2+2=", "answer": ' + "7" * 5000 + "}", row("q" * 5000),
             row("3+3=", "6")]
    path.write_text("\n".join(lines) + "\n")
    data = load_dataset(DatasetConfig(path=str(path), max_row_bytes=4096))
    assert [p.prompt for p in data.problems] == ["1+1=", "3+3="]
    assert [n for n, _ in data.skipped] == [2, 3, 4]


def test_whatever_one_row_raises_skips_that_row_only(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join([row("ok="), row("boom="), row("fine=")]) + "\n")

    def check(text):
        if text == "boom=":
            raise RuntimeError("the tokenizer fell over")
        return None
    data = load_dataset(DatasetConfig(path=str(path)), check)
    assert [p.prompt for p in data.problems] == ["ok=", "fine="]
    assert data.skipped == [(2, "RuntimeError: the tokenizer fell over")]


def test_a_long_reason_is_cut(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({f"field{i}": i for i in range(1000)}) + "\n" + row() + "\n")
    (number, reason), = load_dataset(DatasetConfig(path=str(path))).skipped
    assert number == 1 and len(reason) == MAX_REASON and reason.startswith("missing field 'prompt'")


def test_arrow_rows_over_the_cap_or_not_convertible_are_skipped_alone(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq
    table = pa.table({"prompt": ["1+1=", "x" * 500, "2+2=", "3+3="], "answer": ["2", "1", "4", "6"],
                      "when": pa.array([0, 0, 2 ** 62, 0], pa.timestamp("us"))})  # no Python datetime
    pq.write_table(table, tmp_path / "d.parquet")
    data = load_dataset(DatasetConfig(path=str(tmp_path / "d.parquet"), max_row_bytes=100))
    assert [p.prompt for p in data.problems] == ["1+1=", "3+3="]
    (big, size_reason), (odd, convert_reason) = data.skipped
    assert (big, odd) == (1, 2)
    assert size_reason == "text of 501 bytes, more than task.dataset.max_row_bytes (100); not read"
    assert convert_reason.startswith("a value does not convert to Python (OverflowError")


def test_a_prompt_too_long_for_any_tokenization_is_refused_before_encoding():
    class NoEncode(CharTokenizer):
        def encode(self, text, add_bos=False):
            raise AssertionError("encoded")
    check = prompt_check(NoEncode(), 8)
    assert check("x" * 9) == ("prompt has 9 characters, more than the 8 tokens allowed can hold "
                              "(at most 1 characters a token)")
    assert prompt_check(CharTokenizer(), 8)("x" * 8) == "prompt has 9 tokens, more than the 8 allowed"  # with BOS


def test_an_hf_tokenizer_bounds_characters_by_its_longest_entry(tmp_path):
    from tokenizers import Tokenizer, models, normalizers
    vocab = {"[UNK]": 0, "a": 1, "abcdef": 2}
    hf = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    hf.save(str(tmp_path / "tokenizer.json"))
    assert HFTokenizer(tmp_path).max_chars_per_token == 6
    hf.normalizer = normalizers.NFC()  # composing: four characters may become one
    hf.save(str(tmp_path / "tokenizer.json"))
    assert HFTokenizer(tmp_path).max_chars_per_token == 24


def test_max_row_bytes_is_checked():
    with pytest.raises(ValueError, match="max_row_bytes must be an integer >= 1"):
        DatasetConfig(max_row_bytes=0)
