"""The memory plan: per device, what each phase of a step needs (docs/memory.md)."""
