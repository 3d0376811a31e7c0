NUM_GPUS = 0
"""`dynarl eval`'s defaults: held-out rows (never a dataset run's training rows unless
asked) and one greedy sample per problem unless told; it says which it uses."""

import json

import pytest

from dynarl.components.tasks.dataset import DatasetConfig
from dynarl.launch.eval import evaluate, held_out, sampling

TRAIN = DatasetConfig(path="train.jsonl")


@pytest.mark.parametrize("dataset,given,train_rows,splits,path,split,what", [
    pytest.param(TRAIN, True, False, None, "train.jsonl", "train", "the rows given, train.jsonl", id="given"),
    pytest.param(TRAIN, False, True, None, "train.jsonl", "train", "the training rows of train.jsonl (--train-rows)",
                 id="train-rows"),
    pytest.param(DatasetConfig(path="train.jsonl", eval_path="test.jsonl"), False, False, None, "test.jsonl", "test",
                 "held-out rows, test.jsonl (task.dataset.eval_path)", id="eval-path"),
    pytest.param(DatasetConfig(path="gsm8k"), False, False, ["train", "test"], "gsm8k", "test",
                 "held-out split 'test' of gsm8k", id="test-split"),
    pytest.param(DatasetConfig(path="gsm8k", eval_split="validation"), False, False, ["train", "validation"], "gsm8k",
                 "validation", "held-out split 'validation' of gsm8k", id="named-split"),
])
def test_the_rows_evaluated(dataset, given, train_rows, splits, path, split, what):
    rows, said = held_out(dataset, given=given, train_rows=train_rows, splits=splits)
    assert (rows.path, rows.split, said) == (path, split, what)


@pytest.mark.parametrize("dataset,splits", [
    pytest.param(TRAIN, None, id="one-file"),
    pytest.param(DatasetConfig(path="gsm8k"), ["train"], id="no-test-split"),
    pytest.param(DatasetConfig(path="gsm8k", split="test"), ["train", "test"], id="trains-on-test"),
])
def test_a_run_with_no_held_out_rows_is_refused(dataset, splits):
    with pytest.raises(ValueError, match="none is held out: name held-out rows .*--train-rows"):
        held_out(dataset, given=False, train_rows=False, splits=splits)


@pytest.mark.parametrize("samples,told,configured,temperature,how", [
    (1, None, 1.0, 0.0, "greedy (temperature 0; --temperature T to sample)"),
    (1, 0.7, 1.0, 0.7, "temperature 0.7 (given)"),
    (4, None, 1.0, 1.0, "temperature 1 (rollout.temperature: --samples 4 needs distinct samples)"),
    (4, 0.0, 1.0, 0.0, "temperature 0 (given)"),
])
def test_the_sampling(samples, told, configured, temperature, how):
    assert sampling(samples, told, configured) == (temperature, how)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """The built-in tiny model (random weights) as an HF folder, and count-up rows."""
    from dynarl.components.model.io import save_pretrained
    from dynarl.components.model.spec import ModelSpec, build_model, build_tokenizer
    out = tmp_path_factory.mktemp("eval")
    save_pretrained(build_model(ModelSpec()), out / "model")
    build_tokenizer(ModelSpec()).save(out / "model")
    for name, rows in (("train.jsonl", ["d>f:", "a>c:"]), ("test.jsonl", ["k>n:", "p>s:", "b>d:"])):
        (out / name).write_text("".join(json.dumps({"prompt": p, "answer": "x"}) + "\n" for p in rows))
    return out


def test_eval_says_what_it_reads_and_samples_greedily_by_default(folder):
    said = []
    result = evaluate(str(folder / "model"), [("task.kind", "dataset"), ("task.dataset.path", str(folder / "train.jsonl")),
                                              ("task.dataset.eval_path", str(folder / "test.jsonl"))], say=said.append)
    assert result["temperature"] == 0.0 and result["problems"] == 3  # the held-out rows
    assert said == [f"evaluating {folder / 'model'} on held-out rows, {folder / 'test.jsonl'} "
                    "(task.dataset.eval_path) (3 rows loaded, 0 skipped), 1 sample(s) each, "
                    "greedy (temperature 0; --temperature T to sample)"]
    told = evaluate(str(folder / "model"), [("task.kind", "dataset"), ("task.dataset.path", str(folder / "train.jsonl")),
                                            ("rollout.temperature", 0.5)], say=said.append)
    assert told["temperature"] == 0.5 and told["problems"] == 2  # the rows given
    assert said[-1].endswith("temperature 0.5 (given)")
