"""TRL's vLLM server fields as grpo's server mode (`rollout.vllm.mode=server`, docs/scaling.md#vllm-server-mode).

TRL reads its server fields only when `vllm_mode` is server, and builds one client URL from them:
`vllm_server_base_url` when set, else `vllm_server_host` and `vllm_server_port`. Every field that
takes part in that URL converts to the same `rollout.vllm.server_url`, so the mapping's check that
two fields agree on a key holds whichever of them the file gives. The server itself is grpo's
command, not TRL's: `trl vllm-serve` lacks the worker extension grpo pushes weights through.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from grpo_cli.config.trl.values import BadTrlValue, Converter, Lookup, Outcome, number

MODES = {"colocate": "colocated", "server": "server"}  # TRL's vllm_mode -> rollout.vllm.mode
SERVER_COMMAND = (
    "start the server with `python -m grpo_cli.rollout.vllm_server serve MODEL_DIR` "
    "(docs/scaling.md#vllm-server-mode): TRL's `trl vllm-serve` is another server, which grpo cannot push weights to"
)
# TRL's default host 0.0.0.0 is the address its server listens on (every interface); a client that
# connects to it reaches this machine on Linux, which the loopback address says on every system
LISTEN_ADDRESSES = {"0.0.0.0": "127.0.0.1", "::": "::1"}


def _base(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise BadTrlValue("expected a URL such as http://host:8000")
    value = value.strip().rstrip("/")
    return value if "://" in value else f"http://{value}"  # no scheme: http, as TRL's client


def _host(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise BadTrlValue("expected a host name or address")
    host = LISTEN_ADDRESSES.get(value, value)
    return f"[{host}]" if ":" in host and not host.startswith("[") else host  # IPv6 goes in brackets in a URL


def _port(value: Any) -> int:
    port = number(value, int)
    if not 0 < port < 65536:
        raise BadTrlValue(f"expected a port, 1 to 65535, got {port}")
    return port


def _named(name: str, check: Callable[[Any], Any], get: Lookup) -> Any:
    """Another field's value, checked; named, since the error is raised while converting this one."""
    try:
        return check(get(name))
    except BadTrlValue as err:
        raise BadTrlValue(f"{name}={get(name)!r}: {err}") from None


def server_url(get: Lookup) -> str:
    """The URL TRL's client would reach, as rollout.vllm.server_url.

    >>> server_url({"vllm_server_base_url": None, "vllm_server_host": "0.0.0.0", "vllm_server_port": 8000}.get)
    'http://127.0.0.1:8000'
    """
    if get("vllm_server_base_url") is not None:  # TRL ignores host and port then
        return _named("vllm_server_base_url", _base, get)
    return f"http://{_named('vllm_server_host', _host, get)}:{_named('vllm_server_port', _port, get)}"


def vllm_mode(value: Any, get: Lookup) -> Outcome:
    """colocate is grpo's colocated engine; server is its server mode at the file's address."""
    if value not in MODES:
        raise BadTrlValue(f"one of {', '.join(MODES)} expected")
    if value == "colocate":
        return Outcome({"rollout.vllm.mode": "colocated"})
    return Outcome({"rollout.vllm.mode": "server", "rollout.vllm.server_url": server_url(get)}, SERVER_COMMAND)


def unused(get: Lookup) -> str:
    return f"unused while vllm_mode is {get('vllm_mode')} (TRL reads it in server mode only)"


def base_url(value: Any, get: Lookup) -> Outcome:
    if get("vllm_mode") != "server":
        return Outcome(left_out=unused(get))
    if value is not None:
        _base(value)  # its own error, named once (server_url would name the field again)
    return Outcome({"rollout.vllm.server_url": server_url(get)})


def host_or_port(check: Callable[[Any], Any]) -> Converter:
    """vllm_server_host or _port (`check` checks the value): part of the URL unless a base_url is set."""

    def convert(value: Any, get: Lookup) -> Outcome:
        if get("vllm_mode") != "server":
            return Outcome(left_out=unused(get))
        if get("vllm_server_base_url") is not None:
            return Outcome(left_out="vllm_server_base_url, also set, wins (as in TRL)")
        check(value)
        return Outcome({"rollout.vllm.server_url": server_url(get)})

    return convert


host, port = host_or_port(_host), host_or_port(_port)


def server_timeout(value: Any, get: Lookup) -> Outcome:
    """TRL's total wait for the server to come up: grpo's ready_timeout, which also bounds the wait
    for a restarted server."""
    if get("vllm_mode") != "server":
        return Outcome(left_out=unused(get))
    return Outcome({"rollout.vllm.ready_timeout": number(value)})
