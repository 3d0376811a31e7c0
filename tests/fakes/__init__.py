"""Test doubles for optional backends that cannot run here (no GPU)."""
