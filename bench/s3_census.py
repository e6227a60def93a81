"""Count the requests of an S3 request log by who sent them and what they were.

    SPECULATIVE_MOTO_REQUEST_LOG=1 PYTHONPATH=. .venv/bin/python bench/warm.py ... --scenarios t
    .venv/bin/python bench/s3_census.py bench/results/warm-*/s3-requests.log [--sources-bucket tpch]

The log is moto's (devtools/moto_s3.py logs one line per request when SPECULATIVE_MOTO_REQUEST_LOG=1;
bench/warm.py keeps it as ``s3-requests.log``). A request is attributed by its bucket and key: the sources'
bucket is Spark reading the tables (s3a); in the store, an attempt's ``data/`` prefix is Spark writing and
reading exchanges (s3a), ``_targets/<target>/slots/`` the slot protocol, anything else the store's control path
(plans, claims, status, heartbeats, notices, journals, manifests: boto3). The upload of the sources before the
runs (PUTs to the sources' bucket) is left out.
"""

from __future__ import annotations

import argparse
import collections
import re
import sys
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

# werkzeug colours a line by its status: the codes are stripped before matching.
ANSI = re.compile(r"\x1b\[[0-9;]*m")
LINE = re.compile(r'"(?P<method>[A-Z]+) (?P<target>\S+) HTTP/[\d.]+" (?P<status>\d{3})')


def classify(method: str, target: str, sources_bucket: str) -> tuple[str, str] | None:
    """(who, what) of one request, or None for the sources' upload."""
    url = urlsplit(target)
    bucket, _, key = unquote(url.path).lstrip("/").partition("/")
    query = parse_qs(url.query, keep_blank_values=True)
    what = "LIST" if method == "GET" and "list-type" in query else method
    if "delete" in query:
        what = "bulk DELETE"
    if "prefix" in query:
        key = query["prefix"][0]
    if bucket == sources_bucket:
        return None if method == "PUT" or "uploads" in query or "uploadId" in query else ("s3a: sources", what)
    if not key:
        return ("bucket", what)
    if "/slots/" in f"/{key}":
        return ("store: slots", what)
    if re.search(r"/attempt=\d+/data(/|$)", key):
        return ("s3a: exchange data", what)
    return ("store: control path", what)


def main(argv: list[str] | None = None) -> int:
    """Print the census of one or more request logs."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("logs", nargs="+", type=Path)
    parser.add_argument("--sources-bucket", default="tpch")
    args = parser.parse_args(argv)
    counts: collections.Counter[tuple[str, str]] = collections.Counter()
    statuses: collections.Counter[tuple[str, str]] = collections.Counter()
    for log in args.logs:
        for line in log.read_text(errors="replace").splitlines():
            match = LINE.search(ANSI.sub("", line))
            if not match:
                continue
            found = classify(match["method"], match["target"], args.sources_bucket)
            if found is not None:
                counts[found] += 1
                if match["status"].startswith("4"):
                    statuses[found] += 1
    by_who: collections.Counter[str] = collections.Counter()
    for (who, _), n in counts.items():
        by_who[who] += n
    print(f"{sum(counts.values())} requests")
    for who, total in by_who.most_common():
        parts = ", ".join(f"{n} {what}" + (f" ({statuses[(who, what)]} 4xx)" if statuses[(who, what)] else "")
                          for (w, what), n in counts.most_common() if w == who)
        print(f"  {who}: {total} ({parts})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
