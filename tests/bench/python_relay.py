"""The Python original, txoutbox 0.2.2 with its asyncpg adapter, driven by txoutbox-bench.

Two commands:

  prepare --dsn DSN --schema S --table T [--no-strict]
      creates the original's own outbox table (its ``schema_sql``) in schema S;
  drain --dsn DSN --schema S --table T --batch-size N --worker-id W [--no-strict]
      builds a ``Relay`` with a publisher that returns at once, prints ``ready``, waits
      for a line on stdin, then runs ``run_once`` until a claim comes back empty and no
      row is pending; prints one JSON line: published, start, end (wall-clock seconds).

The benchmark starts several ``drain`` processes at once for the multi-relay figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from datetime import timedelta

from txoutbox import Relay, RelayConfig
from txoutbox.adapters.postgres import PostgresStorage


async def noop_publish(_message: object) -> None:
    return None


async def prepare(args: argparse.Namespace) -> None:
    storage = await PostgresStorage.connect(
        args.dsn,
        table=args.table,
        schema=args.schema,
        strict_ordering=args.strict,
        min_size=1,
        max_size=1,
    )
    try:
        await storage.create_schema()
    finally:
        await storage.close()


async def drain(args: argparse.Namespace) -> None:
    storage = await PostgresStorage.connect(
        args.dsn,
        table=args.table,
        schema=args.schema,
        strict_ordering=args.strict,
        min_size=2,
        max_size=2,
    )
    relay = Relay(
        storage,
        noop_publish,
        config=RelayConfig(batch_size=args.batch_size, lease=timedelta(seconds=600)),
        worker_id=args.worker_id,
    )
    table = storage.qualified_table
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    start = time.time()
    published = 0
    try:
        while True:
            result = await relay.run_once()
            published += result.published
            if result.claimed:
                continue
            pending = await storage.pool.fetchval(
                f"SELECT count(*) FROM {table} WHERE status = 'pending'"
            )
            if pending == 0:
                break
            # Strict ordering: the other relays hold what is left.
            await asyncio.sleep(0.002)
        end = time.time()
    finally:
        await storage.close()
    print(json.dumps({"published": published, "start": start, "end": end}), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["prepare", "drain"])
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--schema", required=True)
    parser.add_argument("--table", default="outbox")
    parser.add_argument("--no-strict", dest="strict", action="store_false")
    parser.add_argument("--batch-size", type=int, default=100)
    parser.add_argument("--worker-id", default="python-bench")
    args = parser.parse_args()
    asyncio.run(prepare(args) if args.command == "prepare" else drain(args))


if __name__ == "__main__":
    main()
