"""Channels to a server, plain or TLS, for grpc and grpc.aio alike."""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence, Tuple

import grpc

from ._types import Credentials, PathOrBytes

# A response is at most the server's `server.max_message_bytes` (64 MiB at most); take
# whatever it sends rather than fail on a batch of large rows.
DEFAULT_OPTIONS: Tuple[Tuple[str, object], ...] = (
    ("grpc.max_receive_message_length", -1),
    # Notice a dead connection (a server's machine gone) without waiting for TCP.
    ("grpc.keepalive_time_ms", 20_000),
    ("grpc.keepalive_timeout_ms", 10_000),
)


def target(server: str) -> str:
    """A gRPC target from an address as users write it: ``host:port``, or with an
    ``http://`` / ``https://`` scheme as the Rust client and the CLI take it."""
    for scheme in ("http://", "https://"):
        if server.startswith(scheme):
            return server[len(scheme):].rstrip("/")
    return server


def _read(value: Optional[PathOrBytes]) -> Optional[bytes]:
    if value is None or isinstance(value, bytes):
        return value
    return Path(value).read_bytes()


def channel_credentials(credentials: Credentials) -> Optional[grpc.ChannelCredentials]:
    if not credentials.uses_tls:
        return None
    return grpc.ssl_channel_credentials(
        root_certificates=_read(credentials.ca),
        private_key=_read(credentials.key),
        certificate_chain=_read(credentials.cert),
    )


def open_channel(module, server: str, credentials: Credentials,
                 options: Sequence[Tuple[str, object]]):
    """``module`` is ``grpc`` or ``grpc.aio``. The token goes with each call as metadata,
    which gRPC sends on plain channels too (a server on loopback may take tokens without
    TLS)."""
    all_options = list(DEFAULT_OPTIONS) + list(options)
    tls = channel_credentials(credentials)
    if tls is None:
        return module.insecure_channel(target(server), options=all_options)
    return module.secure_channel(target(server), tls, options=all_options)
