"""A module whose top-level code fails (tests/respire_actors/test_cli.py)."""

raise RuntimeError("boom at import")
