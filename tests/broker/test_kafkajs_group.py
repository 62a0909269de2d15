"""KafkaJS's own consumer, in a consumer group (issue 25), at N = 1 and N = 2: it joins, is
given every partition, consumes from the beginning what HTTP produced (every field as HTTP reads
it, each partition in order) and commits; HTTP's group offsets are its commits, and a second
run of the same group resumes after them. (KafkaJS has no consumer without a group: the other
KafkaJS tests read through its Fetch, clients.py says why.)"""

from __future__ import annotations

import uuid

import pytest

from tests.conftest import wait_until

from .clients import CLIENTS, KafkaJS, counts_of, expected, read_json, records_for
from .test_cross_protocol import _json_body


@pytest.mark.slow  # a new group's first generation waits group.initial.rebalance.delay.ms (3 s)
def test_kafkajs_group_consumes_commits_and_resumes(kafka_server, new_topic) -> None:
    client = CLIENTS["kafkajs"]
    assert isinstance(client, KafkaJS)
    if client.missing():
        pytest.skip(client.missing())
    topic, group = new_topic(3), f"g-{uuid.uuid4().hex[:10]}"
    http = kafka_server.http
    records = records_for(client, "none")
    assert http.post(f"/v1/topics/{topic}/records", json=_json_body(records)).status_code == 200
    counts = counts_of(records)
    over_http = [r for p in sorted(counts) for r in read_json(http, topic, p)]
    assert len(over_http) == len(expected(records))

    got = client.group_consume(kafka_server.bootstrap, topic, group, len(over_http))
    by_partition = sorted(got, key=lambda r: (r.partition, r.offset))
    assert by_partition == over_http
    for p in counts:  # each partition in offset order, as delivered
        assert [r.offset for r in got if r.partition == p] == list(range(counts[p]))

    def committed() -> dict[int, int]:
        offsets = http.get(f"/v1/groups/{group}/offsets").json()["offsets"]
        return {o["partition"]: o["offset"] for o in offsets if o["topic"] == topic}

    wait_until(lambda: committed() == counts, timeout=10, what="KafkaJS's commits over HTTP")

    more = records_for(client, "none")[:3]  # partitions 0, 1, 2: one each
    assert http.post(f"/v1/topics/{topic}/records", json=_json_body(more)).status_code == 200
    resumed = client.group_consume(kafka_server.bootstrap, topic, group, len(more))
    assert sorted((r.partition, r.offset) for r in resumed) == [(p, counts[p]) for p in (0, 1, 2)]
