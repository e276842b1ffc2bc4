"""``txoutbox-subscribe``: subscribe to an outbox, print each message as one JSON line on
stdout (where a real publisher would send it to a broker) and ack it. What the server says
goes to stderr.

Exit codes: 0 done (``--count`` reached) or stopped by SIGINT/SIGTERM; 1 the server
refused the subscription (an unknown outbox, credentials) or ``--max-reconnects`` ran out;
2 no server at start, or bad options; 130 a second SIGINT/SIGTERM while stopping.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Optional, Set

from . import (ConnectError, Credentials, Draining, LeasesExpired, Message, Nack,
               ReconnectsExhausted, Reconnecting, Release, Settled, Subscribed, Subscriber,
               SubscriptionRefused)

log = logging.getLogger("txoutbox_client.cli")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="txoutbox-subscribe",
        description="Subscribe to a txoutbox outbox, print each message as a JSON line, ack it.",
        epilog="Example: %(prog)s --server 127.0.0.1:7411 --outbox default --count 10",
    )
    parser.add_argument("--server", action="append", dest="servers",
                        help="txoutboxd address, host:port (repeatable: replicas, tried in "
                             "turn); default 127.0.0.1:7411")
    parser.add_argument("--outbox", default="default",
                        help="a configured outbox (default: default, the embedded one)")
    parser.add_argument("--subscriber", default="txoutbox-subscribe",
                        help="this subscriber's name in the server's logs and stats")
    parser.add_argument("--topic", action="append", default=[], dest="topics",
                        help="only this topic (repeatable); default: every topic")
    parser.add_argument("--group", default="",
                        help="join this subscription group of the outbox (required when it "
                             "declares groups; not with --topic)")
    parser.add_argument("--max-in-flight", type=int, default=100,
                        help="most messages held unanswered at once (1-10000)")
    parser.add_argument("--lease-ms", type=int, default=0,
                        help="lease per message in ms; 0 uses the outbox's lease")
    parser.add_argument("--count", type=int, default=0,
                        help="exit after this many messages are acked and the server "
                             "confirmed it; 0 runs until interrupted")
    parser.add_argument("--nack-first-attempt", action="store_true",
                        help="fail (nack, retry in 200ms) every first attempt, to show retries")
    parser.add_argument("--publish-delay-ms", type=int, default=0,
                        help="make each publish this slow, to watch lease extension")
    parser.add_argument("--timestamps", action="store_true",
                        help="add published_at_us (Unix time in microseconds) to each line")
    parser.add_argument("--connect-timeout", type=float, default=10.0,
                        help="seconds to wait for a server to accept a connection at start")
    parser.add_argument("--max-reconnects", type=int, default=-1,
                        help="give up (exit 1) after this many reconnections in a row; -1 never")
    parser.add_argument("--token", default=os.environ.get("TXOUTBOX_TOKEN"),
                        help="bearer token of an identity the server knows "
                             "(default: $TXOUTBOX_TOKEN)")
    parser.add_argument("--tls-ca", type=Path,
                        help="connect with TLS, trusting this CA certificate (PEM)")
    parser.add_argument("--tls-cert", type=Path,
                        help="mutual TLS: this client certificate (PEM), with --tls-key")
    parser.add_argument("--tls-key", type=Path, help="the client certificate's private key (PEM)")
    parser.add_argument("--tls", action="store_true",
                        help="connect with TLS, trusting the system's CA certificates")
    args = parser.parse_args(argv)
    if (args.tls_cert is None) != (args.tls_key is None):
        parser.error("--tls-cert and --tls-key go together")
    args.servers = args.servers or ["127.0.0.1:7411"]
    return args


def json_line(message: Message, answer: str, timestamps: bool) -> str:
    line = {
        "id": message.id,
        "topic": message.topic,
        "key": message.key,
        "payload": message.payload.decode("utf-8", errors="replace"),
        "headers": message.headers,
        "attempts": message.attempts,
        "created_at": message.created_at.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        "answer": answer,
    }
    if timestamps:
        # The fault-injection suite merges the lines of several subscribers by it.
        line["published_at_us"] = time.time_ns() // 1000
    return json.dumps(line)


class Printer:
    """The handler: prints, then acks (or nacks on purpose); counts toward ``--count``."""

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.acks_sent = 0
        self.acked: Set[int] = set()
        self.subscriber: Optional[Subscriber] = None
        self.closing = False

    def __call__(self, message: Message) -> None:
        args = self.args
        if args.count and self.acks_sent >= args.count:
            raise Release()  # more than asked for: given back untried
        if args.publish_delay_ms > 0:
            time.sleep(args.publish_delay_ms / 1000)  # a slow broker
        if args.nack_first_attempt and message.attempts == 1:
            print(json_line(message, "nack", args.timestamps), flush=True)
            raise Nack("nacked on purpose: first attempt (--nack-first-attempt)", retry_after=0.2)
        print(json_line(message, "ack", args.timestamps), flush=True)
        self.acks_sent += 1

    def on_event(self, event) -> None:
        args = self.args
        if isinstance(event, Subscribed):
            log.info("subscribed to %r on %s as %s (lease %d ms, window %d, max attempts %d)",
                     args.outbox, event.server, event.owner, event.lease_ms,
                     event.max_in_flight, event.max_attempts)
        elif isinstance(event, Settled):
            outcomes = [f"{name} {list(ids)}" for name, ids in (
                ("retried", event.retried), ("dead_lettered", event.dead_lettered),
                ("released", event.released), ("fenced", event.fenced)) if ids]
            if event.rejected or event.rejected_reason:
                outcomes.append(f"rejected {list(event.rejected)}: {event.rejected_reason}")
            if outcomes:
                log.info("settled: %s", ", ".join(outcomes))
            self.acked.update(event.acked)
            done = args.count and len(self.acked) >= args.count
            if done and self.subscriber is not None and not self.closing:
                self.closing = True
                log.info("%d messages acked; closing the stream", len(self.acked))
                self.subscriber.stop()
        elif isinstance(event, LeasesExpired):
            log.info("leases ran out before we answered, stop publishing: %s", list(event.ids))
        elif isinstance(event, Draining):
            log.info("the server is draining: answering what we hold, then reconnecting")
        elif isinstance(event, Reconnecting):
            log.info("%s; reconnecting in %.0f ms", event.reason, event.delay * 1000)


def main(argv=None) -> None:
    logging.basicConfig(format="txoutbox-subscribe: %(message)s", level=logging.INFO,
                        stream=sys.stderr)
    args = parse_args(argv)
    printer = Printer(args)
    try:
        credentials = Credentials(token=args.token, tls=args.tls, ca=args.tls_ca,
                                  cert=args.tls_cert, key=args.tls_key)
        subscriber = Subscriber(
            args.servers, args.outbox,
            name=args.subscriber,
            topics=args.topics,
            group=args.group,
            max_in_flight=args.max_in_flight,
            lease=args.lease_ms / 1000 if args.lease_ms else None,
            credentials=credentials,
            connect_timeout=args.connect_timeout,
            max_reconnects=None if args.max_reconnects < 0 else args.max_reconnects,
            on_event=printer.on_event,
        )
        printer.subscriber = subscriber
        subscriber.run_until_signal(printer)
    except ConnectError as error:
        log.error("%s (--server host:port)", error)
        sys.exit(2)
    except SubscriptionRefused as error:
        log.error("the stream failed: %s", error)
        sys.exit(1)
    except ReconnectsExhausted as error:
        log.error("%s", error)
        sys.exit(1)
    except OSError as error:  # a TLS file that cannot be read
        log.error("%s", error)
        sys.exit(2)
    except KeyboardInterrupt:
        log.info("interrupted")
        sys.exit(130)
    log.info("stream closed" if args.count and len(printer.acked) >= args.count else "stopped")


if __name__ == "__main__":
    main()
