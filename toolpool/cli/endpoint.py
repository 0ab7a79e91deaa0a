"""Which daemon a client command talks to: ``--endpoint`` and ``--runtime-dir``, and the
client they make (this user's daemon when neither is given)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from toolpool.client import Client


def client_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--endpoint", help="the daemon's endpoint (default: this user's daemon)")
    parser.add_argument("--runtime-dir", type=Path, help="the daemon's runtime directory")


def connect(args: argparse.Namespace) -> Client:
    """A client of the daemon the flags name."""
    from toolpool.client import Client

    return Client(args.endpoint, runtime_dir=args.runtime_dir)
