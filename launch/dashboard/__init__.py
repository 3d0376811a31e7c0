"""The run's live dashboard: a web page served from what a run writes (docs/dashboard.md)."""
