"""HAProxy's runtime API on its admin socket (`stats socket ... level admin`): what a rolling
restart asks of the balancer. Commands are those of HAProxy 2.6's management guide, section 9.3:
`set server <backend>/<server> state ready|drain|maint` (drain: no new requests, those in progress
finish; ready: back in the rotation once its checks pass)."""

from __future__ import annotations

import re
import socket
from typing import Literal

from gpufleet.core.haproxy_stats import BACKEND

ServerAdminState = Literal["ready", "drain", "maint"]
_NAME = re.compile(r"^[A-Za-z0-9_.:-]+$")


def set_state_command(server: str, state: ServerAdminState, backend: str = BACKEND) -> str:
    """The runtime API line; ValueError for a name HAProxy would not parse as one word."""
    for what, name in (("backend", backend), ("server", server)):
        if not _NAME.match(name):
            raise ValueError(f"{what} name {name!r} is not a plain HAProxy identifier")
    if state not in ("ready", "drain", "maint"):
        raise ValueError(f"state must be ready, drain or maint, not {state!r}")
    return f"set server {backend}/{server} state {state}"


def command(socket_path: str, line: str, timeout_s: float = 5.0) -> str:
    """Send one command, return HAProxy's answer (empty: done). Raises OSError when the socket
    does not answer, RuntimeError when HAProxy says the command failed."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout_s)
        s.connect(socket_path)
        s.sendall(line.encode() + b"\n")
        chunks = []
        while chunk := s.recv(4096):
            chunks.append(chunk)
    answer = b"".join(chunks).decode().strip()
    # Errors are answered as text ("No such server.", "Require 'backend/server'.", ...); a state
    # change that worked answers nothing.
    if answer:
        raise RuntimeError(f"HAProxy refused {line!r}: {answer}")
    return answer


def set_server_state(socket_path: str, server: str, state: ServerAdminState, backend: str = BACKEND) -> None:
    command(socket_path, set_state_command(server, state, backend))
