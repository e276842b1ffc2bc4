"""The types a publisher's code touches: messages, outcomes, credentials, events, errors."""

from __future__ import annotations

import datetime
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Optional, Sequence, Tuple, Union


@dataclass(frozen=True)
class Message:
    """One outbox row handed to the publisher."""

    #: Unique within the outbox, growing with insertion order: deduplicate on it downstream
    #: (delivery is at-least-once).
    id: int
    topic: str
    #: The ordering key; ``None`` for a keyless row. A key's messages come one after another.
    key: Optional[str]
    payload: bytes
    headers: Dict[str, str]
    #: 1 on the first delivery.
    attempts: int
    #: When the producer inserted the row (the database's clock), in UTC.
    created_at: datetime.datetime
    #: Names this delivery (row, attempt, lease holder); opaque. The subscriber sends it
    #: back with the message's answer, so the answer applies to this delivery only
    #: (docs/lease-tokens.md). Empty from a server before lease tokens.
    lease_token: str = ""

    def payload_text(self) -> str:
        """The payload as UTF-8 text (``UnicodeDecodeError`` when it is not)."""
        return self.payload.decode("utf-8")

    @classmethod
    def _from_proto(cls, message) -> "Message":
        return cls(
            id=message.id,
            topic=message.topic,
            key=message.key if message.HasField("key") else None,
            payload=bytes(message.payload),
            headers=dict(message.headers),
            attempts=message.attempts,
            created_at=message.created_at.ToDatetime(tzinfo=datetime.timezone.utc),
            lease_token=message.lease_token,
        )


# Outcomes other than an ack: a handler raises one. Returning normally acks the message;
# any other exception nacks it with its text.


class Nack(Exception):
    """The publish failed: the server retries the message after its backoff (or
    ``retry_after`` seconds, capped by the outbox's ``backoff.maximum``), and dead-letters it
    once its attempts are used up. The later messages of its key come back after it."""

    def __init__(self, error: str, retry_after: Optional[float] = None):
        super().__init__(error)
        self.error = error
        self.retry_after = retry_after


class DeadLetter(Exception):
    """No retry can help (a payload the broker will never take): the row is parked for an
    operator, with ``error``."""

    def __init__(self, error: str):
        super().__init__(error)
        self.error = error


class Release(Exception):
    """Give the message back untried: no attempt is counted and no error recorded; it is
    claimable again after ``delay`` seconds (at most 7 days)."""

    def __init__(self, delay: float = 0.0):
        super().__init__(f"released (delay {delay:g}s)")
        self.delay = delay


PathOrBytes = Union[str, Path, bytes]


@dataclass(frozen=True)
class Credentials:
    """How to reach a server that asks for them: a bearer token (an identity of
    ``server.auth``), TLS (``tls``, or any of the files), mutual TLS (``cert`` and ``key``).

    Files are PEM, given as paths or as their bytes; ``ca`` defaults to the system's roots.
    """

    token: Optional[str] = None
    tls: bool = False
    ca: Optional[PathOrBytes] = None
    cert: Optional[PathOrBytes] = None
    key: Optional[PathOrBytes] = None

    def __post_init__(self) -> None:
        if (self.cert is None) != (self.key is None):
            raise ValueError("a client certificate (cert) and its key (key) go together")

    @property
    def uses_tls(self) -> bool:
        return self.tls or self.ca is not None or self.cert is not None

    def _metadata(self) -> Tuple[Tuple[str, str], ...]:
        return (("authorization", f"Bearer {self.token}"),) if self.token else ()


# Events, for an application that logs or counts what its subscriber does (``on_event``).


@dataclass(frozen=True)
class Subscribed:
    """A stream is open on ``server``: the lease owner it got and the effective settings."""

    server: str
    owner: str
    lease_ms: int
    max_in_flight: int
    max_attempts: int


@dataclass(frozen=True)
class Settled:
    """The server applied one answer: what became of each id it named."""

    acked: Sequence[int] = ()
    retried: Sequence[int] = ()
    dead_lettered: Sequence[int] = ()
    released: Sequence[int] = ()
    extended: Sequence[int] = ()
    #: Ids the stream no longer held (a lease that ran out): the answer was ignored.
    fenced: Sequence[int] = ()
    #: An answer the server refused (nothing applied, the messages stay held), and why.
    rejected: Sequence[int] = ()
    rejected_reason: str = ""


@dataclass(frozen=True)
class LeasesExpired:
    """These leases ran out before their answer: the messages may go to someone else."""

    ids: Sequence[int]


@dataclass(frozen=True)
class Draining:
    """The server shuts down: what is held is answered, then the subscriber reconnects."""


@dataclass(frozen=True)
class Reconnecting:
    """The stream ended (``reason``); the next one opens in ``delay`` seconds."""

    reason: str
    delay: float


Event = Union[Subscribed, Settled, LeasesExpired, Draining, Reconnecting]


class SubscriberError(Exception):
    """The subscriber stopped for good; see the subclasses."""


class ConnectError(SubscriberError):
    """No server accepted a connection within ``connect_timeout`` at start."""


class SubscriptionRefused(SubscriberError):
    """The server refused the subscription in a way no reconnection fixes (an unknown
    outbox, missing or wrong credentials, a bad argument): ``code`` is the gRPC status."""

    def __init__(self, code: str, details: str):
        super().__init__(f"{code}: {details}")
        self.code = code
        self.details = details


class ReconnectsExhausted(SubscriberError):
    """``max_reconnects`` reconnections in a row found no server."""


@dataclass
class _Options:
    """What a subscriber was built with, shared by the sync and asyncio ones."""

    servers: Sequence[str]
    outbox: str
    name: str
    topics: Sequence[str]
    group: str
    max_in_flight: int
    lease_ms: int
    credentials: Credentials
    connect_timeout: float
    max_reconnects: Optional[int]
    channel_options: Sequence[Tuple[str, object]] = field(default_factory=tuple)
