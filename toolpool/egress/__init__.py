"""Network by domain (SPEC N1–N12): a policy session's commands reach the network
only through its proxy, which lets a connection through by the name asked for.

- ``rules``: the policy and its matching (no I/O);
- ``addresses``: where the proxy never connects (this host), and ``network_resolve``;
- ``requests``: what a client asks for, read with bounds (HTTP proxy, SOCKS5);
- ``server``: the proxy itself, on an event loop; ``dial``: where it connects (pins,
  its own resolution, the address guard); ``relay``: the bytes both ways;
- ``control``: the pool ⇄ proxy socket; ``process``: the proxy's process;
- ``environment``: the proxy variables a command gets.

The pool starts the process and makes each session's network namespace
(``toolpool.pool.egress``, ``toolpool.sandbox.netns``); the daemon asks the client
and writes the records.
"""
