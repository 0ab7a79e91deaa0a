"""What a worker imports: every module the zygote loads is in every worker's memory, so
the client, asyncio and jsonschema, which a worker does not use, are not among them."""

from __future__ import annotations

import subprocess
import sys

import pytest

ZYGOTE_IMPORTS = """
import sys
from toolpool.worker.zygote import _load
_load(["toolpool.tools"])  # as the zygote registers its tools
print(sorted(m for m in ("asyncio", "jsonschema", "ssl", "toolpool.client") if m in sys.modules))
"""


def test_the_zygote_loads_neither_the_client_nor_asyncio_nor_jsonschema() -> None:
    done = subprocess.run(
        [sys.executable, "-c", ZYGOTE_IMPORTS], capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "[]", done.stdout


def test_the_client_names_of_toolpool_are_there_when_asked_for() -> None:
    import toolpool
    from toolpool import client

    assert toolpool.Client is client.Client
    assert toolpool.AsyncClient is client.AsyncClient
    assert issubclass(toolpool.ClientTimeout, toolpool.ClientError)
    assert {"Client", "AsyncClient", "RequestFailed"} <= set(toolpool.__all__)
    with pytest.raises(AttributeError, match="NoSuchName"):
        toolpool.NoSuchName  # type: ignore[attr-defined]  # noqa: B018
