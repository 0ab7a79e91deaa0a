"""Workers: sandboxed processes that run tools' execute (SPEC D2; docs/workers.md)."""
