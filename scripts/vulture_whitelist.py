"""Names vulture cannot see used (scripts/test runs vulture with this file).

Each is used, but not by a name vulture follows: attributes pyzmq turns into socket
options, enum members reached by value, the parameters a protocol imposes.
"""

import toolpool
from toolpool.client import base
from toolpool.daemon import server
from toolpool.engine.approvals import GateMode
from toolpool.function_tool import FunctionTool
from toolpool.images import unpack
from toolpool.models import ErrorCode

_ = base, server
_.curve_serverkey  # pyzmq socket options, set as attributes
_.curve_publickey
_.curve_secretkey
_.curve_server
GateMode.POLICY  # chosen by the string "policy" in a session's options
ErrorCode.SANDBOX_FAILED  # raised as ToolError(code="sandbox_failed")
FunctionTool.__wrapped__  # functools.wraps protocol: inspect follows it
toolpool.__getattr__  # a module's __getattr__ (PEP 562): Python calls it for a missing name
_.tb  # __exit__'s third parameter
_.signum  # a signal handler's first parameter
unpack._Source.readinto  # io.RawIOBase's protocol: BufferedReader calls it
unpack._Counted.readinto

_.get_tools  # pydantic-ai calls a toolset's get_tools (toolpool.integrations.pydantic_ai)
_.bytes_up  # the proxy's counters (toolpool.egress.server.Counters), read by dataclasses.asdict
_.bytes_down
