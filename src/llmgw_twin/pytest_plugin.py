"""pytest collects scenario files as tests (being written)."""
