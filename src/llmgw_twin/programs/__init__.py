"""Runnable programs beside the adapters: the sim engine, engine-check and the tiny GGUF writer.

They do I/O (sockets, subprocesses, files); the pure adapters they build on live in `engines/`.
"""
