"""`llmgw-twin sweep`: one scenario over a grid of settings and seeds, measured side by side
(docs/sweep.md)."""
