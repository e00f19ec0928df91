"""The pure control core: it is handed `now` and events and returns commands; it does no I/O."""
