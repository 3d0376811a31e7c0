NUM_GPUS = 0

import json
import statistics

import pytest
import torch

from dynarl.components import experience, weight_sync
from dynarl.components.model.config import TINY_CONFIGS
from dynarl.components.model.qwen2 import Qwen2ForCausalLM
from dynarl.components.model.spec import safe_decode
from dynarl.components.model.tokenizer import CharTokenizer
from dynarl.components.reward.verifiers import make_verifier
from dynarl.components.tasks.count_up import CountUpConfig, CountUpTask, count_up_score
from dynarl.components.tasks.dataset import DatasetConfig, load_dataset
from dynarl.components.trainer.base import TrainerConfig
from dynarl.components.trainer.native.trainer import NativeTrainer
from dynarl.components.workflows.ledger import DuplicateSample, SampleLedger, StepEntry
from dynarl.components.experience import PromptGroup, Sample


def test_ledger_refuses_a_sample_twice_and_rolls_back(tmp_path):
    ledger = SampleLedger()
    ledger.commit(StepEntry(0, ("a/0", "a/1"), (1, 2)))
    with pytest.raises(DuplicateSample, match=r"a/1 \(step 0\)"):
        ledger.check(1, ["b/0", "a/1"])
    with pytest.raises(DuplicateSample, match="twice"):
        ledger.check(1, ["b/0", "b/0"])
    with pytest.raises(DuplicateSample, match="not the next step"):
        ledger.check(2, ["c/0"])
    ledger.commit(StepEntry(1, ("b/0",), (3,)))
    ledger.save(str(tmp_path / "l.jsonl"))
    again = SampleLedger.load(str(tmp_path / "l.jsonl"))
    assert again.entries == ledger.entries
    assert [e.step for e in again.truncate(1)] == [1]
    again.check(1, ["b/0"])  # rolled back: may be trained once more


def test_count_up_is_a_pure_function_of_seed_and_index_with_a_long_tail():
    task = CountUpTask(CountUpConfig(), seed=7)
    assert task.problem(123) == CountUpTask(CountUpConfig(), seed=7).problem(123)
    assert task.problem(123) != CountUpTask(CountUpConfig(), seed=8).problem(123)
    problems = [task.problem(i) for i in range(4000)]
    for p in problems[:50]:
        start, end = p.prompt[0], p.prompt[2]
        assert p.answer[0] == start and p.answer[-1] == end and p.answer in CountUpConfig().alphabet
    lengths = sorted(len(p.answer) for p in problems)
    median, p99 = statistics.median(lengths), lengths[int(0.99 * len(lengths))]
    assert median <= 4 and p99 >= 4 * median and lengths[-1] == 26  # most short, a few run the alphabet


@pytest.mark.parametrize("response,answer,score", [
    pytest.param("defg", "defg", 1.0, id="exact"),
    pytest.param("def", "defg", 0.375, id="one-short"),
    pytest.param("defgh", "defg", 0.4, id="one-long"),
    pytest.param("", "d", 0.0, id="empty"),
])
def test_count_up_score(response, answer, score):
    assert count_up_score(response, answer) == pytest.approx(score)


def test_math_verifier_uses_math_verify():
    verify, backend = make_verifier("math")
    assert backend == "math-verify"
    assert verify("so the answer is $\\frac{1}{2}$", "0.5") == 1.0
    assert verify("the answer is 3", "4") == 0.0


def test_malformed_rows_are_skipped_and_counted_jsonl(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join([
        json.dumps({"prompt": "1+1=", "answer": "2"}),
        "{not json",
        json.dumps({"prompt": "2+2="}),
        json.dumps(["a list"]),
        json.dumps({"prompt": "", "answer": "1"}),
        json.dumps({"prompt": "3+3=", "answer": 6}),
        json.dumps({"prompt": "caf\u00e9", "answer": "x"}),
    ]) + "\n")
    tok = CharTokenizer()

    def check(text):
        try:
            tok.encode(text)
        except ValueError as exc:
            return str(exc)

    data = load_dataset(DatasetConfig(path=str(path)), check)
    assert [(p.prompt, p.answer) for p in data.problems] == [("1+1=", "2"), ("3+3=", "6")]
    assert [n for n, _ in data.skipped] == [2, 3, 4, 5, 7]
    report = data.report()
    assert report.startswith("2 rows loaded, 5 skipped") and "row 2: not valid JSON" in report
    assert "row 3: missing field 'answer'" in report and "row 7: character" in report


def test_parquet_rows(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq
    pq.write_table(pa.table({"question": ["1+2=", None, "5-1="], "answer": ["3", "1", "4"]}), tmp_path / "d.parquet")
    data = load_dataset(DatasetConfig(path=str(tmp_path / "d.parquet"), prompt_field="question"))
    assert [p.prompt for p in data.problems] == ["1+2=", "5-1="]
    assert data.skipped == [(1, "field 'question' is null")]


def test_safe_decode_marks_ids_the_tokenizer_does_not_know():
    tok = CharTokenizer()
    assert safe_decode(tok, tok.encode("ab") + [127] + tok.encode("c")) == "ab\ufffdc"


def test_weight_sync_buckets_match_the_trainers_named_weights():
    torch.manual_seed(0)
    trainer = NativeTrainer(Qwen2ForCausalLM(TINY_CONFIGS["tiny-0.5m"]), TrainerConfig())
    receiver = Qwen2ForCausalLM(TINY_CONFIGS["tiny-0.5m"])
    for bucket_bytes in (1024, 300_000, 1 << 30):
        sent = [[(n, tuple(t.shape)) for n, t in b] for b in trainer.named_weights(bucket_bytes)]
        assert sent == weight_sync.plan_buckets(receiver.named_parameters(), bucket_bytes)
    plan = weight_sync.plan_buckets(receiver.named_parameters(), 1 << 30)
    assert weight_sync.fingerprint(sent, torch.float32) == weight_sync.fingerprint(plan, torch.float32)
    # a receiver in another dtype than the one sent is told apart (it would misread the bytes)
    assert weight_sync.fingerprint(sent, torch.bfloat16) != weight_sync.fingerprint(plan, torch.float32)


def test_train_batch_is_canonical_whatever_the_arrival_order():
    def group(index):
        return PromptGroup(index, f"p{index}", "", [1, 5], [
            Sample(f"p{index}/{k}", k, output_ids=[7 + k, 2], reward=float(k), old_logprobs=[-1.0, -2.0])
            for k in range(2)])
    a = experience.train_batch([group(1), group(0)], with_ref=False)
    b = experience.train_batch([group(0), group(1)], with_ref=False)
    assert a == b and a.group_ids == [0, 0, 1, 1] and a.input_ids[1] == [1, 5, 8, 2]
    assert experience.sample_ids([group(1), group(0)]) == ["p0/0", "p0/1", "p1/0", "p1/1"]
