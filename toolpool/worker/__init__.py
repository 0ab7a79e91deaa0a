"""Workers: sandboxed processes that run tools' execute (SPEC D2). See issue 4."""
