"""Dataset presets (task.dataset.preset): the fields, template and reference-answer
extraction of GSM8K and MATH in one word; rows that do not fit are skipped with the
true reason."""
import json

import pytest

from dynarl.components.tasks.dataset import DatasetConfig, last_boxed, load_dataset, missing_field, reference_answer


@pytest.mark.parametrize("text, extract, answer", [
    ("Natalia sold 48/2 = 24 clips in May.\n#### 72", "gsm8k", "72"),
    ("so the total is 1,234 dollars\n#### 1,234", "gsm8k", "1234"),
    ("a #### b #### 5", "gsm8k", "5"),  # the last marker
    ("no marker, just 42", "gsm8k", None),
    ("#### ", "gsm8k", None),
    (r"So $x = \boxed{\frac{1}{2}}$.", "boxed", r"\frac{1}{2}"),
    (r"first \boxed{3} then \boxed{x^{2}+1}", "boxed", "x^{2}+1"),
    (r"\boxed{unclosed", "boxed", None),
    ("no box at all", "boxed", None),
    ("  kept as it is ", "none", "  kept as it is "),
])
def test_reference_answers(text, extract, answer):
    assert reference_answer(text, extract) == answer


def test_last_boxed_takes_nested_braces_whole():
    assert last_boxed(r"\boxed{\sqrt{\frac{a}{b}}}") == r"\sqrt{\frac{a}{b}}"


def test_presets_fill_only_what_is_left_at_its_default():
    gsm = DatasetConfig(preset="gsm8k")
    assert (gsm.prompt_field, gsm.answer_field, gsm.extract) == ("question", "answer", "gsm8k")
    assert gsm.template.startswith("{prompt}\n")
    mine = DatasetConfig(preset="math", prompt_field="q", template="Q: {prompt}")
    assert (mine.prompt_field, mine.answer_field, mine.template, mine.extract) == ("q", "solution", "Q: {prompt}", "boxed")
    assert DatasetConfig().extract == "none"


def test_a_missing_field_names_the_fields_the_row_has_and_the_preset_that_fits():
    assert missing_field("prompt", {"question": "q", "answer": "a"}) == (
        "missing field 'prompt' (the row has: question, answer; task.dataset.preset=gsm8k reads these rows)")
    assert missing_field("prompt", {"text": "t"}) == "missing field 'prompt' (the row has: text)"


def test_a_gsm8k_file_loads_with_the_preset_and_bad_rows_say_why(tmp_path):
    rows = [{"question": f"What is {i} + {i}?", "answer": f"{i} + {i} = {2 * i}\n#### {2 * i}"} for i in range(20)]
    lines = [json.dumps(r) for r in rows]
    lines[3] = json.dumps({"question": "No marker?", "answer": "it is 5"})
    lines[5] = json.dumps({"prompt": "wrong fields", "answer": "1"})
    path = tmp_path / "gsm8k.jsonl"
    raw = "\n".join(lines).encode() + b'\n{"question": "caf\xe9", "answer": "#### 1"}\n'  # latin-1, not UTF-8
    path.write_bytes(raw)
    data = load_dataset(DatasetConfig(path=str(path), preset="gsm8k"))
    assert len(data.problems) == 18
    assert data.problems[0].answer == "0" and data.problems[-1].answer == "38"
    assert data.problems[0].prompt.startswith("What is 0 + 0?\n")
    reasons = dict(data.skipped)
    assert reasons[4] == "unparsable answer: no '#### <answer>' in field 'answer'"
    assert reasons[6].startswith("missing field 'question' (the row has: prompt, answer")
    assert reasons[21] == "not valid UTF-8 (byte 0xe9 at column 18)"


def test_a_datasets_save_to_disk_folder_and_a_split_of_a_dataset_dict(tmp_path):
    datasets = pytest.importorskip("datasets")
    rows = [{"question": f"q{i}", "answer": f"so\n#### {i}"} for i in range(5)]
    one = datasets.Dataset.from_list(rows)
    one.save_to_disk(str(tmp_path / "one"))
    datasets.DatasetDict({"train": one, "test": datasets.Dataset.from_list(rows[:2])}).save_to_disk(str(tmp_path / "dict"))
    data = load_dataset(DatasetConfig(path=str(tmp_path / "one"), preset="gsm8k"))
    assert [p.answer for p in data.problems] == ["0", "1", "2", "3", "4"]
    test = load_dataset(DatasetConfig(path=str(tmp_path / "dict"), preset="gsm8k", split="test"))
    assert [p.answer for p in test.problems] == ["0", "1"]
    with pytest.raises(ValueError, match="has the splits train, test, not 'validation'"):
        load_dataset(DatasetConfig(path=str(tmp_path / "dict"), preset="gsm8k", split="validation"))
    with pytest.raises(ValueError, match="not a datasets save_to_disk folder"):
        load_dataset(DatasetConfig(path=str(tmp_path), preset="gsm8k"))
