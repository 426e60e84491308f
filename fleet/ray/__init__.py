"""Ray clusters that are already running: ``fleet ray submit`` (fleet/ray/submit.py)."""
