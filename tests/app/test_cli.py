"""The eventlog command: serve's start-up and shutdown, dump-log, import-kafka."""

from __future__ import annotations

import functools
import hashlib
import json
import signal
import struct
import subprocess
from pathlib import Path

import anyio
import pytest
from crc32c import crc32c

from engine import reader
from engine.log_manager import EngineConfig, open_engine
from workers.retention import run_retention

from ..conftest import VENV_BIN, ServerProcess
from ..kafka_oracle import build_batch
from .kafka_dirs import KRAFT_CONFIGS, KRAFT_OFFSETS, T0, control_batch, write_kafka_log_dir, write_kraft_log_dir

EVENTLOG = str(VENV_BIN / "eventlog")


def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([EVENTLOG, *args], capture_output=True, text=True, cwd=cwd, timeout=120)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_serve_shuts_down_cleanly_on_signals(server_factory, sig) -> None:
    server = server_factory().start()
    with server.client() as client:
        assert client.get("/healthz").json() == {"status": "ok"}
        assert client.post("/v1/topics", json={"name": "t"}).status_code == 201
        assert client.post("/v1/topics/t/records", json={"records": [{"value": "v"}]}).status_code == 200
    assert server.stop(sig) == 0
    assert (server.data_dir / ".kafka_cleanshutdown").exists()
    assert "engine closed (clean)" in server.log()
    # the next start skips recovery
    again = server_factory(server.data_dir).start()
    with again.client() as client:
        assert client.get("/v1/topics/t/partitions/0/records").json()["records"][0]["value"] == "v"
    assert again.stop() == 0
    assert "clean shutdown" in again.log()


def test_second_server_on_the_same_dir_fails_with_a_clear_message(server, tmp_path: Path) -> None:
    result = subprocess.run(
        [EVENTLOG, "serve", "--data-dir", str(server.data_dir), "--port", "0"],
        capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 1
    assert "already in use by another eventlog process" in result.stderr
    assert "Traceback" not in result.stderr
    with server.client() as client:
        assert client.get("/readyz").status_code == 200  # the first one is unharmed


def test_settings_come_from_the_environment(server_factory, tmp_path: Path) -> None:
    server = ServerProcess(tmp_path / "ignored")
    server.env = {"EVENTLOG_TOPIC_DEFAULTS": '{"segment.bytes": 12345, "max.message.bytes": 10000}'}
    server_factory  # noqa: B018 -- for cleanup symmetry
    server.start()
    try:
        with server.client() as client:
            created = client.post("/v1/topics", json={"name": "t"}).json()
            assert created["configs"]["segment.bytes"] == "12345"
    finally:
        assert server.stop() == 0
    bad = subprocess.run([EVENTLOG, "serve", "--data-dir", str(tmp_path / "x"), "--port", "0"],
                         env={"EVENTLOG_TOPIC_DEFAULTS": '{"segment.bytes": 1}', "PATH": "/usr/bin:/bin"},
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "segment.bytes" in bad.stderr
    smaller = subprocess.run([EVENTLOG, "serve", "--data-dir", str(tmp_path / "x"), "--port", "0"],
                             env={"EVENTLOG_TOPIC_DEFAULTS": '{"segment.bytes": 1000}', "PATH": "/usr/bin:/bin"},
                             capture_output=True, text=True, timeout=60)
    assert smaller.returncode == 2 and "smaller than max.message.bytes" in smaller.stderr


async def _fill(data_dir: Path) -> None:
    from engine.partition_log import prepare_batches
    from engine.records import encode_batch

    async with open_engine(EngineConfig(log_dirs=(data_dir,))) as engine:
        await engine.create_topic("t", 1, {"segment.bytes": 12000})
        log = engine.partition("t", 0)
        for i in range(120):
            batch = encode_batch(0, [(b"k", b"value-%d" % i * 10, 1_700_000_000_000 + i, [("h", b"x")])], compression_type=i % 5)
            await log.append(prepare_batches(batch, log.config))


def test_dump_log_prints_batches_records_and_index_entries(tmp_path: Path) -> None:
    anyio.run(_fill, tmp_path)
    files = sorted((tmp_path / "t-0").glob("00000000000000000000.*"))
    result = run("dump-log", "--verify", "--records", *map(str, files))
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "baseOffset: 0 lastOffset: 0 count: 1" in out
    assert "compresscodec: gzip" in out and "isvalid: true" in out
    assert "| offset: 1 CreateTime: 1700000000001 keySize: 1 valueSize: 70 sequence: -1 headerKeys: [h]" in out
    assert "offset: " in out and "position: " in out and "timestamp: " in out
    # the closed segment's key index, checked against the records of its .log
    assert any(f.name.endswith(".keyindex") for f in files) and "bytesPerEntry: 16" in out
    assert "no problems" in result.stderr


def test_dump_log_prints_what_kafka_dump_log_prints(tmp_path: Path) -> None:
    """The lines of current kafka-dump-log.sh (tools/DumpLogSegments.java): `sequence:` on
    records, `deleteHorizonMs` on batches, decoded control records, values as text, and the
    torn tail reported as Kafka's tool reports it."""
    horizon = bytearray(build_batch([(b"gone", None, T0, [])], base_offset=4))
    (attributes,) = struct.unpack_from(">h", horizon, 21)
    struct.pack_into(">h", horizon, 21, attributes | 0x40)  # delete horizon set: baseTimestamp is it
    struct.pack_into(">I", horizon, 17, crc32c(bytes(horizon[21:])))
    batches = [
        build_batch(
            [(b"k", "välue".encode(), T0, [("h", b"1"), ("n", None)]), (None, b"x", T0 + 1, []), (b"k3", None, T0 + 2, [])],
            producer_id=7, producer_epoch=0, base_sequence=2**31 - 2,
        ),
        control_batch(7, True),
        bytes(horizon),
    ]
    data = bytearray()
    offset = 0
    for b in batches:
        b = bytearray(b)
        struct.pack_into(">q", b, 0, offset)
        offset += struct.unpack_from(">i", b, 23)[0] + 1
        data += b
    log = tmp_path / "00000000000000000000.log"
    log.write_bytes(bytes(data) + b"\x00" * 7)
    result = run("dump-log", "--records", "--print-values", str(log))
    lines = result.stdout.splitlines()
    assert lines[0] == f"Dumping {log}" and lines[1] == "Log starting offset: 0"
    assert lines[2].startswith(
        "baseOffset: 0 lastOffset: 2 count: 3 baseSequence: 2147483646 lastSequence: 0 producerId: 7 "
        "producerEpoch: 0 partitionLeaderEpoch: 0 isTransactional: false isControl: false "
        f"deleteHorizonMs: OptionalLong.empty position: 0 CreateTime: {T0 + 2} size: "
    )
    assert lines[3] == f"| offset: 0 CreateTime: {T0} keySize: 1 valueSize: 6 sequence: 2147483646 headerKeys: [h,n] key: k payload: välue"
    assert lines[4] == f"| offset: 1 CreateTime: {T0 + 1} keySize: -1 valueSize: 1 sequence: 2147483647 headerKeys: [] payload: x"
    assert lines[5] == f"| offset: 2 CreateTime: {T0 + 2} keySize: 2 valueSize: -1 sequence: 0 headerKeys: [] key: k3"
    assert "isTransactional: true isControl: true deleteHorizonMs: OptionalLong.empty" in lines[6]
    assert lines[7] == f"| offset: 3 CreateTime: {T0} keySize: 4 valueSize: 6 sequence: -1 headerKeys: [] endTxnMarker: COMMIT coordinatorEpoch: 3"
    assert f"deleteHorizonMs: OptionalLong[{T0}] position: " in lines[8]
    assert lines[10] == "Found 7 invalid bytes at the end of 00000000000000000000.log"
    assert len(lines) == 11
    assert result.returncode == 1 and "7 bytes" in result.stderr


def test_dump_log_verify_reports_damage_and_exits_non_zero(tmp_path: Path) -> None:
    anyio.run(_fill, tmp_path)
    log = tmp_path / "t-0" / "00000000000000000000.log"
    data = bytearray(log.read_bytes())
    data[100] ^= 0xFF
    log.write_bytes(bytes(data) + b"garbage")
    result = run("dump-log", "--verify", str(log))
    assert result.returncode == 1
    assert "CRC mismatch" in result.stderr
    index = log.with_suffix(".index")
    raw = bytearray(index.read_bytes())
    raw[4:8] = (7).to_bytes(4, "big")
    index.write_bytes(bytes(raw))
    result = run("dump-log", "--verify", str(index))
    assert result.returncode == 1 and "no batch starts at position 7" in result.stderr


def _tree_hashes(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in root.rglob("*") if p.is_file()}


@pytest.mark.parametrize("link", [False, True])
def test_import_kafka_adopts_a_brokers_partitions(tmp_path: Path, link: bool) -> None:
    kafka = tmp_path / "kafka"
    expected = write_kafka_log_dir(kafka)
    before = _tree_hashes(kafka)
    data_dir = tmp_path / "data"
    args = ["import-kafka", str(kafka), "--data-dir", str(data_dir)] + (["--link"] if link else [])
    result = run(*args)
    assert result.returncode == 0, result.stderr + result.stdout
    assert "2 topic(s) imported" in result.stdout
    assert "truncated" in result.stderr  # orders-1 had a torn tail
    # a ZooKeeper-era dir holds no topic configs: retention is off, and the output says so
    for topic in ("orders", "metrics.cpu"):
        assert f"{topic}: retention off: retention.ms=-1, retention.bytes=-1" in result.stdout
    assert "__consumer_offsets" in result.stdout  # not named: a hint how to merge its offsets
    assert _tree_hashes(kafka) == before  # Kafka's files are never modified, linked or not
    orders0 = sorted(p.name for p in (kafka / "orders-0").glob("*.log"))
    if link:
        # closed segments are linked; the active one (which takes appends) is a copy
        src = kafka / "orders-0" / orders0[0]
        assert (data_dir / "orders-0" / orders0[0]).stat().st_ino == src.stat().st_ino
        assert (data_dir / "orders-0" / orders0[-1]).stat().st_ino != (kafka / "orders-0" / orders0[-1]).stat().st_ino
        assert (data_dir / "orders-1" / "00000000000000000000.log").stat().st_ino != (kafka / "orders-1" / "00000000000000000000.log").stat().st_ino
    for p in (0, 1, 2, 3):
        directory = data_dir / f"orders-{p}"
        assert (directory / "leader-epoch-checkpoint").read_text() == f"0\n1\n0 {5 if p == 0 else 0}\n"
        assert (directory / "partition.metadata").read_text().count("\n") == 1  # Kafka's: no final newline

    async def check() -> None:
        async with open_engine(EngineConfig(log_dirs=(data_dir,))) as engine:
            assert sorted(t for t in engine.topics if not t.startswith("__")) == ["metrics.cpu", "orders"]
            assert len(engine.topic("orders").partitions) == 4  # 0..3; 2 was missing: empty
            for topic, parts in expected.items():
                for p, part in parts.items():
                    log = engine.partition(topic, p)
                    start = 5 if (topic, p) == ("orders", 0) else 0
                    assert log.log_start_offset == start
                    records = reader.read_records(log.view, start, 10**6, 10**8).records
                    assert [(r.offset, r.key, r.value, r.timestamp) for r in records] == [
                        rec for rec in part.records if rec[0] >= start
                    ]
                    assert log.high_watermark == part.records[-1][0] + 1
            assert engine.partition("orders", 2).high_watermark == 0
            # imported partitions take new writes at the right offsets
            from engine.partition_log import prepare_batches
            from engine.records import encode_batch

            log = engine.partition("orders", 0)
            result = await log.append(prepare_batches(encode_batch(0, [(b"k", b"new", 1, [])]), log.config))
            assert result.base_offset == expected["orders"][0].records[-1][0] + 1
            # Kafka's producer snapshot came along: a retry of producer 42's last batch is seen
            log3 = engine.partition("orders", 3)
            retry = encode_batch(0, [(None, b"a", 1, []), (None, b"b", 1, [])], producer_id=42, producer_epoch=0, base_sequence=8)
            again = await log3.append(prepare_batches(retry, log3.config))
            assert again.duplicate and (again.base_offset, again.last_offset) == (4, 5)
            # the records are from 2020: with Kafka's configs unknown, retention must keep them
            assert (log.config.retention_ms, log.config.retention_bytes) == (-1, -1)
            for p in expected["orders"]:
                assert (await run_retention(engine.partition("orders", p))).segments_deleted == 0

    anyio.run(check)
    assert _tree_hashes(kafka) == before, "appends after the import left Kafka's files alone"
    files = [str(p) for p in (data_dir / "orders-0").iterdir() if p.suffix in (".log", ".index", ".timeindex")]
    assert run("dump-log", "--verify", *files).returncode == 0
    # importing again refuses: the topics exist
    again = run(*args)
    assert again.returncode == 1 and "already exists" in again.stderr


def test_import_kafka_selected_topics_and_errors(tmp_path: Path) -> None:
    kafka = tmp_path / "kafka"
    write_kafka_log_dir(kafka)
    result = run("import-kafka", str(kafka), "--data-dir", str(tmp_path / "d"), "--topics", "metrics.cpu")
    assert result.returncode == 0, result.stderr
    assert "1 topic(s) imported" in result.stdout
    missing = run("import-kafka", str(kafka), "--data-dir", str(tmp_path / "d2"), "--topics", "nope")
    assert missing.returncode == 1 and "nope" in missing.stderr


async def _commit(data_dir: Path, group: str, offsets: list[tuple[str, int, int, str]]) -> None:
    async with open_engine(EngineConfig(log_dirs=(data_dir,))) as engine:
        await engine.groups.commit(group, offsets)


def test_import_kafka_carries_kraft_configs_and_merges_consumer_offsets(tmp_path: Path) -> None:
    kafka = tmp_path / "kafka"
    expected = write_kraft_log_dir(kafka)
    before = _tree_hashes(kafka)
    data_dir = tmp_path / "data"
    anyio.run(_commit, data_dir, "g0", [("x", 0, 1, "kept")])
    anyio.run(_commit, data_dir, "g1", [("orders", 0, 99, "replaced")])
    result = run("import-kafka", str(kafka), "--data-dir", str(data_dir))
    assert result.returncode == 0, result.stderr + result.stdout
    out = result.stdout
    assert "2 topic(s) imported" in out
    assert "orders: from __cluster_metadata: cleanup.policy=compact,delete, retention.ms=86400000, segment.bytes=1048576" in out
    assert "orders: retention off: retention.bytes=-1" in out
    assert "min.insync.replicas" in out  # named as not carried
    assert "metrics.cpu: retention off: retention.ms=-1, retention.bytes=-1" in out
    assert "--topics __consumer_offsets" in out  # how to merge the offsets it did not take
    offsets = run("import-kafka", str(kafka), "--data-dir", str(data_dir), "--topics", "__consumer_offsets")
    assert offsets.returncode == 0, offsets.stderr + offsets.stdout
    assert "4 committed offset(s) of 2 group(s)" in offsets.stdout
    assert _tree_hashes(kafka) == before

    async def check() -> None:
        async with open_engine(EngineConfig(log_dirs=(data_dir,))) as engine:
            for topic, configs in KRAFT_CONFIGS.items():
                overrides = dict(engine.topic(topic).meta.overrides)
                assert overrides == {"retention.ms": "-1", "retention.bytes": "-1", **configs}
                assert len(engine.topic(topic).partitions) == len(expected[topic])
            got = {
                (c.group, c.topic, c.partition): (c.offset, c.metadata, c.commit_timestamp)
                for g in engine.groups.groups() for c in engine.groups.fetch(g)
            }
            assert got.pop(("g0", "x", 0))[:2] == (1, "kept")
            assert got == KRAFT_OFFSETS

    anyio.run(check)
    # merged again (the same state): idempotent
    again = run("import-kafka", str(kafka), "--data-dir", str(data_dir), "--topics", "__consumer_offsets")
    assert again.returncode == 0, again.stderr
    anyio.run(check)


def test_import_kafka_refuses_kafkas_metadata_log_as_a_topic(tmp_path: Path) -> None:
    kafka = tmp_path / "kafka"
    write_kraft_log_dir(kafka)
    result = run("import-kafka", str(kafka), "--data-dir", str(tmp_path / "d"), "--topics", "__cluster_metadata")
    assert result.returncode == 1
    assert "__cluster_metadata" in result.stderr and "configs" in result.stderr
    assert "already exists" not in result.stderr
    zk = tmp_path / "zk"
    write_kafka_log_dir(zk)
    merged = run("import-kafka", str(zk), "--data-dir", str(tmp_path / "fresh"), "--topics", "__consumer_offsets")
    assert merged.returncode == 0, merged.stderr + merged.stdout
    assert "already exists" not in merged.stderr
    assert "1 committed offset(s) of 1 group(s)" in merged.stdout


def test_groups_reset_offsets_plans_then_executes_against_a_server(server) -> None:
    """`eventlog groups reset-offsets` is Kafka's --reset-offsets over HTTP: without --execute
    it prints the plan and commits nothing; with it, the table of new offsets is what the
    server committed; a bad scope, a missing strategy and a refusal exit non-zero."""
    with server.client() as client:
        client.post("/v1/topics", json={"name": "orders", "partitions": 3})
        for p in range(3):
            records = {"records": [{"value": str(i), "partition": p} for i in range(4)]}
            assert client.post("/v1/topics/orders/records", json=records).status_code == 200
        commit = {"offsets": [{"topic": "orders", "partition": p, "offset": 4} for p in range(3)]}
        assert client.post("/v1/groups/billing/offsets", json=commit).status_code == 200

        def committed() -> dict[int, int]:
            offsets = client.get("/v1/groups/billing/offsets").json()["offsets"]
            return {o["partition"]: o["offset"] for o in offsets}

        base = ["groups", "reset-offsets", "billing", "--url", server.url]
        plan = run(*base, "--topic", "orders:0,2", "--shift-by", "-3")
        assert plan.returncode == 0, plan.stderr
        rows = [line.split() for line in plan.stdout.splitlines()]
        assert rows[0] == ["GROUP", "TOPIC", "PARTITION", "PREVIOUS-OFFSET", "NEW-OFFSET"]
        assert rows[1:] == [
            ["billing", "orders", "0", "4", "1"], ["billing", "orders", "2", "4", "1"]
        ]
        assert "dry run" in plan.stderr and "--execute" in plan.stderr
        assert committed() == {0: 4, 1: 4, 2: 4}
        assert run(*base, "--topic", "orders", "--to-earliest", "--dry-run").returncode == 0
        assert committed() == {0: 4, 1: 4, 2: 4}

        done = run(*base, "--all-topics", "--to-offset", "2", "--execute")
        assert done.returncode == 0, done.stderr
        assert [line.split()[-1] for line in done.stdout.splitlines()[1:]] == ["2", "2", "2"]
        assert "dry run" not in done.stderr
        assert committed() == {0: 2, 1: 2, 2: 2}

        for bad, why in (
            (["--to-earliest"], "either --topic or --all-topics"),
            (["--topic", "orders"], "exactly one of"),
            (["--topic", "orders", "--to-latest", "--to-earliest"], "exactly one of"),
            (["--topic", "orders:x", "--to-latest"], "partitions are numbers"),
            (["--topic", "nope", "--to-latest", "--execute"], "topic_not_found"),
        ):
            failed = run(*base, *bad)
            assert failed.returncode == 1 and why in failed.stderr, (bad, failed.stderr)
        both = run(*base, "--topic", "orders", "--to-latest", "--execute", "--dry-run")
        assert both.returncode == 2 and "not both" in both.stderr
        assert committed() == {0: 2, 1: 2, 2: 2}


COMMANDS = [
    "serve", "dump-log", "import-kafka", "snapshot", "upload-snapshot", "prune-upload", "nightly",
    "version", "groups", "groups reset-offsets",
]


@functools.cache
def _helps() -> dict[str, str]:
    """`eventlog [COMMAND] --help` for the root and every command, run once for the tests that
    read them, side by side (each is a process start: about a second of imports)."""
    from concurrent.futures import ThreadPoolExecutor

    commands = ["", *COMMANDS]
    with ThreadPoolExecutor(4) as pool:
        done = list(pool.map(lambda c: run(*c.split(), "--help"), commands))
    for command, result in zip(commands, done, strict=True):
        assert result.returncode == 0, (command, result.stderr)
    return {command: result.stdout for command, result in zip(commands, done, strict=True)}


def _help(command: str) -> str:
    return _helps()[command]


def test_version_is_an_option_and_a_command() -> None:
    from app.main import __version__

    for args in (["--version"], ["version"]):
        done = run(*args)
        assert (done.returncode, done.stdout) == (0, f"eventlog {__version__}\n"), done.stderr


# Loaded only by what needs it (issue 24): the HTTP stack (api.routes and every router, FastAPI,
# uvicorn) by `serve`; numpy and aiokafka by the engine; rich by a command's tables or errors;
# kio, the Kafka listener's messages, and hypothesis, which kio loads wherever it is installed,
# by a server whose Kafka port is set.
HTTP_STACK = ("fastapi", "starlette", "uvicorn", "api.routes", "api.records", "app.server")
ENGINE_DEPS = ("numpy", "aiokafka", "engine.partition_log")
KAFKA_LISTENER = ("broker.listener", "kio", "hypothesis")


def _modules_loaded(code: str, watched: tuple[str, ...]) -> list[list[str]]:
    """Run `code` in a fresh interpreter; after each `mark()` it calls, which of `watched` are in
    sys.modules (one list per mark, in order)."""
    script = (
        "import json, sys\n"
        "marks = []\n"
        f"def mark(): marks.append(sorted(m for m in {watched!r} if m in sys.modules))\n"
        f"{code}\n"
        "print(json.dumps(marks))\n"
    )
    done = subprocess.run(
        [str(VENV_BIN / "python"), "-c", script], capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_commands_that_do_not_serve_do_not_import_the_http_stack() -> None:
    """--version, --help and every command's --help (a typo'd or exploratory `eventlog` run)
    start with typer alone: no FastAPI, uvicorn, routers, numpy, aiokafka, rich, nor the
    settings' pydantic; what made each such run cost a CPU-second. A shard family's supervisor,
    which serves nothing itself, reads the settings but loads none of the rest either."""
    runs = [["--version"], ["version"], ["--help"], *([*c.split(), "--help"] for c in COMMANDS)]
    code = (
        "import contextlib, io\n"
        "from app.cli import cli\n"
        "mark()\n"
        f"for args in {runs!r}:\n"
        "    with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
        "        cli(args, prog_name='eventlog')\n"
        "    mark()\n"
    )
    marks = _modules_loaded(code, (*HTTP_STACK, *ENGINE_DEPS, "rich", "pydantic"))
    names = ["import app.cli", *(" ".join(r) for r in runs)]
    assert dict(zip(names, marks, strict=True)) == dict.fromkeys(names, [])
    watched = (*HTTP_STACK, *ENGINE_DEPS, "rich")
    assert _modules_loaded("import app.cli, app.supervisor\nmark()", watched) == [[]]


def test_a_server_without_a_kafka_port_does_not_import_the_listener() -> None:
    """The HTTP service's modules (app.main, the lifespan) load broker/ and kio only when a
    server starts its Kafka listener (start_kafka), and never rich."""
    marks = _modules_loaded("import app.cli, app.main\nmark()", (*KAFKA_LISTENER, "rich"))
    assert marks == [[]]


def test_help_is_whole_and_names_arguments_plainly() -> None:
    """`eventlog --help` lists each command with its whole short help (no "..." where a
    description was cut); every usage line names its arguments as FILE..., SNAPSHOT_DIR, URI,
    never in braces."""
    root = _help("")
    listing = " ".join(root.split("Commands:")[1].split())
    assert "..." not in listing, root
    for name in ("serve", "dump-log", "import-kafka", "snapshot", "upload-snapshot", "prune-upload",
                 "nightly", "version", "groups"):
        assert f" {name} " in f" {listing} ", (name, root)
    assert "Run the HTTP service (and the Kafka listener) until SIGTERM or SIGINT." in listing
    usages = {c: _help(c).splitlines()[0] for c in COMMANDS}
    for usage in usages.values():
        assert "{" not in usage and "}" not in usage, usage
    assert usages["dump-log"].endswith("[OPTIONS] FILE...")
    assert usages["upload-snapshot"].endswith("[OPTIONS] SNAPSHOT_DIR")
    assert usages["prune-upload"].endswith("[OPTIONS] URI")
    assert usages["import-kafka"].endswith("[OPTIONS] KAFKA_LOG_DIR")


def test_help_names_each_commands_environment() -> None:
    """serve's help names the auth file, quotas and snapshot limits and points to
    docs/OPERATIONS.md; snapshot's names each variable once and --data-dir's default;
    import-kafka's and nightly's name the variables they read."""
    serve = " ".join(_help("serve").split())
    needs = ("EVENTLOG_AUTH_FILE", "EVENTLOG_QUOTA_PRODUCE_BYTES_PER_SEC",
             "EVENTLOG_SNAPSHOT_MAX_COUNT", "EVENTLOG_SNAPSHOT_MAX_BYTES", "docs/OPERATIONS.md")
    for needed in needs:
        assert needed in serve, needed
    snapshot = " ".join(_help("snapshot").split())
    assert snapshot.count("EVENTLOG_URL") == 1 and snapshot.count("EVENTLOG_TOKEN") == 1, snapshot
    assert "env var:" not in snapshot
    data_dir = snapshot.split("--data-dir <path>")[1].split(" --to ")[0]
    assert "EVENTLOG_DATA_DIR; default ./data" in data_dir, data_dir
    assert "EVENTLOG_DATA_DIR" in " ".join(_help("import-kafka").split())
    nightly = " ".join(_help("nightly").split())
    for needed in ("JAVA_HOME", "AWS_ACCESS_KEY_ID", "AWS_ENDPOINT_URL"):
        assert needed in nightly, needed
    for command in COMMANDS:  # a variable is named once: ours, not typer's "[env var: ...]" too
        assert "env var:" not in _help(command), command


def test_the_nightly_summary_is_not_cut_where_stdout_is_no_terminal() -> None:
    """Into a pipe or a log, the run's table keeps whole rows (rich cuts at 80 columns)."""
    import io
    from types import SimpleNamespace

    from rich.console import Console

    from app.nightly import print_summary

    deep = Path("/var/lib/eventlog/warehouse/tables/customer-profile-changes-eu-west-1")
    topic = SimpleNamespace(
        topic="customer-profile-changes-eu-west-1", compacted=True, offsets_read=1_234_567,
        offsets_lost=0, table_rows=98_765, rebuilt=False, table_path=str(deep),
    )
    result = SimpleNamespace(
        snapshot_id="20260101T000000Z-1", run=7, incremental=True, topics=[topic], daily_rows=31,
        seconds=12.5,
    )
    buffer = io.StringIO()
    print_summary(Console(file=buffer, highlight=False, soft_wrap=True), result, Path("/warehouse"))
    text = buffer.getvalue()
    assert any(str(deep) in line and topic.topic in line for line in text.splitlines()), text
    assert "nightly: snapshot 20260101T000000Z-1, run 7 (incremental)" in text
    assert max(map(len, text.splitlines())) > 80
