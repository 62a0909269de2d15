"""eventlog serve --processes N: the supervisor and its shard processes, on real processes.

The shards learn who they are from EVENTLOG_SHARD (app/supervisor.py); the tests read it from
/proc to tell the shards apart. What a family does with records (ownership, forwarding) is the
engine's, tested in tests/engine/test_shards.py; here only that they survive a family restart.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from app import cli
from app.settings import Settings
from engine.log_manager import ShardSpec

from ..conftest import (
    KEPT_ENV,
    VENV_BIN,
    ServerProcess,
    child_pids,
    free_port,
    pid_alive,
    wait_until,
)

# heartbeats and kill deadlines: make test runs these alone (serial)
pytestmark = pytest.mark.serial

EVENTLOG = str(VENV_BIN / "eventlog")


def _identity(pid: int) -> dict:
    """What a shard was told it is: its EVENTLOG_SHARD."""
    for entry in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
        name, _, value = entry.partition(b"=")
        if name == b"EVENTLOG_SHARD":
            return json.loads(value)
    raise AssertionError(f"process {pid} has no EVENTLOG_SHARD")


def _ready_lines(server: ServerProcess) -> int:
    return server.log().count(f"ready: 2 shards on http://127.0.0.1:{server.port}")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_two_shards_serve_and_stop_cleanly_on_a_signal(server_factory, sig) -> None:
    server = server_factory()
    server.processes = 2
    server.start()
    assert _ready_lines(server) == 1
    shards = server.shard_pids()
    assert len(shards) == 2
    identities = sorted((_identity(pid) for pid in shards), key=lambda i: i["index"])
    assert [i["index"] for i in identities] == [0, 1]
    assert {i["count"] for i in identities} == {2}
    assert {i["supervisor_pid"] for i in identities} == {server.proc.pid}
    run_dir = Path(identities[0]["run_dir"])
    assert {Path(i["run_dir"]) for i in identities} == {run_dir}
    assert run_dir.name.startswith("eventlog-shards-") and run_dir.stat().st_mode & 0o777 == 0o700
    with server.client() as client:
        for _ in range(10):  # whichever shard accepts
            assert client.get("/healthz").json() == {"status": "ok"}
            assert client.get("/readyz").status_code == 200
    assert "shard-0 " in server.log() and "shard-1 " in server.log()
    assert server.stop(sig) == 0
    assert not any(pid_alive(pid) for pid in shards)
    assert not run_dir.exists()
    assert " ERROR supervisor " not in server.log() and "WARNING supervisor" not in server.log()


def test_a_sigkilled_supervisor_takes_its_shards_with_it(server_factory) -> None:
    server = server_factory()
    server.processes = 2
    server.start()
    shards = server.shard_pids()
    assert len(shards) == 2
    run_dir = Path(_identity(shards[0])["run_dir"])
    assert run_dir.name.startswith(f"eventlog-shards-{server.proc.pid}-")
    assert server.kill() == -signal.SIGKILL
    wait_until(lambda: not any(pid_alive(pid) for pid in shards), timeout=5, what="the shards' exit")
    assert run_dir.exists()  # nobody was left to remove it
    # nothing holds the port or the data dir: a new server starts on both
    again = server_factory(server.data_dir)
    again.port = server.port
    again.processes = 2
    again.start()
    with again.client() as client:
        assert client.get("/readyz").status_code == 200
    assert not run_dir.exists()  # the next supervisor did
    assert again.stop() == 0


def test_a_killed_shard_is_restarted_alone(server_factory) -> None:
    server = server_factory()
    server.processes = 2
    server.start()
    first = server.shard_pids()
    by_index = {_identity(pid)["index"]: pid for pid in first}
    os.kill(by_index[1], signal.SIGKILL)
    wait_until(lambda: "is back after restart 1" in server.log(), what="shard 1's restart")
    log = server.log()
    assert f"shard 1 (pid {by_index[1]}) was killed by SIGKILL" in log
    assert "restarting it alone" in log
    second = server.shard_pids()
    assert len(second) == 2 and by_index[0] in second and by_index[1] not in second  # shard 0 served on
    new = next(pid for pid in second if pid != by_index[0])
    assert _identity(new)["index"] == 1 and _identity(new)["rejoin"] is True
    with server.client() as client:
        assert client.get("/readyz").status_code == 200
    # a shard that dies soon after it started waits before the next start, longer each time
    os.kill(new, signal.SIGKILL)
    wait_until(lambda: "is back after restart 2" in server.log(), what="the second restart")
    newer = next(pid for pid in server.shard_pids() if pid != by_index[0])
    os.kill(newer, signal.SIGKILL)
    wait_until(lambda: "is back after restart 3" in server.log(), what="the third restart")
    log = server.log()
    assert log.index("restarting it alone in 0.5 s") < log.index("restarting it alone in 1.0 s")
    # each death came within SHARD_STABLE_S of its start: the third makes a crash loop, said once
    assert log.count("shard 1 is crash-looping: 3 deaths in a row") == 1
    assert by_index[0] in server.shard_pids()
    with server.client() as client:
        metrics = client.get("/metrics").text
    assert 'eventlog_shard_restarts_total{shard="1"} 3.0' in metrics
    assert 'eventlog_shard_crash_looping{shard="1"} 1.0' in metrics
    assert 'eventlog_shard_up{shard="0"} 1.0' in metrics and 'eventlog_shard_up{shard="1"} 1.0' in metrics
    assert server.stop() == 0


def test_a_shard_that_cannot_start_stops_the_family(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "__metadata-0").touch()  # a file where the engine wants a directory
    result = subprocess.run(
        [EVENTLOG, "serve", "--data-dir", str(data), "--port", "0", "--processes", "2"],
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 1
    assert "eventlog: cannot start: " in result.stderr and "__metadata-0: cannot load partition" in result.stderr
    assert "exited with status 1 before it was ready" in result.stderr
    assert "restart" not in result.stderr and "Traceback" not in result.stderr


def test_an_address_in_use_is_a_clear_error(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [EVENTLOG, "serve", "--data-dir", str(tmp_path / "data"), "--port", str(port), "--processes", "2"],
            capture_output=True, text=True, timeout=120,
        )
    assert result.returncode == 1
    assert f"eventlog: cannot start: cannot listen on 127.0.0.1:{port}: Address already in use" in result.stderr
    assert "shard 0 started" not in result.stderr and "Traceback" not in result.stderr


def test_a_second_server_on_the_same_data_dir_is_refused(server_factory) -> None:
    server = server_factory()
    server.processes = 2
    server.start()
    for processes in ("2", "1"):
        result = subprocess.run(
            [EVENTLOG, "serve", "--data-dir", str(server.data_dir), "--port", "0", "--processes", processes],
            capture_output=True, text=True, timeout=120,
        )
        assert result.returncode == 1
        assert f"already in use by another eventlog process (pid {server.proc.pid})" in result.stderr
        assert "Traceback" not in result.stderr
    with server.client() as client:
        assert client.get("/readyz").status_code == 200  # the family is unharmed
    assert len(server.shard_pids()) == 2
    assert server.stop() == 0


def _shard_children(pid: int) -> list[int]:
    def cmdline(child: int) -> bytes:
        try:
            return Path(f"/proc/{child}/cmdline").read_bytes()
        except OSError:
            return b""

    return [child for child in child_pids(pid) if b"app.shard" in cmdline(child)]


def test_one_process_starts_no_shard(server_factory) -> None:
    server = server_factory()
    server.processes = 1
    server.start()
    assert _shard_children(server.proc.pid) == []
    assert "supervisor" not in server.log()
    assert server.stop() == 0


def test_serve_without_processes_runs_what_the_default_says(tmp_path: Path) -> None:
    """SHARDS_BY_DEFAULT False: one process; True: Settings' default (one per core)."""
    expected = Settings().processes if cli.SHARDS_BY_DEFAULT else 1
    server = ServerProcess(tmp_path / "data")
    server.processes = None
    port = server.port
    env = {k: v for k, v in os.environ.items() if not k.startswith("EVENTLOG_")} | KEPT_ENV
    with open(tmp_path / "server.log", "wb") as log:
        proc = subprocess.Popen([EVENTLOG, "serve", "--data-dir", str(tmp_path / "data"), "--port", str(port)],
                                stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            def ready() -> bool:
                assert proc.poll() is None, (tmp_path / "server.log").read_text()
                try:
                    return httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200
                except httpx.TransportError:
                    return False

            wait_until(ready, what="the server's start")
            assert len(_shard_children(proc.pid)) == (expected if expected > 1 else 0)
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(60) == 0


def test_serve_help_shows_processes() -> None:
    result = subprocess.run([EVENTLOG, "serve", "--help"], capture_output=True, text=True, timeout=60,
                            env={"PATH": "/usr/bin:/bin", "COLUMNS": "200"})
    assert result.returncode == 0
    assert "--processes" in result.stdout and "EVENTLOG_PROCESSES" in result.stdout


@pytest.mark.slow
def test_a_shard_that_will_not_stop_is_killed(server_factory) -> None:
    """A shard that ignores SIGTERM (stopped here; a hung disk in life) past its own watchdog
    and the slack is killed, and the exit status says the stop was not clean."""
    server = server_factory(EVENTLOG_SHUTDOWN_TIMEOUT_MS="100")
    server.processes = 2
    server.start()
    stuck = server.shard_pids()[1]
    os.kill(stuck, signal.SIGSTOP)
    started = time.monotonic()
    assert server.stop(timeout=120) == 1
    took = time.monotonic() - started
    assert not pid_alive(stuck)
    assert f"(pid {stuck}) still running" in server.log()
    assert took >= 0.2 + 10  # its own watchdog's time, at least


def test_https_and_ipv6_on_an_inherited_socket(tmp_path: Path) -> None:
    """TLS works in the shards (they get the socket, not the address), and an IPv6 host gets
    an IPv6 socket."""
    import ssl

    from ..api.test_security import _self_signed

    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        pytest.skip("no IPv6 loopback here")
    cert, key = _self_signed(tmp_path)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("EVENTLOG_")} | KEPT_ENV
    log_path = tmp_path / "server.log"
    trusted = ssl.create_default_context(cafile=str(cert))
    trusted.check_hostname = False  # the certificate names 127.0.0.1 and localhost; its chain is still checked
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [EVENTLOG, "serve", "--data-dir", str(tmp_path / "data"), "--host", "::1", "--port", str(port),
             "--processes", "2", "--ssl-certfile", str(cert), "--ssl-keyfile", str(key)],
            stdout=log, stderr=subprocess.STDOUT, env=env,
        )
        try:
            def ready() -> bool:
                assert proc.poll() is None, log_path.read_text()
                return f"ready: 2 shards on https://[::1]:{port}" in log_path.read_text()

            wait_until(ready, what="the family's start")
            with httpx.Client(base_url=f"https://[::1]:{port}", verify=trusted, timeout=30) as client:
                for _ in range(6):
                    assert client.get("/readyz").status_code == 200
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(60) == 0, log_path.read_text()


def test_settings_cross_to_a_shard_unchanged(tmp_path: Path) -> None:
    """Settings.to_json / from_json: every field, each set away from its default here (a new
    field must be added to this test), comes back equal; the shard's place reaches the engine."""
    cert = tmp_path / "cert.pem"
    cert.write_text("x")
    given = dict(
        data_dir=tmp_path / "data", processes=3, host="::1", port=0, log_dirs=(tmp_path / "a", tmp_path / "b"),
        cors_origins=("https://console.example", "http://localhost:3000"),
        node_id=7, default_partitions=3, max_partitions=99, topic_defaults={"segment.bytes": 2_000_000, "cleanup.policy": "compact"},
        recovery_threads=5, shared_sync=False, producer_id_expiration_ms=5000, checkpoint_interval_ms=1234, log_level="debug",
        access_log=False, access_log_sample=0.5, auth_file=tmp_path / "auth.json", auth_reload_ms=250, max_request_bytes=4096, max_inflated_bytes_per_request=2 << 20,
        request_timeout_ms=1001, header_timeout_ms=1002, shutdown_timeout_ms=1003, max_header_bytes=2048,
        limit_concurrency=17, timeout_keep_alive_ms=1004, backlog=5, ssl_certfile=cert, ssl_keyfile=cert,
        ssl_keyfile_password="pw", quota_produce_bytes_per_sec=100, quota_fetch_bytes_per_sec=200, quota_window_num=3,
        quota_window_size_ms=20, snapshot_dir=tmp_path / "snaps", snapshot_max_count=4, snapshot_max_bytes=12345,
        retention_check_interval_ms=1005, cleaner_enabled=False, cleaner_backoff_ms=11, cleaner_dedupe_buffer_size=2 << 20,
        cleaner_run_in="thread", cleaner_io_max_bytes_per_sec=1.5, shard_heartbeat_timeout_ms=1006,
        kafka_port=9999, kafka_host="::1", kafka_advertised_host="kafka.example",
        kafka_auto_create_topics=False, loop_block_warn_ms=250,
    )
    assert set(given) == set(Settings.model_fields)
    settings = Settings(**given)
    defaults = Settings()
    assert [name for name in given if getattr(settings, name) == getattr(defaults, name)] == []
    assert Settings.from_json(settings.to_json()) == settings
    # the defaults cross too: None, an unlimited float, a percentage
    assert defaults.cleaner_io_max_bytes_per_sec == math.inf and defaults.snapshot_max_bytes == "10%"
    assert Settings.from_json(defaults.to_json()) == defaults
    spec = ShardSpec(1, 3, tmp_path / "run", (5, 6))
    assert settings.engine_config().shard is None
    assert settings.for_shard(spec).engine_config().shard == spec
    assert settings.for_shard(spec).engine_config() == dataclasses.replace(settings.engine_config(), shard=spec)


# -- with records --------------------------------------------------------------------------------


def _shard_pid(server: ServerProcess, index: int) -> int:
    return next(pid for pid in server.shard_pids() if _identity(pid)["index"] == index)


def _values(client: httpx.Client, partitions: int) -> list[str]:
    values = []
    for p in range(partitions):
        values += [r["value"] for r in client.get(f"/v1/topics/t/partitions/{p}/records").json()["records"]]
    return sorted(values)


def test_records_acknowledged_before_a_shard_dies_are_served_after_the_restart(server_factory) -> None:
    server = server_factory()
    server.processes = 2
    server.start()
    expected = []
    with server.client() as client:
        assert client.post("/v1/topics", json={"name": "t", "partitions": 4}).status_code == 201
        for i in range(40):
            assert client.post("/v1/topics/t/records", json={"records": [{"key": f"k{i}", "value": f"v{i}"}]}).status_code == 200
            expected.append(f"v{i}")
    for restart, index in enumerate((0, 1), 1):  # the controller (metadata, groups), then a plain owner
        os.kill(_shard_pid(server, index), signal.SIGKILL)
        wait_until(lambda restart=restart: server.log().count("is back after restart 1") == restart, what="the restart")
        with server.client() as client:
            assert _values(client, 4) == sorted(expected)
            for i in range(10):
                r = client.post("/v1/topics/t/records", json={"records": [{"key": f"k{i}", "value": f"after{index}-{i}"}]})
                assert r.status_code == 200
                expected.append(f"after{index}-{i}")
            assert _values(client, 4) == sorted(expected)
    assert server.stop() == 0


# -- connection balance (app/balance.py) ---------------------------------------------------------


def _socket_inodes(pid: int) -> set[int]:
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[8:-1]))
    return inodes


def _served_by(server: ServerProcess, client_ports: set[int]) -> dict[int, int]:
    """For each shard index, how many of the connections from `client_ports` it holds (from
    /proc/net/tcp: the server side of each connection, and which shard has its socket)."""
    owners = {_identity(pid)["index"]: _socket_inodes(pid) for pid in server.shard_pids()}
    counts = dict.fromkeys(owners, 0)
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local_port = int(fields[1].split(":")[1], 16)
        remote_port = int(fields[2].split(":")[1], 16)
        if local_port != server.port or remote_port not in client_ports or fields[3] != "01":
            continue
        inode = int(fields[9])
        for index, inodes in owners.items():
            if inode in inodes:
                counts[index] += 1
    return counts


def _request(sock: socket.socket, head: bytes, body: bytes = b"") -> bytes:
    sock.sendall(head + body)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed after {data!r}"
        data += chunk
    head_part, _, rest = data.partition(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head_part.split(b"\r\n") if line.lower().startswith(b"content-length"))
    while len(rest) < length:
        chunk = sock.recv(65536)
        assert chunk
        rest += chunk
    return head_part.split(b"\r\n")[0] + b"\r\n" + rest


def test_new_connections_are_spread_evenly_over_the_shards(server_factory) -> None:
    """Whichever shard wakes first accepts a connection on the family's one socket; a shard with
    more hands a new one to a shard with fewer, socket and all, before reading it. Each connection
    sends its request at once (the bytes are in flight when it changes hands), then keeps
    serving requests on the same connection, whichever shard took it."""
    server = server_factory()
    server.processes = 2
    server.start()
    with server.client() as client:
        assert client.post("/v1/topics", json={"name": "t", "partitions": 2}).status_code == 201
    body = json.dumps({"records": [{"value": "v"}]}).encode()
    post = (
        f"POST /v1/topics/t/partitions/0/records HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\n\r\n"
    ).encode()
    sockets = []
    try:
        for n in range(1, 13):
            sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
            sockets.append(sock)
            answer = _request(sock, post, body)
            assert answer.startswith(b"HTTP/1.1 200"), answer
            if n % 2 == 0:  # every arrival order comes out even (a sender keeps a spare copy of a
                # connection it handed over for RECLAIM_S, in case the other shard never takes it)
                ports = {s.getsockname()[1] for s in sockets}
                wait_until(
                    lambda ports=ports, n=n: sorted(_served_by(server, ports).values()) == [n // 2, n // 2],
                    timeout=5, what=f"{n} connections spread evenly",
                )
        for sock in sockets:  # keep-alive: the next requests on each, wherever it lives now
            assert _request(sock, b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n").endswith(b'{"status":"ok"}')
            assert _request(sock, post, body).startswith(b"HTTP/1.1 200")
    finally:
        for sock in sockets:
            sock.close()
    with server.client() as client:
        assert client.get("/v1/topics/t/partitions/0/offsets").json()["high_watermark"] == 24
    assert server.stop() == 0
    assert "Traceback" not in server.log()
