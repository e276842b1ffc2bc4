"""Where a txoutboxd spends its database time, from its own log.

Run the benchmark with every statement logged and the logs kept:

    txoutbox-bench --only drain --server-log 'info,sqlx::query=debug' --server-log-dir /tmp/logs

then summarise each server's log (statements by kind: count, mean and total time):

    python3 tests/bench/statement_profile.py /tmp/logs/*.log
"""

from __future__ import annotations

import collections
import json
import sys


def summarise(path: str) -> None:
    count: collections.Counter[str] = collections.Counter()
    seconds: collections.Counter[str] = collections.Counter()
    first = last = None
    with open(path, encoding="utf-8") as log:
        for line in log:
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if entry.get("target") != "sqlx::query":
                continue
            fields = entry.get("fields", {})
            kind = " ".join(fields.get("summary", "?").split())[:48]
            count[kind] += 1
            seconds[kind] += fields.get("elapsed_secs", 0.0)
            stamp = entry.get("timestamp")
            first = first or stamp
            last = stamp
    print(f"== {path}: {sum(count.values())} statements, {sum(seconds.values()):.2f} s in the database ({first} .. {last})")
    for kind, n in count.most_common():
        print(f"{n:8d} {seconds[kind] / n * 1000:8.2f} ms mean {seconds[kind]:8.2f} s total  {kind}")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    for argument in sys.argv[1:]:
        summarise(argument)
