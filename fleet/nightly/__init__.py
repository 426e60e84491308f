"""fleet's nightly profiling: playbooks, schedules, trends and the report."""
