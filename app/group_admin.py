"""`eventlog groups reset-offsets`: Kafka's `kafka-consumer-groups.sh --reset-offsets`, against a
running server over HTTP (POST /v1/groups/{group}/offsets/reset).

The options are the tool's: `--topic orders` or `--topic orders:0,2` (chosen partitions), or
`--all-topics`; one of `--to-earliest`, `--to-latest`, `--to-datetime`, `--to-offset`,
`--shift-by`; and, as there, nothing is committed without `--execute` (`--dry-run`, or neither,
prints the plan only). The server refuses a group with live Kafka members (409
group_not_empty); the command prints why and exits 1, as the tool does.
"""

from __future__ import annotations

import urllib.request
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .remote import RemoteError, post_json

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)


class ResetError(Exception):
    """The request was refused or the server could not be reached: what to print."""


def parse_topic(spec: str) -> tuple[str, list[int] | None]:
    """`orders` (every partition) or `orders:0,2` (those), as the tool's --topic."""
    topic, sep, parts = spec.partition(":")
    if not topic:
        raise ResetError(f"--topic {spec!r}: no topic name")
    if not sep:
        return topic, None
    try:
        partitions = [int(p) for p in parts.split(",") if p.strip()]
    except ValueError:
        raise ResetError(f"--topic {spec!r}: partitions are numbers, as orders:0,2") from None
    if not partitions:
        raise ResetError(f"--topic {spec!r}: no partitions after ':'")
    return topic, partitions


def reset_body(
    topic: str | None, all_topics: bool, strategy: dict[str, Any], execute: bool
) -> dict[str, Any]:
    """The request's body: the scope, the one strategy, and dry_run unless --execute."""
    if len(strategy) != 1:
        raise ResetError(
            "give exactly one of --to-earliest, --to-latest, --to-datetime, --to-offset, --shift-by"
        )
    if (topic is None) == (not all_topics):
        raise ResetError("give either --topic or --all-topics")
    body: dict[str, Any] = {**strategy, "dry_run": not execute}
    if topic is not None:
        body["topic"], partitions = parse_topic(topic)
        if partitions is not None:
            body["partitions"] = partitions
    else:
        body["all_topics"] = True
    return body


def post(url: str, path: str, body: dict[str, Any], token: str | None) -> dict[str, Any]:
    """POST JSON to the server; a refusal raises ResetError with its code and detail."""
    try:
        return post_json(url, path, body, token, timeout=60)
    except RemoteError as exc:
        raise ResetError(str(exc)) from None


def run_reset(
    url: str, token: str | None, group: str, topic: str | None, all_topics: bool,
    strategy: dict[str, Any], execute: bool,
) -> int:
    """Reset (or, without `execute`, plan) and print the table Kafka's tool prints: the
    group, topic, partition and new offset of each partition, with the offset before."""
    try:
        body = reset_body(topic, all_topics, strategy, execute)
        path = f"/v1/groups/{urllib.request.quote(group, safe='')}/offsets/reset"
        answer = post(url, path, body, token)
    except ResetError as exc:
        err.print(f"[red]reset-offsets failed:[/red] {escape(str(exc))}")
        return 1
    table = Table("GROUP", "TOPIC", "PARTITION", "PREVIOUS-OFFSET", "NEW-OFFSET", box=None)
    for o in answer["offsets"]:
        previous = "-" if o["previous_offset"] is None else str(o["previous_offset"])
        table.add_row(group, o["topic"], str(o["partition"]), previous, str(o["offset"]))
    out.print(table)
    if not execute:
        err.print(
            "no offsets were committed: this was a dry run (add --execute to reset them)"
        )
    return 0
