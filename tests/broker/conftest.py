"""Servers with the Kafka listener on, for the tests that drive real Kafka clients against it.

`kafka_server` is `eventlog serve` (a subprocess: the listener is the process's own socket)
at N = 1 and at N = 2 shards (with N = 2, shard i is broker i on kafka port + i, and each
partition's leader is its owner shard, so a client talks to both), with an HTTP client to the
same server. One server per N for the whole session: every test makes topics of its own
(`new_topic`) and only adds to what the server holds, so they share it and the suite pays for
two starts, not two per test. Under EVENTLOG_TEST_PROCESSES=N (the suite run at one N) only
that N is run.

Every client call in these tests has a timeout, so a listener that does not answer fails the
test in seconds instead of stalling the run.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import TEST_PROCESSES, XDIST_WORKER, ServerProcess, _all_free, free_port

SHARD_COUNTS = [TEST_PROCESSES] if TEST_PROCESSES else [1, 2]


def free_ports(count: int, attempts: int = 50) -> int:
    """A base port with base .. base + count - 1 all free on 127.0.0.1 (a family's shard i
    listens on base + i)."""
    if XDIST_WORKER:
        return free_port(count)  # from this worker's own range, the run handed out whole
    for _ in range(attempts):
        base = free_port()
        if base + count <= 65535 and _all_free(range(base, base + count)):
            return base
    raise RuntimeError(f"no {count} consecutive free ports found")


@dataclass
class KafkaServer:
    """A running server with its Kafka listener: `bootstrap` for Kafka clients, `http` for
    HTTP (as `token`'s principal when the server has an auth file)."""

    server: ServerProcess
    kafka_port: int
    processes: int
    token: str | None = None
    http: httpx.Client = field(init=False)

    def __post_init__(self) -> None:
        self.http = self.server.client(token=self.token)

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.kafka_port}"

    def create_topic(
        self, name: str, partitions: int = 3, configs: dict[str, Any] | None = None
    ) -> str:
        body: dict[str, Any] = {"name": name, "partitions": partitions}
        if configs:
            body["configs"] = configs
        response = self.http.post("/v1/topics", json=body)
        assert response.status_code == 201, response.text
        return name

    def close(self) -> None:
        self.http.close()
        code = self.server.stop()
        assert code == 0, f"the server exited with {code}:\n{self.server.log()[-4000:]}"


def start_kafka_server(
    data_dir: Path, processes: int, token: str | None = None, **env: str
) -> KafkaServer:
    """`eventlog serve --processes N` with the Kafka listener on free ports, started in an
    environment without the developer's EVENTLOG_* settings (a session fixture runs before the
    per-test cleaning of tests/conftest.py)."""
    port = free_ports(processes)
    server = ServerProcess(
        data_dir, env={"EVENTLOG_KAFKA_PORT": str(port), **env}, processes=processes
    )
    with pytest.MonkeyPatch.context() as mp:
        for name in list(os.environ):
            if name.startswith("EVENTLOG_"):
                mp.delenv(name)
        server.start(timeout=60, token=token)
    return KafkaServer(server, port, processes, token)


@pytest.fixture(scope="session", params=SHARD_COUNTS, ids=lambda n: f"N={n}")
def kafka_server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[KafkaServer]:
    """The shared server at N = 1 and at N = 2 (see the module's docstring)."""
    processes = request.param
    server = start_kafka_server(tmp_path_factory.mktemp(f"kafka-n{processes}") / "data", processes)
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def new_topic(kafka_server: KafkaServer) -> Any:
    """new_topic(partitions=3, configs=None) -> the name of a topic made for this test."""

    def make(partitions: int = 3, configs: dict[str, Any] | None = None) -> str:
        return kafka_server.create_topic(f"t-{uuid.uuid4().hex[:12]}", partitions, configs)

    return make
