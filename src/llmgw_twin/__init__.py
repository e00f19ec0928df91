"""llmgw-twin: a control plane for LLM replicas on GPU fabrics, and its deterministic twin."""

__version__ = "0.1.0"
