#!/usr/bin/env python3
"""A txoutbox publisher in Python: subscribe to an outbox, "publish", ack.

This is the example to copy when writing a txoutbox publisher in Python. It opens the
bidirectional ``txoutbox.v1.Relay/Subscribe`` stream of a running ``txoutboxd``,
prints one JSON line per message it receives (standing in for publishing to a broker),
and answers each one on the same stream. The server does the hard parts (leases,
fencing, retries with backoff, dead-lettering, per-key ordering); a client only has to
answer every message it is given.

The stubs are generated at run time from the .proto files with grpcio-tools, into a
cache directory (``generated/`` beside this file, or ``$TXOUTBOX_STUBS_DIR``), so there
is no generated code to keep in sync.

Run it (from the repository root, with txoutboxd running on its default address) with
the wrapper that makes its venv on first use:

    client/python/subscribe --server 127.0.0.1:7411 --outbox orders --subscriber python-example

or, in a venv of your own with ``pip install -r client/python/requirements.txt``, as
``python client/python/txoutbox_subscriber.py`` with the same options.

What it does besides printing and acking, as the Node example does:

- acks each message as soon as it is published, and nacks a failure (with a retry
  delay), publishing nothing more of that key from the batch (the server gives those
  back, in order, listed as ``released`` in the nack's settlement);
- publishes on a worker thread while the main thread keeps reading the stream, and
  extends the leases of everything it still holds (``extend_lease`` every third of the
  lease the ``subscribed`` response gave) while a publish is slow, so the server does
  not hand those messages to someone else;
- on ``draining`` (the server is shutting down) takes no new batch, finishes and
  answers what it holds; when the stream ends or breaks it reconnects with exponential
  backoff and jitter (100ms to 10s), like after a server restart.

Options worth knowing: ``--count N`` stops after N messages are acked (and confirmed by
the server); ``--nack-first-attempt`` fails every first attempt to show retries;
``--publish-delay-ms MS`` makes each publish slow, to watch leases being extended.

The shape of the conversation, in protocol terms:

    client -> open        (outbox, subscriber, window, lease)
    server <- subscribed  (effective lease, window, max_attempts)
    server <- batch       (messages, in id order)        whenever the window has room
    client -> ack / nack / release / extend_lease / set_window
    server <- settled     (one per answer: acked, retried, released, extended, fenced...)
    server <- draining    (the server is shutting down: answer what you hold)
"""

import argparse
import collections
import hashlib
import importlib.metadata
import json
import os
import queue
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_PROTO_DIR = HERE.parent.parent / "proto"
PROTO_FILES = ["txoutbox/v1/message.proto", "txoutbox/v1/relay.proto", "txoutbox/v1/admin.proto"]

try:
    import grpc
except ImportError:
    sys.exit("txoutbox_subscriber: grpcio is not installed: run client/python/subscribe instead, "
             "which makes a venv with it, or pip install -r client/python/requirements.txt")


def load_stubs(proto_dir):
    """Generates the Python stubs (once per proto content) and imports them.

    Returns the modules ``relay_pb2`` (messages) and ``relay_pb2_grpc`` (the stub class).
    """
    sources = [proto_dir / name for name in PROTO_FILES]
    missing = [str(path) for path in sources if not path.is_file()]
    if missing:
        sys.exit(f"txoutbox_subscriber: proto files not found: {', '.join(missing)}; pass --proto-dir")

    # Generated code must match both the .proto files and the grpcio-tools version that
    # wrote it (protobuf checks the version of its generator), so both name the cache.
    digest = hashlib.sha256(importlib.metadata.version("grpcio-tools").encode())
    for path in sources:
        digest.update(path.read_bytes())
    cache_root = Path(os.environ.get("TXOUTBOX_STUBS_DIR", HERE / "generated"))
    out_dir = cache_root / digest.hexdigest()[:16]

    if not out_dir.is_dir():
        cache_root.mkdir(parents=True, exist_ok=True)
        # Generate into a fresh directory, then rename it into place: two clients
        # starting at once never see half-written stubs.
        scratch = Path(tempfile.mkdtemp(prefix="protoc-", dir=cache_root))
        command = [sys.executable, "-m", "grpc_tools.protoc", f"-I{proto_dir}",
                   f"--python_out={scratch}", f"--grpc_python_out={scratch}", *PROTO_FILES]
        try:
            result = subprocess.run(command, capture_output=True, text=True)
            if result.returncode != 0:
                sys.exit(f"txoutbox_subscriber: generating the stubs failed:\n{result.stderr}")
            # Regular packages (not namespace ones), so that another installed package
            # named `txoutbox` (the original Python library is one) cannot shadow them.
            (scratch / "txoutbox" / "__init__.py").touch()
            (scratch / "txoutbox" / "v1" / "__init__.py").touch()
            scratch.rename(out_dir)
        except OSError:
            pass  # another process renamed its copy into place first: use that one
        finally:
            shutil.rmtree(scratch, ignore_errors=True)  # gone already after a rename

    sys.path.insert(0, str(out_dir))
    from txoutbox.v1 import relay_pb2, relay_pb2_grpc

    return relay_pb2, relay_pb2_grpc


def parse_args():
    parser = argparse.ArgumentParser(
        description="Subscribe to a txoutbox outbox, print each message as JSON, ack it.",
        epilog="Example: %(prog)s --server 127.0.0.1:7411 --outbox orders --count 10",
    )
    parser.add_argument("--server", default="127.0.0.1:7411", help="txoutboxd address, host:port")
    parser.add_argument("--outbox", default="orders", help="name of a configured outbox")
    parser.add_argument("--subscriber", default="python-example", help="name in the server's logs")
    parser.add_argument("--topic", action="append", default=[], dest="topics",
                        help="only this topic (repeatable); default: every topic")
    parser.add_argument("--max-in-flight", type=int, default=100,
                        help="most messages held unanswered at once (1-10000)")
    parser.add_argument("--lease-ms", type=int, default=0,
                        help="lease per message in ms; 0 uses the outbox's lease")
    parser.add_argument("--count", type=int, default=0,
                        help="exit after this many messages are acked; 0 runs until interrupted")
    parser.add_argument("--nack-first-attempt", action="store_true",
                        help="fail (nack) every message on its first attempt, to show retries")
    parser.add_argument("--publish-delay-ms", type=int, default=0,
                        help="make each publish this slow, to watch lease extension")
    parser.add_argument("--timestamps", action="store_true",
                        help="add published_at_us (Unix time in microseconds) to each JSON line")
    parser.add_argument("--connect-timeout", type=float, default=10.0,
                        help="seconds to wait for the server to accept a connection at start")
    parser.add_argument("--max-reconnects", type=int, default=-1,
                        help="give up (exit 1) after this many reconnections in a row; -1 never")
    parser.add_argument("--proto-dir", type=Path, default=DEFAULT_PROTO_DIR,
                        help="directory holding txoutbox/v1/*.proto")
    parser.add_argument("--token", default=os.environ.get("TXOUTBOX_TOKEN"),
                        help="bearer token of an identity the server knows (default: $TXOUTBOX_TOKEN)")
    parser.add_argument("--tls-ca", type=Path,
                        help="connect with TLS, trusting this CA certificate (PEM)")
    parser.add_argument("--tls-cert", type=Path,
                        help="mutual TLS: this client certificate (PEM), with --tls-key")
    parser.add_argument("--tls-key", type=Path, help="the client certificate's private key (PEM)")
    parser.add_argument("--tls", action="store_true",
                        help="connect with TLS, trusting the system's CA certificates")
    args = parser.parse_args()
    if (args.tls_cert is None) != (args.tls_key is None):
        parser.error("--tls-cert and --tls-key go together")
    return args


def open_channel(args):
    """A plain channel, or a TLS one when any --tls option is given; the token, if any,
    goes with every call (gRPC sends call credentials only over TLS, hence the
    interceptor on plain channels, where the server is on loopback)."""
    use_tls = args.tls or args.tls_ca or args.tls_cert
    if use_tls:
        read = lambda path: path.read_bytes() if path else None
        credentials = grpc.ssl_channel_credentials(
            root_certificates=read(args.tls_ca),
            private_key=read(args.tls_key),
            certificate_chain=read(args.tls_cert),
        )
        channel = grpc.secure_channel(args.server, credentials)
    else:
        channel = grpc.insecure_channel(args.server)
    if args.token:
        metadata = (("authorization", f"Bearer {args.token}"),)

        class Details(collections.namedtuple("Details", ("method", "timeout", "metadata",
                      "credentials", "wait_for_ready", "compression")), grpc.ClientCallDetails):
            pass

        class Token(grpc.UnaryUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
            def _with_token(self, details):
                return Details(details.method, details.timeout,
                               list(details.metadata or ()) + list(metadata),
                               details.credentials, details.wait_for_ready, details.compression)

            def intercept_unary_unary(self, continuation, details, request):
                return continuation(self._with_token(details), request)

            def intercept_stream_stream(self, continuation, details, requests):
                return continuation(self._with_token(details), requests)

        channel = grpc.intercept_channel(channel, Token())
    return channel


def log(text):
    """Diagnostics go to stderr; stdout carries only the JSON lines of messages."""
    print(f"txoutbox_subscriber: {text}", file=sys.stderr, flush=True)


def publish(message, answer, delay_ms, timestamps=False):
    """Stands in for publishing to a broker: one JSON line per message on stdout.

    With ``timestamps``, the line carries the moment of the publish (the fault-injection
    suite merges the lines of several subscribers into one history by it).
    """
    if delay_ms > 0:
        time.sleep(delay_ms / 1000)  # a slow broker
    line = {
        "id": message.id,
        "topic": message.topic,
        "key": message.key if message.HasField("key") else None,
        "payload": message.payload.decode("utf-8", errors="replace"),
        "headers": dict(message.headers),
        "attempts": message.attempts,
        "created_at": message.created_at.ToJsonString(),
        "answer": answer,
    }
    if timestamps:
        line["published_at_us"] = time.time_ns() // 1000
    print(json.dumps(line), flush=True)


# Errors a reconnection cannot fix: the request itself is wrong.
PERMANENT = {grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT,
             grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED,
             grpc.StatusCode.UNIMPLEMENTED}


class Totals:
    """What outlives one stream: acks sent and confirmed, counted against --count."""

    def __init__(self):
        self.acks_sent = 0   # messages we answered with an ack
        self.acked = set()   # ids the server confirmed as delivered


def run(args, pb, pb_grpc):
    with open_channel(args) as channel:
        try:
            grpc.channel_ready_future(channel).result(timeout=args.connect_timeout)
        except grpc.FutureTimeoutError:
            log(f"cannot connect to {args.server} within {args.connect_timeout:g}s: "
                "is txoutboxd running there? (--server host:port)")
            return 2
        stub = pb_grpc.RelayStub(channel)
        totals = Totals()
        reconnects = 0
        while True:
            session = Session(args, pb, totals)
            error = session.run(stub)
            if args.count and len(totals.acked) >= args.count:
                log("stream closed")
                return 0
            if error is not None and error.code() in PERMANENT:
                log(f"the stream failed: {error.code().name}: {error.details()}")
                return 1
            if session.subscribed:
                reconnects = 0  # it was connected: start again from a short delay
            # A drain, a restart or a broken stream: reconnect with exponential backoff
            # and jitter.
            reconnects += 1
            if 0 <= args.max_reconnects < reconnects:
                log(f"giving up after {args.max_reconnects} reconnections")
                return 1
            delay = min(10.0, 0.1 * 2 ** (reconnects - 1)) * (0.5 + random.random() / 2)
            why = (f"{error.code().name}: {error.details()}" if error is not None
                   else "the server ended the stream")
            log(f"{why}; reconnecting in {delay * 1000:.0f} ms")
            time.sleep(delay)


class Session:
    """One subscription, from ``open`` until the stream ends.

    Three threads share it: the main thread reads responses (``run``), a worker publishes
    batches in order (``work``), and a lease keeper extends the leases of what is held
    (``keep_leases``). gRPC consumes the request iterator on a thread of its own; requests
    reach it through a ``queue.Queue``, where ``None`` ends the request stream, which
    closes the subscription cleanly (the server gives back anything still held).
    """

    def __init__(self, args, pb, totals):
        self.args, self.pb, self.totals = args, pb, totals
        self.outgoing = queue.Queue()
        self.batches = queue.Queue()      # batches to publish, in order; None stops the worker
        self.lock = threading.Lock()      # guards `held` and `publishing`
        self.held = {}                    # id -> message: received, not answered yet
        self.publishing = None            # id of the message being published
        self.lease_ms = args.lease_ms
        self.subscribed = False
        self.draining = False
        self.closing = False
        self.ended = threading.Event()    # the stream is over: worker and keeper stop

    def send(self, **request):
        self.outgoing.put(self.pb.SubscribeRequest(**request))

    def requests(self):
        while (request := self.outgoing.get()) is not None:
            yield request

    def run(self, stub):
        """Reads the stream until it ends; returns the gRPC error that ended it, if any."""
        args, pb = self.args, self.pb
        self.send(open=pb.OpenSubscription(
            outbox=args.outbox,
            subscriber=args.subscriber,
            topics=args.topics,
            max_in_flight=args.max_in_flight,
            lease_ms=args.lease_ms,
        ))
        worker = threading.Thread(target=self.work, name="publisher", daemon=True)
        keeper = threading.Thread(target=self.keep_leases, name="lease-keeper", daemon=True)
        responses = stub.Subscribe(self.requests())
        worker.start()
        try:
            for response in responses:
                kind = response.WhichOneof("response")
                if kind == "subscribed":
                    s = response.subscribed
                    self.lease_ms = s.lease_ms
                    self.subscribed = True
                    log(f"subscribed to {args.outbox!r} as {s.owner} "
                        f"(lease {s.lease_ms} ms, window {s.max_in_flight}, max attempts {s.max_attempts})")
                    keeper.start()
                elif kind == "batch":
                    if self.closing or self.draining:
                        # Sent before the server saw us close; it takes them back itself.
                        continue
                    with self.lock:
                        self.held.update((m.id, m) for m in response.batch.messages)
                    self.batches.put(response.batch)
                elif kind == "settled":
                    self.totals.acked.update(report_settled(response.settled))
                    if args.count and len(self.totals.acked) >= args.count:
                        self.close(f"{len(self.totals.acked)} messages acked; closing the stream")
                elif kind == "leases_expired":
                    ids = list(response.leases_expired.ids)
                    log(f"leases ran out before we answered, stop publishing: {ids}")
                    with self.lock:
                        for id in ids:
                            self.held.pop(id, None)
                elif kind == "draining":
                    self.draining = True
                    log("the server is draining: answering what we hold, then reconnecting")
            return None
        except grpc.RpcError as error:
            return error
        except KeyboardInterrupt:
            responses.cancel()  # ends the stream at once; the server gives back what we held
            raise
        finally:
            self.ended.set()
            self.batches.put(None)
            self.outgoing.put(None)  # lets gRPC's request thread finish in every case
            # A publish in progress finishes before the next stream starts, so a key's
            # messages are never published by two streams at once.
            worker.join()

    def close(self, why):
        """Takes nothing new, gives back what is untouched (attempt refunded) and ends the
        request stream once the publish in progress is answered."""
        with self.lock:
            if self.closing:
                return
            # Under the lock: the worker starts no message once this is set.
            self.closing = True
            untouched = [id for id in self.held if id != self.publishing]
        log(why)
        self.send(set_window=self.pb.SetWindow(max_in_flight=0))
        if untouched:
            self.send(release=self.pb.ReleaseMessages(ids=untouched))
        self.batches.put(None)  # the worker ends the request stream when it stops

    def keep_leases(self):
        """While anything is held, extends its lease every third of the lease: one request
        for all ids, so a slow publish does not let the others' leases run out."""
        interval = max(0.1, self.lease_ms / 3000)
        while not self.ended.wait(interval):
            with self.lock:
                ids = list(self.held)
            if ids and self.lease_ms > 0 and not self.closing:
                self.send(extend_lease=self.pb.ExtendLeases(ids=ids, lease_ms=self.lease_ms))

    def work(self):
        """Publishes batches in order until told to stop."""
        while (batch := self.batches.get()) is not None:
            if self.closing or self.ended.is_set():
                break
            self.publish_batch(batch)
        if self.closing and not self.ended.is_set():
            self.outgoing.put(None)

    def publish_batch(self, batch):
        """Publishes a batch in order, answering each message as soon as it is published.

        After a failure, the later messages of the same key in this batch must not be
        published: the server gives them back (they come back later, in order) and lists
        them as ``released`` in the settlement of the nack.
        """
        args, pb = self.args, self.pb
        failed_keys = set()
        for message in batch.messages:
            key = message.key if message.HasField("key") else None
            with self.lock:
                if self.closing or self.ended.is_set():
                    return  # `close` gave back what is untouched; the server, after a break
                if message.id not in self.held:
                    continue  # its lease ran out: someone else may have it now
                self.publishing = message.id
            if key is not None and key in failed_keys:
                pass  # the server releases it
            elif args.count and self.totals.acks_sent >= args.count:
                self.send(release=pb.ReleaseMessages(ids=[message.id]))  # more than asked for: untried
            elif args.nack_first_attempt and message.attempts == 1:
                publish(message, "nack", args.publish_delay_ms, args.timestamps)
                self.send(nack=pb.NackMessage(
                    id=message.id, retry_delay_ms=200,
                    error="nacked on purpose: first attempt (--nack-first-attempt)"))
                if key is not None:
                    failed_keys.add(key)
            else:
                publish(message, "ack", args.publish_delay_ms, args.timestamps)
                # At once, not after the batch: until its ack is sent a message stays held
                # and its lease is extended, so a slow batch loses none of its messages.
                self.send(ack=pb.AckMessages(ids=[message.id]))
                self.totals.acks_sent += 1
            with self.lock:
                self.held.pop(message.id, None)
                self.publishing = None


def report_settled(settled):
    """Logs what the server did with one answer; returns the ids it marked delivered."""
    outcomes = [f"{field} {list(getattr(settled, field))}"
                for field in ("retried", "dead_lettered", "released", "fenced")
                if getattr(settled, field)]
    if settled.HasField("rejected"):
        # Nothing was applied; the messages stay held by this stream.
        outcomes.append(f"rejected {list(settled.rejected.ids)}: {settled.rejected.reason}")
    if outcomes:
        log(f"settled: {', '.join(outcomes)}")
    return list(settled.acked)


def main():
    args = parse_args()
    try:
        pb, pb_grpc = load_stubs(args.proto_dir.resolve())
        sys.exit(run(args, pb, pb_grpc))
    except KeyboardInterrupt:
        log("interrupted")
        sys.exit(130)


if __name__ == "__main__":
    main()
