"""A tiny `dynarl train` configuration for tests: seconds per run, every stage exercised."""

TINY = [
    "runtime.cluster.devices_per_node=3",
    "rollout.num_ranks=1", "inference.num_ranks=1", "trainer.num_ranks=1",
    "task.count_up.alphabet=abcdefghij", "task.count_up.median_len=2",
    "rollout.max_new_tokens=12", "rollout.samples_per_prompt=4", "rollout.chunk_size=2",
    "run.prompts_per_step=8", "trainer.warmup.steps=4", "trainer.warmup.batch_size=32",
    "trainer.engine.micro_batch_size=32",
]


def overrides(*extra: str) -> list[tuple[str, object]]:
    import yaml
    return [(k, yaml.safe_load(v)) for k, _, v in (arg.partition("=") for arg in (*TINY, *extra))]
