"""The twin of the fleet you run: the live controller's state and event log made into scenarios
(`snapshot`, `replay`), and actions rehearsed on them before they are taken (`what-if`).

It sits beside `realmode/`, above both shells: it reads a live controller through the service's
operator client and runs the twin on what it read (docs/live-twin.md).
"""
