"""Real mode: a scenario file run on real processes on this machine (`llmgw-twin run --real`)."""
