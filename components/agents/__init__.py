"""Agents over an OpenAI-compatible endpoint: the job serves /v1/chat/completions and
/v1/completions in front of the rollout engines, records each session's token ids,
and trains an unmodified agent's trajectories (messages.py: the records)."""
