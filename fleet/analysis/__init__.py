"""Analyses of runs in the store, read from what the nodes exported (pure: no I/O but reading)."""
