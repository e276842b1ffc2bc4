"""The subscriber on gRPC's threads: ``Subscriber.run(handler)`` blocks until stopped."""

from __future__ import annotations

import logging
import queue
import signal
import threading
from typing import Callable, Iterable, Optional, Sequence, Union

import grpc

from ._channel import open_channel
from ._session import Reconnection, Session, connect_error, make_options, settled_event
from ._types import Credentials, Draining, Event, LeasesExpired, Message, Subscribed
from .proto import relay_pb2_grpc

log = logging.getLogger("txoutbox_client")

Handler = Callable[[Message], None]


class Subscriber:
    """Holds a ``Subscribe`` stream open to a txoutboxd and hands each message to a
    handler: returning acks it; raising :class:`Nack`, :class:`DeadLetter` or
    :class:`Release` answers that instead; any other exception nacks it with its text.

    Messages are handled one at a time, in the order the server sends them (per key: in id
    order). Leases of held messages are extended while a handler runs; a drain, a restart
    or a broken connection means reconnecting with backoff (to the next of ``servers``).
    :meth:`stop` (or SIGINT/SIGTERM under :meth:`run_until_signal`) closes gracefully: the
    handler call in progress finishes and is answered, untouched messages go back with
    their attempt refunded, and ``run`` returns once the server has settled every answer.

    ``lease`` (seconds; ``None``: the outbox's ``lease``) is how long each message stays
    leased without an answer; ``max_in_flight`` how many the server sends before answers.
    ``group`` joins a subscription group of the outbox (required when it declares groups,
    and then without ``topics``): every group receives every row, and the subscribers of
    one group share its rows by key.
    """

    def __init__(
        self,
        servers: Union[str, Sequence[str]],
        outbox: str,
        *,
        name: str = "txoutbox-python",
        topics: Iterable[str] = (),
        group: str = "",
        max_in_flight: int = 100,
        lease: Optional[float] = None,
        credentials: Optional[Credentials] = None,
        connect_timeout: float = 10.0,
        max_reconnects: Optional[int] = None,
        on_event: Optional[Callable[[Event], None]] = None,
    ):
        self._options = make_options(
            servers, outbox, name=name, topics=topics, group=group, max_in_flight=max_in_flight,
            lease=lease, credentials=credentials, connect_timeout=connect_timeout,
            max_reconnects=max_reconnects)
        self._on_event = on_event
        self._stopping = threading.Event()
        self._lock = threading.Lock()  # guards the current stream's session
        self._current: Optional[_Stream] = None

    def run(self, handler: Handler) -> None:
        """Subscribes and handles messages until :meth:`stop`; raises
        :class:`SubscriberError` when it cannot go on."""
        options = self._options
        channels = {}
        try:
            server = self._connect(channels)
            reconnection = Reconnection(options)
            while not self._stopping.is_set():
                stream = _Stream(self, channels[server], server, handler)
                with self._lock:
                    self._current = stream
                error = stream.run()
                with self._lock:
                    self._current = None
                if self._stopping.is_set():
                    return
                reconnecting = reconnection.after(error, stream.session.subscribed)
                self._event(reconnecting)
                if self._stopping.wait(reconnecting.delay):
                    return
                server = reconnection.next_server(server)
                if server not in channels:
                    channels[server] = self._channel(server)
        finally:
            for channel in channels.values():
                channel.close()

    def run_until_signal(self, handler: Handler) -> None:
        """:meth:`run` with SIGINT and SIGTERM stopping it gracefully (from the main
        thread only); a second signal raises ``KeyboardInterrupt`` at once."""
        def on_signal(number, frame):
            if self._stopping.is_set():
                raise KeyboardInterrupt
            log.info("%s: finishing the publish in progress, releasing the rest",
                     signal.Signals(number).name)
            # Not here: the interrupted code may hold the lock `stop` takes.
            threading.Thread(target=self.stop, daemon=True).start()

        previous = {number: signal.signal(number, on_signal)
                    for number in (signal.SIGINT, signal.SIGTERM)}
        try:
            self.run(handler)
        finally:
            for number, handler_before in previous.items():
                signal.signal(number, handler_before)

    def stop(self) -> None:
        """Stops gracefully (see the class); safe from any thread, and more than once."""
        self._stopping.set()
        with self._lock:
            stream = self._current
        if stream is not None:
            stream.close()

    def _event(self, event: Event) -> None:
        log.debug("%s", event)
        if self._on_event is not None:
            self._on_event(event)

    def _channel(self, server: str):
        options = self._options
        return open_channel(grpc, server, options.credentials, options.channel_options)

    def _connect(self, channels) -> str:
        """The first server that accepts a connection within ``connect_timeout``."""
        options = self._options
        for server in options.servers:
            channels[server] = self._channel(server)
            try:
                grpc.channel_ready_future(channels[server]).result(timeout=options.connect_timeout)
                return server
            except grpc.FutureTimeoutError:
                continue
        raise connect_error(options)


class _Stream:
    """One subscription: the caller's thread reads responses, a worker thread runs the
    handler, a keeper thread extends leases. gRPC consumes the request iterator on a
    thread of its own, fed through a queue where ``None`` ends the request stream."""

    def __init__(self, subscriber: Subscriber, channel, server: str, handler: Handler):
        self.subscriber = subscriber
        self.server = server
        self.handler = handler
        self.stub = relay_pb2_grpc.RelayStub(channel)
        self.session = Session(subscriber._options)
        self.lock = threading.Lock()  # guards `session`
        self.outgoing: "queue.Queue" = queue.Queue()
        self.work = threading.Condition(self.lock)
        self.ended = threading.Event()

    def send(self, requests) -> None:
        """Under ``lock``: queues requests, and the end of the stream once closing and idle."""
        for request in requests:
            self.outgoing.put(request)
        if self.session.ready_to_half_close:
            self.session.half_closed = True
            self.outgoing.put(None)

    def requests(self):
        while (request := self.outgoing.get()) is not None:
            yield request

    def close(self) -> None:
        with self.lock:
            self.send(self.session.close())
            self.work.notify_all()

    def run(self) -> Optional[grpc.RpcError]:
        """Reads the stream until it ends; the gRPC error that ended it, if any."""
        options = self.subscriber._options
        with self.lock:
            self.outgoing.put(self.session.open())
        if self.subscriber._stopping.is_set():
            self.close()
        metadata = options.credentials._metadata()
        responses = self.stub.Subscribe(self.requests(), metadata=metadata)
        worker = threading.Thread(target=self.publish_loop, name="txoutbox-publisher", daemon=True)
        keeper = threading.Thread(target=self.keep_leases, name="txoutbox-leases", daemon=True)
        worker.start()
        try:
            for response in responses:
                kind = response.WhichOneof("response")
                if kind == "subscribed":
                    s = response.subscribed
                    with self.lock:
                        self.session.subscribed = True
                        self.session.lease_ms = s.lease_ms
                    self.subscriber._event(Subscribed(self.server, s.owner, s.lease_ms,
                                                      s.max_in_flight, s.max_attempts))
                    keeper.start()
                elif kind == "batch":
                    with self.lock:
                        self.session.on_batch(response.batch)
                        self.work.notify_all()
                elif kind == "settled":
                    self.subscriber._event(settled_event(response.settled))
                elif kind == "leases_expired":
                    ids = list(response.leases_expired.ids)
                    with self.lock:
                        self.send(self.session.on_leases_expired(ids))
                    self.subscriber._event(LeasesExpired(ids))
                elif kind == "draining":
                    with self.lock:
                        self.session.draining = True
                    self.subscriber._event(Draining())
            return None
        except grpc.RpcError as error:
            return error
        except BaseException:
            responses.cancel()  # ends the stream at once; the server gives back what we held
            raise
        finally:
            with self.lock:
                self.ended.set()
                self.work.notify_all()
            self.outgoing.put(None)  # lets gRPC's request thread finish in every case
            # A handler call in progress finishes before the next stream opens, so a key's
            # messages are never published by two streams of this subscriber at once.
            worker.join()

    def publish_loop(self) -> None:
        while True:
            with self.lock:
                message = self.session.next_message()
                while message is None and not self.ended.is_set():
                    self.work.wait()
                    message = self.session.next_message()
                if message is None:
                    return
            try:
                self.handler(message)
                error = None
            except Exception as failure:  # the handler's failure is the message's outcome
                error = failure
            with self.lock:
                self.send(self.session.answer(message, error))

    def keep_leases(self) -> None:
        """Extends every held message's lease each third of the lease."""
        interval = max(0.1, self.session.lease_ms / 3000)
        while not self.ended.wait(interval):
            with self.lock:
                request = self.session.extension()
                if request is not None:
                    self.send([request])
