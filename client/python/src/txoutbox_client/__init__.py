"""Python client of txoutboxd, the transactional-outbox relay.

A publisher subscribes to an outbox and hands each row to your broker; the server does
the rest (leases, fencing, retries with backoff, dead-letters, per-key order)::

    from txoutbox_client import Message, Subscriber

    def publish(message: Message) -> None:
        producer.send(message.topic, key=message.key, value=message.payload)  # raise to nack

    Subscriber("127.0.0.1:7411", "default", name="orders-to-kafka").run_until_signal(publish)

Returning acks the message. Raise :class:`Nack` (optionally with ``retry_after``),
:class:`DeadLetter` or :class:`Release` to answer otherwise; any other exception nacks it
with its text. :class:`AsyncSubscriber` is the same for asyncio with an ``async`` handler.
:class:`Credentials` carries a token and TLS settings. The raw gRPC stubs are in
:mod:`txoutbox_client.proto`.
"""

from ._aio import AsyncSubscriber
from ._sync import Subscriber
from ._types import (
    ConnectError,
    Credentials,
    DeadLetter,
    Draining,
    Event,
    LeasesExpired,
    Message,
    Nack,
    ReconnectsExhausted,
    Reconnecting,
    Release,
    Settled,
    Subscribed,
    SubscriberError,
    SubscriptionRefused,
)

__all__ = [
    "AsyncSubscriber",
    "ConnectError",
    "Credentials",
    "DeadLetter",
    "Draining",
    "Event",
    "LeasesExpired",
    "Message",
    "Nack",
    "ReconnectsExhausted",
    "Reconnecting",
    "Release",
    "Settled",
    "Subscribed",
    "Subscriber",
    "SubscriberError",
    "SubscriptionRefused",
]
