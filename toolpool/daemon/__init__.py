"""The daemon: wires the engine and the worker pool together behind a socket.

- ``main.py``: ``serve`` and ``run_foreground`` (``toolpool daemon run``): the pool,
  the engine's ``Coordinator`` over a ``PoolExecutor``, the imported MCP servers,
  the server, signals and the drain;
- ``server.py``: the client socket: requests, sessions, turns streamed as events;
- ``config.py``: the configuration (defaults < TOML < environment < flags);
- ``logs.py``: JSON-lines logging.

Starting, stopping and asking after a daemon in the background is the client side's
(``toolpool.client.control``): it starts this one as a process of its own.
"""
