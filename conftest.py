"""Shared pytest configuration: tests import `tests.*` and `e2e.*` from the repository root."""
