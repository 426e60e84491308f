"""fleet's lab servers over SSH: probe, plan, run the agent, bring reports home."""
