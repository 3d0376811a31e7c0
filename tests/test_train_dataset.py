NUM_GPUS = 0
"""Real-data path: a JSONL file of math prompts, malformed rows skipped and
counted, answers checked by math-verify, end to end through the workers."""

import json
import os
import subprocess
import sys

from grpo_tiny import TINY


def test_jsonl_math_dataset_end_to_end(tmp_path):
    rows = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(4) for b in range(4)]
    lines = [json.dumps(r) for r in rows] + ["{broken", json.dumps({"prompt": "9+9="}), json.dumps({"q": 1})]
    (tmp_path / "math.jsonl").write_text("\n".join(lines) + "\n")
    run = tmp_path / "run"
    tiny = [a for a in TINY if not a.startswith("task.count_up")]
    result = subprocess.run(
        [sys.executable, "-m", "dynarl.launch.cli", "train", *tiny, "task.kind=dataset",
         f"task.dataset.path={tmp_path / 'math.jsonl'}", "run.steps=2", "rollout.max_new_tokens=4",
         "--run-dir", str(run)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "16 rows loaded, 3 skipped (row 17: not valid JSON" in result.stdout
    report = json.load(open(run / "data_report.json"))
    assert [s["row"] for s in report["skipped"]] == [17, 18, 19]
    metrics = [json.loads(line) for line in open(run / "metrics.jsonl")]
    assert [m["step"] for m in metrics] == [0, 1] and {m["verifier"] for m in metrics} == {"math-verify"}
    ledger = [json.loads(line) for line in open(run / "ledger.jsonl")]
    ids = [i for entry in ledger for i in entry["samples"]]
    assert len(ids) == len(set(ids)) == 2 * 8 * 4 and all(i.startswith("e0:r") for i in ids)
    assert os.path.isfile(run / "timeline.png")
