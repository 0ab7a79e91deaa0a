"""``toolpool audit``: the audit log's records, one line per call (SPEC R1); no daemon
needed."""

from __future__ import annotations

import argparse
from pathlib import Path

from toolpool.cli.messages import UsageError
from toolpool.client.control import ExitCode


def add_to(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    audit = commands.add_parser("audit", help="the audit log: one line per call (no daemon needed)")
    audit.add_argument("--file", type=Path, help="the log (default: the audit_log setting)")
    audit.add_argument("--config", help="TOML configuration file, for its audit_log")
    audit.add_argument(
        "--runtime-dir", type=Path, help="the daemon's runtime directory, for the log it kept"
    )
    audit.add_argument("--session", help="only this session's calls")
    audit.add_argument("--follow", "-f", action="store_true", help="wait for new lines")
    audit.add_argument("--json", action="store_true", help="the records as JSON lines")
    audit.set_defaults(handler=print_records)


def print_records(args: argparse.Namespace) -> int:
    """The audit log's records; the file is ``--file``, else the configured one, else
    the one the last daemon started in the runtime dir kept."""
    from toolpool.client.audit import print_audit

    path = args.file
    if path is None:
        from toolpool.daemon.config import load_config
        from toolpool.runtime import last_audit_log

        flags = {"config": args.config, "runtime_dir": args.runtime_dir}
        config = load_config(flags, check_modules=False)
        # The configured log, else the one the last daemon of the runtime dir kept (a
        # daemon started with --audit-log says where it is).
        path = config.audit_log or last_audit_log(config.runtime_dir)
        if path is None:
            raise UsageError(
                "audit: no audit log: set audit_log, or say --file PATH (no daemon was "
                f"started with one in {config.runtime_dir})"
            )
    print_audit(path, session=args.session, follow=args.follow, raw=args.json)
    return ExitCode.OK
