"""Every real client produces and consumes through the Kafka listener, with every codec it has,
at N = 1 and N = 2 (issue 25): keys, values, null keys, tombstones, binary bytes, headers and
timestamps come back from the client field by field, and the same records are what HTTP reads
(JSON) and what is stored (raw batches, decoded by kafka-python's codec as an oracle, in the
codec the client chose)."""

from __future__ import annotations

import time

import pytest

from tests.kafka_oracle import CODECS as CODEC_IDS
from tests.kafka_oracle import decode_all

from .clients import CLIENTS, Client, Rec, counts_of, expected, read_json, read_raw, records_for

PAIRS = [(name, codec) for name, client in CLIENTS.items() for codec in client.codecs]


def _client(name: str) -> Client:
    client = CLIENTS[name]
    reason = client.missing()
    if reason is not None:
        pytest.skip(reason)
    return client


def _check_timestamps(
    client: Client, want: list[Rec], got: list[Rec], since: int, until: int
) -> list[Rec]:
    """`want` with the timestamps `got` has where the client stamps records itself (kcat),
    once those are within the produce call's time."""
    if client.sets_timestamps:
        return want
    for r in got:
        assert r.timestamp is not None and since <= r.timestamp <= until, (r, since, until)
    by_place = {(r.partition, r.offset): r.timestamp for r in got}
    return [
        Rec(r.partition, r.key, r.value, r.headers, by_place[(r.partition, r.offset)], r.offset)
        for r in want
    ]


@pytest.mark.parametrize(("name", "codec"), PAIRS, ids=[f"{n}-{c}" for n, c in PAIRS])
def test_produce_and_consume_every_field(kafka_server, new_topic, name: str, codec: str) -> None:
    client = _client(name)
    topic = new_topic(3)
    records = records_for(client, codec)
    want = expected(records)
    since = int(time.time() * 1000)
    produced = client.produce(kafka_server.bootstrap, topic, records, codec)
    until = int(time.time() * 1000)
    # each record where the client placed it, at the offsets a new topic gives, in order
    offsets = {(r.partition, r.key, r.value, r.headers): r.offset for r in want}
    placed = [(r.partition, offsets[(r.partition, r.key, r.value, r.headers)]) for r in records]
    if client.reports_offsets:
        assert produced == placed
    else:  # (kcat) the offsets are checked by the consume below
        assert [p for p, _ in produced] == [p for p, _ in placed]

    consumed = client.consume(kafka_server.bootstrap, topic, counts_of(records))
    want = _check_timestamps(client, want, consumed, since, until)
    assert consumed == want

    # HTTP reads the very records, every byte
    over_http = [
        r for p in sorted(counts_of(records)) for r in read_json(kafka_server.http, topic, p)
    ]
    assert over_http == want

    # stored as the client sent them: its codec (a batch that would not shrink goes
    # uncompressed, as clients do), CRCs intact, the same records
    for p, n in counts_of(records).items():
        batches, decoded = decode_all(read_raw(kafka_server.http, topic, p))
        codecs = {b.compression_type for b in batches}
        assert codecs <= {0, CODEC_IDS[codec]} and CODEC_IDS[codec] in codecs, (codec, codecs)
        assert [(r.offset, r.key, r.value, tuple(r.headers), r.timestamp) for r in decoded] == [
            (r.offset, r.key, r.value, r.headers, r.timestamp) for r in want if r.partition == p
        ]
        assert len(decoded) == n
