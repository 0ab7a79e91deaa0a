"""What a command (or a Python tool) of a policy session is told of its proxy (SPEC
N3, N11): the proxy variables pip, npm, git, curl and Python's urllib read, pointing
at the session's proxy on its network namespace's loopback, with the call's token as
the proxy credentials.

The token names the call that opened a connection (the approval and the audit record
say which), and cannot be made up for another call: its password is an HMAC of the
call id under the session's key, which the proxy holds and no command sees. A client
that sends no credentials (git sends them only when asked) is served all the same;
its connections are the session's, of no known call.
"""

from __future__ import annotations

import base64
import hashlib
import hmac

PROXY_ADDRESS = "127.0.0.1"  # on the session's own network namespace's loopback
HTTP_PORT = 3128
SOCKS_PORT = 1080
MAX_CALL_ID = 128  # longer call ids travel without a token
_MAC_CHARS = 24


WORKER_TOKEN = "worker:"  # a bound worker's token: the pool knows the call it runs


def worker_token(worker_id: str) -> str:
    """What a policy session's worker names itself in its token (N11)."""
    return WORKER_TOKEN + worker_id


def call_mac(key: bytes, call_id: str) -> str:
    return hmac.new(key, call_id.encode("utf-8", "surrogatepass"), hashlib.sha256).hexdigest()[
        :_MAC_CHARS
    ]


def token_user(call_id: str) -> str:
    """A call id as a proxy user name: base64url, so that no client has anything to
    quote or unquote in it (a user name may hold no colon, RFC 7617)."""
    encoded = base64.urlsafe_b64encode(call_id.encode("utf-8", "surrogatepass"))
    return "t" + encoded.decode("ascii").rstrip("=")


def call_of(key: bytes, user: str, password: str) -> str:
    """The call a client's credentials name, or "" when they name none (or were
    made up)."""
    if not user.startswith("t") or len(user) > 4 * MAX_CALL_ID or len(password) != _MAC_CHARS:
        return ""
    try:
        text = user[1:]
        call_id = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)).decode("utf-8")
    except (ValueError, UnicodeDecodeError):
        return ""
    return call_id if hmac.compare_digest(call_mac(key, call_id), password) else ""


def proxy_environment(key_hex: str, call_id: str) -> dict[str, str]:
    """The variables for a command of ``call_id`` in a session whose key is
    ``key_hex``: the HTTP proxy for http and https, SOCKS5 (names resolved by the
    proxy) for the rest, and no proxy for the namespace's own loopback."""
    credentials = ""
    if 0 < len(call_id) <= MAX_CALL_ID:
        mac = call_mac(bytes.fromhex(key_hex), call_id)
        credentials = f"{token_user(call_id)}:{mac}@"
    http = f"http://{credentials}{PROXY_ADDRESS}:{HTTP_PORT}"
    socks = f"socks5h://{credentials}{PROXY_ADDRESS}:{SOCKS_PORT}"
    env: dict[str, str] = {}
    for name, value in (
        ("http_proxy", http),
        ("https_proxy", http),
        ("all_proxy", socks),
        ("no_proxy", "localhost,127.0.0.1,::1"),
    ):
        env[name] = env[name.upper()] = value
    # npm reads its own configuration first; these name the same proxy for it.
    env["npm_config_proxy"] = env["npm_config_https_proxy"] = http
    # git (libcurl) sends proxy credentials only when challenged, unless told Basic.
    env["GIT_HTTP_PROXY_AUTHMETHOD"] = "basic"
    return env
