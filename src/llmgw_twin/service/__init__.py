"""The production shell: HTTP services, asyncio loops, inventory and the subprocess launcher."""
