"""Schemathesis against the live OpenAPI document of a real server.

Every operation gets a bounded number of generated requests, valid and invalid. No response
may be a 5xx, and every response must conform to the document: a documented status code, a
documented content type, and a body that matches the documented schema.

schemathesis.pytest.from_fixture() does not run under pytest 9.2 (it sets Node._nodeid, which
pytest no longer has), so each operation is one parametrized test here that drives
schemathesis's case strategy with Hypothesis and validates with schemathesis's checks.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from ..conftest import ServerProcess

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
MAX_EXAMPLES = int(os.environ.get("XMAX", "25"))

OPERATIONS = [
    "getHealth", "getReadiness", "getMetrics",
    "createTopic", "listTopics", "describeTopic", "alterTopicConfigs", "addPartitions",
    "produceRecords", "produceToPartition", "fetchRecords",
    "listOffsets", "deleteRecords", "listSegments",
    "commitGroupOffsets", "fetchGroupOffsets", "deleteGroupOffsets", "listGroups",
    "deleteTopic",
]
# Not generated: streamRecords (server-sent events) never ends while the client listens, so no
# generic client can read its response to the end; tests/api/test_api.py reads streams by hand.
UNTESTABLE = {"streamRecords"}

# Seeded before each operation's run so that generated requests often hit real topics,
# partitions and groups ("orders" is also the document's example topic name).
TOPICS = {"orders": 3, "events": 1}
GROUP = "billing"


class Live:
    def __init__(self, server: ServerProcess) -> None:
        self.server = server
        self.client = httpx.Client(base_url=server.url, timeout=30)
        self.document: dict[str, Any] = self.client.get("/openapi.json").json()

    def seed(self) -> None:
        """(Re)create the seeded topics and group if an earlier run deleted or emptied them."""
        for name, partitions in TOPICS.items():
            r = self.client.post("/v1/topics", json={"name": name, "partitions": partitions})
            assert r.status_code in (201, 409), r.text
            records = [
                {"key": f"k{i}", "value": f"v{i}", "headers": [{"key": "h", "value": str(i)}], "timestamp": 1_000 + i}
                for i in range(20)
            ]
            assert self.client.post(f"/v1/topics/{name}/records", json={"records": records}).status_code == 200
        offsets = [{"topic": "orders", "partition": p, "offset": 1} for p in range(TOPICS["orders"])]
        assert self.client.post(f"/v1/groups/{GROUP}/offsets", json={"offsets": offsets}).status_code == 200

    def schema(self) -> schemathesis.BaseSchema:
        # an explicit empty config: no schemathesis.toml on the developer's machine changes the run
        schema = schemathesis.openapi.from_dict(self.document, config=schemathesis.Config())
        schema.config.update(base_url=self.server.url, request_timeout=30)

        @schema.hook("flatmap_path_parameters")
        def _sometimes_real(_context: schemathesis.HookContext, params: dict[str, Any]) -> Any:
            """Half of the generated paths name a seeded topic (and a small partition) or group."""
            real: dict[str, Any] = {}
            if not params:  # an operation without path parameters
                return st.just(params)
            if "topic" in params:
                real["topic"] = st.sampled_from(sorted(TOPICS))
                if isinstance(params.get("partition"), int):
                    real["partition"] = st.integers(0, max(TOPICS.values()))
            if "group" in params:
                real["group"] = st.just(GROUP)
            if not real:
                return st.just(params)
            as_is = {name: st.just(value) for name, value in params.items()}
            return st.one_of(st.just(params), st.fixed_dictionaries({**as_is, **real}))

        return schema


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    # one server for the module (the conftest `server` fixture is per test)
    with pytest.MonkeyPatch.context() as mp:
        for name in list(os.environ):
            if name.startswith("EVENTLOG_"):
                mp.delenv(name)
        server = ServerProcess(Path(tmp_path_factory.mktemp("schemathesis")) / "data").start()
    live = Live(server)
    try:
        yield live
    finally:
        live.client.close()
        assert server.stop() == 0, server.log()


def test_every_operation_is_covered(live: Live) -> None:
    ids = {op["operationId"] for ops in live.document["paths"].values() for op in ops.values()}
    assert ids == set(OPERATIONS) | UNTESTABLE


@pytest.mark.slow
@pytest.mark.parametrize("operation_id", OPERATIONS)
def test_operation_conforms_to_the_document(live: Live, operation_id: str) -> None:
    live.seed()
    schema = live.schema()
    operation = schema.find_operation_by_id(operation_id)
    strategy = st.one_of(
        operation.as_strategy(GenerationMode.POSITIVE, hooks=schema.hooks),
        operation.as_strategy(GenerationMode.NEGATIVE, hooks=schema.hooks),
    )

    @settings(
        max_examples=MAX_EXAMPLES,
        derandomize=not os.environ.get("XRAND"),
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=strategy)
    def run(case: schemathesis.Case) -> None:
        if operation_id == "fetchRecords" and isinstance(case.query, dict):
            # a long poll at the end of a partition waits up to max_wait_ms (5 minutes); keep it
            # short so the run stays bounded (long polling is tested in test_api.py)
            wait = case.query.get("max_wait_ms")
            if isinstance(wait, int) and not isinstance(wait, bool) and wait > 200:
                case.query["max_wait_ms"] = 200
        case.call_and_validate(checks=CHECKS)

    run()
    assert live.client.get("/readyz").status_code == 200, live.server.log()[-5000:]
