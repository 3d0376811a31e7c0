"""The DynaRL global scheduler: the pure parts (the ClusterView, the throughput
predictor, the `decide(view) -> plan | None` policies) and the orchestration
around them (managers over the runtime hypergraph, the GlobalScheduler loop)."""
