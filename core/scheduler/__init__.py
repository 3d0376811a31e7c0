"""The DynaRL global scheduler's pure parts: snapshots, the throughput predictor
and the `decide(snapshot) -> plan | None` policies."""
