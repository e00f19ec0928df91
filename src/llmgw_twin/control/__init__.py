"""The control plane: a pure core (no I/O) plus the production shell in `service/`."""
