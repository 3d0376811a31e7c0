"""`dynarl eval (RUN_DIR | HF_DIR) [key=value ...] [--step N] [--samples K] [--temperature T]
[--limit N] [--train-rows] [--json]`: mean reward and pass@k of a policy on held-out
problems, on the native engine.

RUN_DIR: a `dynarl train` run; the policy is a checkpoint's (the newest, or
`--step N`), the task and model are the run's config.yaml. HF_DIR: an HF folder (e.g.
`dynarl export`'s); the task is `dynarl train`'s default. Either way `key=value`
overrides them, so held-out data is named as for training: `task.kind=dataset
task.dataset.path=test.jsonl task.dataset.preset=gsm8k`.

Problems (held_out): rows given on the command line (task.dataset.path=..., unless
task.dataset.eval_path=... is given too) as they are; else the held-out rows: task.dataset.eval_path, or the eval_split ("test")
of a saved DatasetDict folder; a dataset run without either is refused (its rows
are all training rows) unless --train-rows asks for them. Rows in file order,
malformed ones skipped and reported. A built-in task's problems are generated with
another seed than training's (EVAL_SEED).

Sampling (sampling): one greedy sample per problem (temperature 0) unless told:
--temperature T or rollout.temperature=T; --samples K > 1 samples at the config's
rollout.temperature (pass@k needs distinct samples). Samples are seeded per
(problem, sample) and scored by the task's verifier; the command prints what it
read and how it sampled. pass@k is the unbiased estimator of Chen et al. 2021
(Codex): 1 - C(n-c, k) / C(n, k) per problem, n samples of which c are correct
(reward 1), averaged; it is reported for k = 1 and k = K.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import sys
import time
from typing import Any

EVAL_SEED = 7_777_777
"""A built-in task's evaluation stream: not the training seed's problems."""
BATCH = 64
"""Problems generated at once (progress is reported per batch)."""


def pass_at_k(n: int, c: int, k: int) -> float:
    """The chance that at least one of k samples drawn from n (c of them correct) is correct."""
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def load_policy(target: str, overrides: list[tuple[str, Any]], step: int | None) -> tuple[Any, Any, str]:
    """(config, model with the policy's weights, what was loaded)."""
    from dynarl.components.model.io import load_weights
    from dynarl.components.model.spec import build_model
    from dynarl.launch.export import pick_checkpoint, policy_weights
    from dynarl.launch.train import resolve_config

    if os.path.isfile(os.path.join(target, "config.yaml")):  # a run directory
        cfg = resolve_config(None, overrides, target)
        path, state = pick_checkpoint(target, step)
        model = build_model(cfg.model)
        load_weights(model, policy_weights(path, model.config), strict=True)
        return cfg, model, f"{target} step {state.step}"
    if os.path.isfile(os.path.join(target, "config.json")):  # an HF folder
        cfg = resolve_config(None, [("model.path", target), *overrides], None)
        return cfg, build_model(cfg.model), target
    raise ValueError(f"{target} is neither a run directory (config.yaml) nor an HF folder (config.json)")


def held_out(dataset: Any, *, given: bool, train_rows: bool, splits: list[str] | None) -> tuple[Any, str]:
    """The rows to evaluate (a DatasetConfig) and what they are, in words. `given`: the
    command line named task.dataset.path; `splits`: those of a saved DatasetDict folder
    at dataset.path (None: not one). Raises ValueError when nothing is held out."""
    import dataclasses
    if given:
        return dataset, f"the rows given, {dataset.path}"
    if train_rows:
        return dataset, f"the training rows of {dataset.path} (--train-rows)"
    if dataset.eval_path:
        return (dataclasses.replace(dataset, path=dataset.eval_path, format="auto", split=dataset.eval_split),
                f"held-out rows, {dataset.eval_path} (task.dataset.eval_path)")
    if splits is not None and dataset.eval_split in splits and dataset.eval_split != dataset.split:
        return (dataclasses.replace(dataset, split=dataset.eval_split),
                f"held-out split {dataset.eval_split!r} of {dataset.path}")
    raise ValueError(f"the run trains on every row of {dataset.path}, so none is held out: name held-out rows "
                     "(task.dataset.eval_path=FILE in the run's config or here, or task.dataset.path=FILE), "
                     "or evaluate on the training rows with --train-rows")


def sampling(samples: int, told: float | None, configured: float) -> tuple[float, str]:
    """The temperature to sample at and how it was chosen: `told` (--temperature or
    rollout.temperature=) if given, else greedy for one sample per problem, else the
    config's (K samples of greedy decoding would all be the same)."""
    if told is not None:
        return told, f"temperature {told:g} (given)"
    if samples == 1:
        return 0.0, "greedy (temperature 0; --temperature T to sample)"
    return configured, f"temperature {configured:g} (rollout.temperature: --samples {samples} needs distinct samples)"


def saved_splits(path: str | None) -> list[str] | None:
    """The splits of a saved DatasetDict folder at `path`, or None."""
    file = os.path.join(path or "", "dataset_dict.json")
    if not path or not os.path.isfile(file):
        return None
    with open(file) as f:
        return list(json.load(f).get("splits", []))


def eval_problems(cfg: Any, tokenizer: Any, limit: int | None, rows: Any = None) -> tuple[list[Any], str]:
    """The problems and what they are; `rows`: the dataset's (held_out), for a dataset task."""
    from dynarl.components.model.spec import prompt_check
    from dynarl.components.model.tokenizer import chat_formatter
    from dynarl.components.tasks.dataset import load_dataset
    from dynarl.components.tasks.source import ProblemSource

    check = prompt_check(tokenizer, cfg.model.config().max_position_embeddings - cfg.rollout.max_new_tokens)
    if cfg.task.kind == "dataset":
        data = load_dataset(rows or cfg.task.dataset, check, chat_formatter(tokenizer))
        return data.problems[:limit], data.report()
    count = limit or 200
    return (ProblemSource(cfg.task, EVAL_SEED, check).problems(0, count),
            f"{cfg.task.kind}, generated with seed {EVAL_SEED}, not the training seed")


async def generate(model: Any, cfg: Any, tokenizer: Any, problems: list[Any], samples: int, temperature: float,
                   progress) -> list[list[float]]:
    """Rewards per problem, `samples` each."""
    from dynarl.components.model.spec import safe_decode
    from dynarl.components.reward.verifiers import make_verifier
    from dynarl.components.rollout.base import GenerationRequest, SamplingParams
    from dynarl.components.rollout.native.engine import NativeRolloutEngine
    from dynarl.components.tasks.problem import stable_seed

    verify, _ = make_verifier(cfg.task.resolved_verifier)
    engine = NativeRolloutEngine(model, cfg.rollout.engine)
    r = cfg.rollout
    rewards: list[list[float]] = []
    for begin in range(0, len(problems), BATCH):
        batch = problems[begin:begin + BATCH]
        requests = [GenerationRequest(f"{p.id}/{k}", tokenizer.encode(p.prompt, add_bos=True),
                                      SamplingParams(temperature=temperature, top_p=r.top_p, top_k=r.top_k,
                                                     max_new_tokens=r.max_new_tokens,
                                                     stop_token_ids=(tokenizer.eos_id,),
                                                     seed=stable_seed(EVAL_SEED, p.id, k)))
                    for p in batch for k in range(samples)]
        results = {res.request_id: res for res in await engine.generate(requests)}
        for p in batch:
            outputs = [[t for t in results[f"{p.id}/{k}"].output_token_ids if t != tokenizer.eos_id]
                       for k in range(samples)]
            rewards.append([float(verify(safe_decode(tokenizer, ids), p.answer)) if verify else 0.0
                            for ids in outputs])
        progress(begin + len(batch), len(problems))
    return rewards


def evaluate(target: str, overrides: list[tuple[str, Any]], *, step: int | None = None, samples: int = 1,
             limit: int | None = None, temperature: float | None = None, train_rows: bool = False,
             progress=lambda done, total: None, say=lambda line: None) -> dict[str, Any]:
    """`say`: gets a line saying which problems are read and how they are sampled."""
    from dynarl.components.model.spec import build_tokenizer

    if samples < 1:
        raise ValueError(f"--samples must be >= 1, got {samples}")
    if temperature is not None and temperature < 0:
        raise ValueError(f"--temperature must be >= 0, got {temperature}")
    cfg, model, loaded = load_policy(target, overrides, step)
    if cfg.workflow == "agentic" or cfg.task.kind == "calc":
        raise ValueError("the agentic workflow's multi-turn episodes (tool calls) are not evaluated yet; "
                         "dynarl eval runs single-turn tasks")
    named = {key for key, _ in overrides}
    told = temperature if temperature is not None else (
        cfg.rollout.temperature if "rollout.temperature" in named else None)
    temperature, how = sampling(samples, told, cfg.rollout.temperature)
    rows, what = None, f"{cfg.task.kind} problems"
    if cfg.task.kind == "dataset":
        d = cfg.task.dataset
        given = "task.dataset.path" in named and "task.dataset.eval_path" not in named
        rows, what = held_out(d, given=given, train_rows=train_rows, splits=saved_splits(d.path))
    model.eval()
    tokenizer = build_tokenizer(cfg.model)
    problems, report = eval_problems(cfg, tokenizer, limit, rows)
    if not problems:
        raise ValueError(f"no problem to evaluate ({report})")
    say(f"evaluating {loaded} on {what} ({report}), {samples} sample(s) each, {how}")
    begun = time.perf_counter()
    rewards = asyncio.run(generate(model, cfg, tokenizer, problems, samples, temperature, progress))
    correct = [sum(x == 1.0 for x in row) for row in rewards]
    ks = sorted({1, samples})
    return {"policy": loaded, "problems": len(problems), "samples": samples, "temperature": temperature,
            "data": f"{what} ({report})" if rows is not None else report,
            "reward_mean": sum(map(sum, rewards)) / (len(rewards) * samples),
            **{f"pass@{k}": sum(pass_at_k(samples, c, k) for c in correct) / len(correct) for k in ks},
            "seconds": time.perf_counter() - begun}


def main(argv: list[str]) -> int:
    from dynarl.launch.train import parse_override
    from dynarl.transport.errors import ConfigError

    parser = argparse.ArgumentParser(prog="dynarl eval", description=__doc__.split("\n\n")[0])
    parser.add_argument("target", help="a run directory or an HF folder")
    parser.add_argument("overrides", nargs="*", help="key=value, as for dynarl train")
    parser.add_argument("--step", type=int, help="a run's checkpoint of this step (default: the newest)")
    parser.add_argument("--samples", type=int, default=1, help="samples per problem (pass@k for k = 1 and this)")
    parser.add_argument("--temperature", type=float,
                        help="sampling temperature (default: 0, greedy, for one sample; the config's for --samples K)")
    parser.add_argument("--limit", type=int, help="evaluate the first N problems only")
    parser.add_argument("--train-rows", action="store_true",
                        help="a dataset run without held-out rows (task.dataset.eval_path): evaluate on its training rows")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)

    def progress(done: int, total: int) -> None:
        print(f"eval {done}/{total} problems", file=sys.stderr, flush=True)
    try:
        overrides = [parse_override(o) for o in args.overrides]
        result = evaluate(args.target, overrides, step=args.step, samples=args.samples, limit=args.limit,
                          temperature=args.temperature, train_rows=args.train_rows, progress=progress,
                          say=lambda line: print(line, file=sys.stderr, flush=True))
    except (ConfigError, ValueError, FileNotFoundError) as exc:
        print(f"dynarl eval: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result))
    else:
        passes = "  ".join(f"{k} {v:.3f}" for k, v in result.items() if k.startswith("pass@"))
        print(f"{result['policy']}: {result['problems']} problems x {result['samples']} samples at temperature "
              f"{result['temperature']:g} ({result['data']}): "
              f"reward {result['reward_mean']:.3f}  {passes}  in {result['seconds']:.0f} s")
    return 0
