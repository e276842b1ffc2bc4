"""The subscriber on asyncio: ``await AsyncSubscriber.run(handler)`` with an async handler."""

from __future__ import annotations

import asyncio
import logging
import signal
from typing import Awaitable, Callable, Iterable, Optional, Sequence, Union

import grpc
import grpc.aio

from ._channel import open_channel
from ._session import Reconnection, Session, connect_error, make_options, settled_event
from ._types import Credentials, Draining, Event, LeasesExpired, Message, Subscribed
from .proto import relay_pb2_grpc

log = logging.getLogger("txoutbox_client")

AsyncHandler = Callable[[Message], Awaitable[None]]


class AsyncSubscriber:
    """:class:`Subscriber` for asyncio, with the same arguments and rules: the handler is
    a coroutine function, awaited for one message at a time; :meth:`stop` closes
    gracefully and ``run`` returns once the server has settled every answer."""

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
        self._stopping = asyncio.Event()
        self._current: Optional[_Stream] = None

    async def run(self, handler: AsyncHandler) -> None:
        """Subscribes and handles messages until :meth:`stop`; raises
        :class:`SubscriberError` when it cannot go on."""
        options = self._options
        channels = {}
        try:
            server = await self._connect(channels)
            reconnection = Reconnection(options)
            while not self._stopping.is_set():
                stream = _Stream(self, channels[server], server, handler)
                self._current = stream
                error = await stream.run()
                self._current = None
                if self._stopping.is_set():
                    return
                reconnecting = reconnection.after(error, stream.session.subscribed)
                self._event(reconnecting)
                try:
                    await asyncio.wait_for(self._stopping.wait(), reconnecting.delay)
                    return
                except asyncio.TimeoutError:
                    pass
                server = reconnection.next_server(server)
                if server not in channels:
                    channels[server] = self._channel(server)
        finally:
            for channel in channels.values():
                await channel.close()

    async def run_until_signal(self, handler: AsyncHandler) -> None:
        """:meth:`run` with SIGINT and SIGTERM stopping it gracefully; a second signal
        cancels it at once."""
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()

        def on_signal(number):
            if self._stopping.is_set():
                task.cancel()
                return
            log.info("%s: finishing the publish in progress, releasing the rest",
                     signal.Signals(number).name)
            self.stop()

        for number in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(number, on_signal, number)
        try:
            await self.run(handler)
        finally:
            for number in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(number)

    def stop(self) -> None:
        """Stops gracefully (see the class); from the event loop's thread, more than once."""
        self._stopping.set()
        if self._current is not None:
            self._current.close()

    def _event(self, event: Event) -> None:
        log.debug("%s", event)
        if self._on_event is not None:
            self._on_event(event)

    def _channel(self, server: str):
        options = self._options
        return open_channel(grpc.aio, server, options.credentials, options.channel_options)

    async def _connect(self, channels) -> str:
        options = self._options
        for server in options.servers:
            channels[server] = self._channel(server)
            try:
                await asyncio.wait_for(channels[server].channel_ready(), options.connect_timeout)
                return server
            except asyncio.TimeoutError:
                continue
        raise connect_error(options)


class _Stream:
    """One subscription: ``run`` reads responses, a task runs the handler, another
    extends leases; requests go through a queue where ``None`` ends the request stream."""

    def __init__(self, subscriber: AsyncSubscriber, channel, server: str, handler: AsyncHandler):
        self.subscriber = subscriber
        self.server = server
        self.handler = handler
        self.stub = relay_pb2_grpc.RelayStub(channel)
        self.session = Session(subscriber._options)
        self.outgoing: "asyncio.Queue" = asyncio.Queue()
        self.work = asyncio.Event()
        self.ended = asyncio.Event()

    def send(self, requests) -> None:
        for request in requests:
            self.outgoing.put_nowait(request)
        if self.session.ready_to_half_close:
            self.session.half_closed = True
            self.outgoing.put_nowait(None)

    async def requests(self):
        while (request := await self.outgoing.get()) is not None:
            yield request

    def close(self) -> None:
        self.send(self.session.close())
        self.work.set()

    async def run(self) -> Optional[grpc.aio.AioRpcError]:
        options = self.subscriber._options
        self.outgoing.put_nowait(self.session.open())
        if self.subscriber._stopping.is_set():
            self.close()
        call = self.stub.Subscribe(self.requests(), metadata=options.credentials._metadata())
        worker = asyncio.ensure_future(self.publish_loop())
        keeper = None
        try:
            async for response in call:
                kind = response.WhichOneof("response")
                if kind == "subscribed":
                    s = response.subscribed
                    self.session.subscribed = True
                    self.session.lease_ms = s.lease_ms
                    self.subscriber._event(Subscribed(self.server, s.owner, s.lease_ms,
                                                      s.max_in_flight, s.max_attempts))
                    keeper = asyncio.ensure_future(self.keep_leases())
                elif kind == "batch":
                    self.session.on_batch(response.batch)
                    self.work.set()
                elif kind == "settled":
                    self.subscriber._event(settled_event(response.settled))
                elif kind == "leases_expired":
                    ids = list(response.leases_expired.ids)
                    self.send(self.session.on_leases_expired(ids))
                    self.subscriber._event(LeasesExpired(ids))
                elif kind == "draining":
                    self.session.draining = True
                    self.subscriber._event(Draining())
            return None
        except grpc.aio.AioRpcError as error:
            return error
        except BaseException:
            # Cancelled (a second signal): the stream ends at once, the handler call too;
            # the server gives back what we held.
            call.cancel()
            worker.cancel()
            raise
        finally:
            self.ended.set()
            self.work.set()
            self.outgoing.put_nowait(None)
            if keeper is not None:
                keeper.cancel()
            # The handler call in progress finishes before the next stream opens, so a
            # key's messages are never published by two streams of this subscriber at once.
            await asyncio.gather(worker, return_exceptions=True)

    async def publish_loop(self) -> None:
        while True:
            message = self.session.next_message()
            while message is None and not self.ended.is_set():
                self.work.clear()
                await self.work.wait()
                message = self.session.next_message()
            if message is None:
                return
            try:
                await self.handler(message)
                error = None
            except Exception as failure:  # the handler's failure is the message's outcome
                error = failure
            self.send(self.session.answer(message, error))

    async def keep_leases(self) -> None:
        interval = max(0.1, self.session.lease_ms / 3000)
        while True:
            await asyncio.sleep(interval)
            request = self.session.extension()
            if request is not None:
                self.send([request])
