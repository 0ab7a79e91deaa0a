"""What the tools share, and none of them is: paths and their rules, stamps and the
read register's refusals, text and diffs, patches' grammar, matching and commit,
command runs and their output, ripgrep and the directory walks. The tools themselves
are the modules of ``toolpool.tools`` (one tool, or a tool family, per module)."""
