"""One subscription's bookkeeping, without I/O: what it holds, what to publish next, what
to answer. The sync and asyncio subscribers drive it; every rule lives here once:

- messages are published one at a time, in the order received (so a key's messages in id
  order), each answered as soon as its publish returned;
- after a message of a key fails, nothing more of that key is published from what the
  stream holds: after a nack the server gives those back itself (``settled.released``);
  after a dead-letter, a release or a lease that ran out, the stream releases them, so
  they come back in order, untried;
- every held message is extended each third of the lease, so a slow publish does not let
  the others' leases run out;
- a graceful close sends ``set_window(0)``, releases everything untouched, and half-closes
  the stream once the publish in progress is answered; nothing is sent after that.
"""

from __future__ import annotations

import collections
import random
from typing import Deque, Dict, Iterable, List, Optional, Sequence, Union

from ._types import (ConnectError, Credentials, DeadLetter, Message, Nack, ReconnectsExhausted,
                     Reconnecting, Release, Settled, SubscriptionRefused, _Options)
from .proto import relay_pb2 as pb


class Session:
    def __init__(self, options: _Options):
        self.options = options
        self.lease_ms = options.lease_ms
        self.held: Dict[int, Message] = {}
        self.queue: Deque[Message] = collections.deque()
        self.publishing: Optional[int] = None
        self.subscribed = False
        self.draining = False
        self.closing = False
        #: Set once the request stream is ended: nothing may be sent any more.
        self.half_closed = False

    def open(self) -> pb.SubscribeRequest:
        options = self.options
        return pb.SubscribeRequest(open=pb.OpenSubscription(
            outbox=options.outbox,
            subscriber=options.name,
            topics=list(options.topics),
            group=options.group,
            max_in_flight=options.max_in_flight,
            lease_ms=options.lease_ms,
        ))

    def on_batch(self, batch) -> None:
        if self.closing or self.draining:
            return  # sent before the server saw us close or drain; it takes them back
        for proto in batch.messages:
            message = Message._from_proto(proto)
            self.held[message.id] = message
            self.queue.append(message)

    def next_message(self) -> Optional[Message]:
        """The next message to publish, marked as publishing; ``None`` when there is
        nothing (or the stream is closing)."""
        while self.queue and not self.closing:
            queued = self.queue.popleft()
            # The latest delivery of the id: one sent again after its lease ran out
            # carries a new lease token, and an answer with the old one is fenced.
            message = self.held.get(queued.id)
            if message is not None:
                self.publishing = message.id
                return message
        return None

    def answer(self, message: Message, error: Optional[BaseException]) -> List[pb.SubscribeRequest]:
        """The requests that answer ``message``, whose publish returned (``error`` None)
        or raised ``error``."""
        self.publishing = None
        current = self.held.pop(message.id, None)
        if self.half_closed or current is None:
            return []  # its lease ran out: someone else may have it now
        # Sent again while it was being published (its lease ran out, then this stream
        # got it back): the answer carries the lease of the latest delivery.
        message = current
        token = message.lease_token
        if error is None:
            return [pb.SubscribeRequest(ack=pb.AckMessages(
                ids=[message.id], lease_tokens=_tokens([message])))]
        if isinstance(error, DeadLetter):
            request = pb.SubscribeRequest(dead_letter=pb.DeadLetterMessage(
                id=message.id, error=_text(error.error), lease_token=token))
            return [request, *self._give_back_rest_of(message.key)]
        if isinstance(error, Release):
            release = pb.ReleaseMessages(ids=[message.id], lease_tokens=_tokens([message]))
            if error.delay > 0:
                release.retry_delay_ms = round(error.delay * 1000)
            return [pb.SubscribeRequest(release=release), *self._give_back_rest_of(message.key)]
        if isinstance(error, Nack):
            nack = pb.NackMessage(id=message.id, error=_text(error.error), lease_token=token)
            if error.retry_after is not None:
                nack.retry_delay_ms = max(0, round(error.retry_after * 1000))
        else:
            nack = pb.NackMessage(id=message.id, error=_text(f"{type(error).__name__}: {error}"),
                                  lease_token=token)
        # The server gives back the later messages of the key this stream holds.
        self._drop_rest_of(message.key)
        return [pb.SubscribeRequest(nack=nack)]

    def on_leases_expired(self, ids) -> List[pb.SubscribeRequest]:
        requests = []
        for id in ids:
            message = self.held.pop(id, None)
            if message is not None:
                requests.extend(self._give_back_rest_of(message.key))
        return requests

    def extension(self) -> Optional[pb.SubscribeRequest]:
        """One request extending every held message, when there is any to extend (while
        closing, the one publishing: its lease must outlast its publish)."""
        if not self.held or self.half_closed or self.lease_ms <= 0:
            return None
        return pb.SubscribeRequest(extend_lease=pb.ExtendLeases(
            ids=list(self.held), lease_ms=self.lease_ms,
            lease_tokens=_tokens(self.held.values())))

    def close(self) -> List[pb.SubscribeRequest]:
        """Takes nothing new and gives back what is untouched (attempt refunded). The
        caller half-closes once ``ready_to_half_close``."""
        if self.closing or self.half_closed:
            return []
        self.closing = True
        self.queue.clear()
        untouched = [m for id, m in self.held.items() if id != self.publishing]
        for message in untouched:
            del self.held[message.id]
        requests = [pb.SubscribeRequest(set_window=pb.SetWindow(max_in_flight=0))]
        if untouched:
            requests.append(pb.SubscribeRequest(release=pb.ReleaseMessages(
                ids=[m.id for m in untouched], lease_tokens=_tokens(untouched))))
        return requests

    @property
    def ready_to_half_close(self) -> bool:
        return self.closing and self.publishing is None and not self.half_closed

    def _later_of(self, key: Optional[str]) -> List[Message]:
        if key is None:
            return []
        later = [m for m in self.queue if m.key == key and m.id in self.held]
        for message in later:
            del self.held[message.id]
        self.queue = collections.deque(m for m in self.queue if m.key != key)
        return later

    def _drop_rest_of(self, key: Optional[str]) -> None:
        self._later_of(key)

    def _give_back_rest_of(self, key: Optional[str]) -> List[pb.SubscribeRequest]:
        later = self._later_of(key)
        if not later:
            return []
        return [pb.SubscribeRequest(release=pb.ReleaseMessages(
            ids=[m.id for m in later], lease_tokens=_tokens(later)))]


def _tokens(messages: Iterable[Message]) -> List[str]:
    """The lease tokens of ``messages``, one per message in order; none at all when one
    is missing (a server before lease tokens), since the server takes one per id or
    none."""
    tokens = [m.lease_token for m in messages]
    return tokens if all(tokens) else []


def settled_event(settled) -> Settled:
    rejected = settled.rejected if settled.HasField("rejected") else None
    return Settled(
        acked=list(settled.acked),
        retried=list(settled.retried),
        dead_lettered=list(settled.dead_lettered),
        released=list(settled.released),
        extended=list(settled.extended),
        fenced=list(settled.fenced),
        rejected=list(rejected.ids) if rejected else [],
        rejected_reason=rejected.reason if rejected else "",
    )


def _text(error: str) -> str:
    """An error text the server stores: no NUL (which PostgreSQL cannot store), at most
    8 KiB (the server cuts longer ones anyway)."""
    return error.replace("\x00", "\ufffd")[:8192]


def make_options(servers: Union[str, Sequence[str]], outbox: str, *, name: str,
                 topics: Iterable[str], group: str, max_in_flight: int, lease: Optional[float],
                 credentials: Optional[Credentials], connect_timeout: float,
                 max_reconnects: Optional[int]) -> _Options:
    """The arguments of a subscriber (sync or asyncio), checked."""
    servers = [servers] if isinstance(servers, str) else list(servers)
    if not servers:
        raise ValueError("at least one server address")
    return _Options(
        servers=servers,
        outbox=outbox,
        name=name,
        topics=list(topics),
        group=group,
        max_in_flight=max_in_flight,
        lease_ms=0 if lease is None else round(lease * 1000),
        credentials=credentials or Credentials(),
        connect_timeout=connect_timeout,
        max_reconnects=max_reconnects,
    )


# gRPC status codes a reconnection cannot fix: the request itself is wrong.
PERMANENT_CODES = frozenset({"NOT_FOUND", "INVALID_ARGUMENT", "PERMISSION_DENIED",
                             "UNAUTHENTICATED", "UNIMPLEMENTED"})


class Reconnection:
    """What to do when a stream ended: give up, or reconnect to the next server after an
    exponential backoff with jitter (100 ms to 10 s), counted from the last stream that
    got subscribed."""

    def __init__(self, options: _Options):
        self.options = options
        self.failures = 0

    def after(self, error, subscribed: bool) -> Reconnecting:
        """``error`` (a gRPC error, or ``None`` when the server ended the stream) ended a
        stream; raises when no reconnection can help."""
        if error is not None and error.code().name in PERMANENT_CODES:
            raise SubscriptionRefused(error.code().name, error.details() or "")
        self.failures = 1 if subscribed else self.failures + 1
        limit = self.options.max_reconnects
        if limit is not None and self.failures > limit:
            raise ReconnectsExhausted(f"giving up after {limit} reconnections")
        delay = min(10.0, 0.1 * 2 ** (self.failures - 1)) * (0.5 + random.random() / 2)
        reason = (f"{error.code().name}: {error.details()}" if error is not None
                  else "the server ended the stream")
        return Reconnecting(reason, delay)

    def next_server(self, server: str) -> str:
        servers = self.options.servers
        return servers[(servers.index(server) + 1) % len(servers)]


def connect_error(options: _Options) -> ConnectError:
    return ConnectError(f"cannot connect to {', '.join(options.servers)} within "
                        f"{options.connect_timeout:g}s: is txoutboxd running there?")
