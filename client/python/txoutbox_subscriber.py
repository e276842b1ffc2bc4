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

Options worth knowing: ``--count N`` stops after N messages are acked (and confirmed by
the server); ``--nack-first-attempt`` fails every first attempt to show retries.

The shape of the conversation, in protocol terms:

    client -> open        (outbox, subscriber, window, lease)
    server <- subscribed  (effective lease, window, max_attempts)
    server <- batch       (messages, in id order)        whenever the window has room
    client -> ack / nack  (answers)
    server <- settled     (one per answer: acked, retried, released, fenced ids...)
    server <- draining    (the server is shutting down: answer what you hold)
"""

import argparse
import collections
import hashlib
import importlib.metadata
import json
import os
import queue
import shutil
import subprocess
import sys
import tempfile
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
    parser.add_argument("--timestamps", action="store_true",
                        help="add published_at_us (Unix time in microseconds) to each JSON line")
    parser.add_argument("--connect-timeout", type=float, default=10.0,
                        help="seconds to wait for the server to accept a connection")
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


def publish(message, answer, timestamps=False):
    """Stands in for publishing to a broker: one JSON line per message on stdout.

    With ``timestamps``, the line carries the moment of the publish (the fault-injection
    suite merges the lines of several subscribers into one history by it).
    """
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


def run(args, pb, pb_grpc):
    # Requests are fed to gRPC through a queue: gRPC pulls them from the iterator on its
    # own thread while this thread reads responses. `None` ends the request stream, which
    # closes the subscription cleanly (the server gives back anything still held).
    outgoing = queue.Queue()

    def requests():
        while (request := outgoing.get()) is not None:
            yield request

    outgoing.put(pb.SubscribeRequest(open=pb.OpenSubscription(
        outbox=args.outbox,
        subscriber=args.subscriber,
        topics=args.topics,
        max_in_flight=args.max_in_flight,
        lease_ms=args.lease_ms,
    )))

    with open_channel(args) as channel:
        try:
            grpc.channel_ready_future(channel).result(timeout=args.connect_timeout)
        except grpc.FutureTimeoutError:
            log(f"cannot connect to {args.server} within {args.connect_timeout:g}s: "
                "is txoutboxd running there? (--server host:port)")
            return 2

        responses = pb_grpc.RelayStub(channel).Subscribe(requests())
        acks_sent = 0        # messages we answered with an ack (counted against --count)
        acked = set()        # ids the server confirmed as delivered
        closed = False
        try:
            for response in responses:
                kind = response.WhichOneof("response")
                if kind == "subscribed":
                    s = response.subscribed
                    log(f"subscribed to {args.outbox!r} as {s.owner} "
                        f"(lease {s.lease_ms} ms, window {s.max_in_flight}, max attempts {s.max_attempts})")
                elif kind == "batch":
                    if closed:
                        # Sent before the server saw our close; it gives them back itself.
                        continue
                    acks_sent += handle_batch(response.batch, args, pb, outgoing, acks_sent)
                elif kind == "settled":
                    acked.update(report_settled(response.settled))
                    if args.count and len(acked) >= args.count and not closed:
                        log(f"{len(acked)} messages acked; closing the stream")
                        outgoing.put(None)
                        closed = True
                elif kind == "leases_expired":
                    log(f"leases ran out before we answered, stop publishing: {list(response.leases_expired.ids)}")
                elif kind == "draining":
                    log("the server is draining: it sends no more messages and ends the stream soon")
        except grpc.RpcError as error:
            log(f"the stream failed: {error.code().name}: {error.details()}")
            return 1
        except KeyboardInterrupt:
            responses.cancel()  # ends the stream at once; the server gives back what we held
            raise
        finally:
            outgoing.put(None)  # lets gRPC's request thread finish in every case

    if args.count and len(acked) < args.count:
        log(f"the server ended the stream after {len(acked)} of {args.count} acks")
        return 1
    log("stream closed" if closed else "the server ended the stream")
    return 0


def handle_batch(batch, args, pb, outgoing, acks_sent):
    """Publishes a batch in order and answers it; returns how many messages were acked.

    Successes are acked together in one request after the batch; a failure is nacked at
    once. After a failure, the later messages of the same key in this batch must not be
    published: the server gives them back (they come back later, in order) and lists
    them as `released` in the settlement of the nack.
    """
    to_ack, to_release, failed_keys = [], [], set()
    for message in batch.messages:
        key = message.key if message.HasField("key") else None
        if key is not None and key in failed_keys:
            continue
        if args.count and acks_sent + len(to_ack) >= args.count:
            to_release.append(message.id)  # more than we were asked for: give it back untried
            continue
        if args.nack_first_attempt and message.attempts == 1:
            publish(message, "nack", args.timestamps)
            outgoing.put(pb.SubscribeRequest(nack=pb.NackMessage(
                id=message.id, error="nacked on purpose: first attempt (--nack-first-attempt)")))
            if key is not None:
                failed_keys.add(key)
            continue
        publish(message, "ack", args.timestamps)
        to_ack.append(message.id)
    if to_ack:
        outgoing.put(pb.SubscribeRequest(ack=pb.AckMessages(ids=to_ack)))
    if to_release:
        outgoing.put(pb.SubscribeRequest(release=pb.ReleaseMessages(ids=to_release)))
    return len(to_ack)


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
