"""Server settings: one pydantic-settings model, environment prefix EVENTLOG_.

Every field can be set as EVENTLOG_<FIELD> (EVENTLOG_DATA_DIR, EVENTLOG_PORT, ...); the CLI's
flags override the environment. Built once by app/ and handed down; the engine receives the
plain EngineConfig that engine_config() derives.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import Field, PrivateAttr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from engine.config import LogConfig
from engine.errors import InvalidConfigError

# What the settings hand down (QuotaConfig, EngineConfig, SnapshotLimits, WorkerSettings) lives
# in modules that load FastAPI (api/), numpy and aiokafka (engine/log_manager.py,
# engine/snapshots.py, workers/manager.py). Every `eventlog` command builds Settings, and most
# (--version, --help, groups reset-offsets) need none of that: those modules are imported by the
# methods that build from them, which only the commands that use them call.
if TYPE_CHECKING:
    from api.quotas import QuotaConfig
    from engine.log_manager import EngineConfig, ShardSpec
    from engine.snapshots import SnapshotLimits
    from workers.manager import WorkerSettings


def usable_cpus(cgroup: Path = Path("/sys/fs/cgroup")) -> int:
    """The cores this process may use: the CPUs it may run on (affinity), capped by a cgroup CPU
    quota (a container's `--cpus`: cgroup v2 cpu.max, or v1 cpu.cfs_quota_us / cfs_period_us),
    rounded up; at least 1. os.cpu_count() is the host's count, whatever the container may use."""
    try:
        count = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        count = os.cpu_count() or 1
    quota = None
    try:
        limit, period = (cgroup / "cpu.max").read_text().split()[:2]
        if limit != "max":
            quota = int(limit) / int(period)
    except (OSError, ValueError):
        try:
            limit = int((cgroup / "cpu" / "cpu.cfs_quota_us").read_text())
            period = int((cgroup / "cpu" / "cpu.cfs_period_us").read_text())
            if limit > 0 and period > 0:
                quota = limit / period
        except (OSError, ValueError):
            pass
    if quota is not None and quota > 0:
        count = min(count, math.ceil(quota))
    return max(1, count)


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="EVENTLOG_", extra="ignore", frozen=True)

    data_dir: Path = Field(
        Path("./data"), description="where topics live (snapshots go beside it: <data dir>.snapshots)"
    )
    processes: int = Field(
        default_factory=usable_cpus, ge=1, le=256,
        description=(
            "shard processes serving this data dir (by default one per core this process may use: its CPU "
            "affinity, capped by a container's CPU quota; 1: a single process)"
        ),
    )
    loop_block_warn_ms: int = Field(
        0, ge=0, description="log a warning when the event loop wakes up this much later than "
        "asked (something blocked it: app/loopwatch.py); 0: no watch",
    )
    shard_heartbeat_timeout_ms: int = Field(
        5_000, ge=500, le=600_000,
        description="a shard whose event loop has not beaten for this long is killed and started again (the "
        "others stop sending it work after 2 s of silence already)",
    )
    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)
    # -- the Kafka listener (broker/) --
    kafka_port: int = Field(
        9092, ge=0, le=65535,
        description="Kafka protocol port (shard i of a family listens on kafka_port + i and "
        "is broker i); 0: no Kafka listener",
    )
    kafka_host: str | None = Field(
        None, description="address the Kafka listener binds; default: host"
    )
    kafka_advertised_host: str | None = Field(
        None, description="host name Metadata gives Kafka clients to connect to; default: "
        "kafka_host (or 127.0.0.1 when that is 0.0.0.0 or ::)",
    )
    kafka_auto_create_topics: bool = Field(
        True, description="auto.create.topics.enable: a Kafka client's Metadata request for a "
        "missing topic creates it (default partitions and configs), for a principal that may "
        "administer topics",
    )
    log_dirs: Annotated[tuple[Path, ...], NoDecode] = Field(
        (), description="log.dirs: comma-separated directories for partitions; default: data_dir"
    )
    cors_origins: Annotated[tuple[str, ...], NoDecode] = Field(
        (), description="browser origins allowed to call the API (CORS), comma-separated, e.g. "
        "https://console.example.com; * for any; default: none (browsers get no CORS headers)",
    )
    node_id: int = Field(0, ge=0)
    default_partitions: int = Field(1, ge=1, le=10_000, description="num.partitions for new topics")
    max_partitions: int = Field(
        4096, ge=1, le=1_000_000,
        description="partitions of user topics on this server (the open-files limit caps each process's too, at one descriptor each)",
    )
    topic_defaults: dict[str, Any] = Field(
        default_factory=dict,
        description='JSON object of topic config defaults, e.g. {"segment.bytes": 104857600}',
    )
    recovery_threads: int = Field(2, ge=1, le=64)
    shared_sync: bool = Field(
        True, description="make the commits of many partitions on one filesystem durable with one syncfs "
        "(Linux >= 5.8) instead of an fdatasync each, on ext2/3/4, xfs and btrfs only (where syncfs is known to "
        "flush files; never on FUSE, NFS, overlay, tmpfs or unknown filesystems); false: one fdatasync per partition commit",
    )
    producer_id_expiration_ms: int = Field(
        86_400_000, ge=1000, description="producer.id.expiration.ms: how long after its last append an idempotent "
        "producer (and an Idempotency-Key) is remembered",
    )
    checkpoint_interval_ms: int = Field(60_000, ge=100)
    log_level: str = Field("info", pattern="^(critical|error|warning|info|debug)$")
    access_log: bool = Field(
        True, description="one JSON line per request on the eventlog.access logger (written in batches, at most 0.25 s late)"
    )
    access_log_sample: float = Field(
        1.0, gt=0, le=1, description="fraction of successful requests (status below 400) in the access log; errors always"
    )
    auth_file: Path | None = Field(None, description="JSON file of bearer tokens, roles and topic prefixes; unset: no auth")
    auth_reload_ms: int = Field(
        1000, ge=0, description="how often each server process checks the auth file for changes (and reloads a valid "
        "new version; SIGHUP checks at once); 0: only on SIGHUP",
    )
    max_request_bytes: int = Field(64 * 1024 * 1024, ge=1024, description="largest request body accepted")
    max_inflated_bytes_per_request: int = Field(
        64 * 1024 * 1024, ge=1024 * 1024,
        description="most bytes the compressed batches of one raw produce request may inflate to while their records "
        "are checked (413 request_too_large past it); default: 64 x Kafka's default max.message.bytes",
    )
    # -- limits and quotas (api/policy.py, api/quotas.py, app/server.py) --
    request_timeout_ms: int = Field(
        30_000, ge=100, description="time to receive a request's body; for GETs also to start the answer "
        "(long-polls: plus max_wait_ms; event streams exempt); a response the client does not read for this long is dropped",
    )
    header_timeout_ms: int = Field(10_000, ge=100, description="time for a request line and headers to arrive")
    shutdown_timeout_ms: int = Field(
        30_000, ge=100, description="on SIGTERM: how long open requests may finish (uvicorn's timeout_graceful_shutdown), "
        "then how long partition writers may finish; a shutdown still running after twice this plus 10 s ends the "
        "process at once (exit status 1; the next start recovers)",
    )
    max_header_bytes: int = Field(
        64 * 1024, ge=1024, le=16 * 1024 * 1024,
        description="largest request line + headers (431 above it); uvicorn's h11_max_incomplete_event_size",
    )
    limit_concurrency: int | None = Field(
        None, ge=1, description="uvicorn's limit_concurrency: connections + requests at once, 503 beyond [default: no limit]"
    )
    timeout_keep_alive_ms: int = Field(5_000, ge=100, description="uvicorn's timeout_keep_alive: idle keep-alive connections close after it")
    backlog: int = Field(2048, ge=1, description="uvicorn's backlog: the listen socket's queue of connections not yet accepted")
    ssl_certfile: Path | None = Field(None, description="PEM certificate (chain) file: serve https")
    ssl_keyfile: Path | None = Field(None, description="PEM private key of ssl_certfile")
    ssl_keyfile_password: str | None = Field(None, description="password of an encrypted ssl_keyfile")
    quota_produce_bytes_per_sec: int | None = Field(
        None, ge=1, description="default produce quota per principal: request body bytes/s [default: unlimited]"
    )
    quota_fetch_bytes_per_sec: int | None = Field(
        None, ge=1, description="default fetch quota per principal: response body bytes/s [default: unlimited]"
    )
    quota_window_num: int = Field(11, ge=2, le=1000, description="quota.window.num: samples in a quota's window")
    quota_window_size_ms: int = Field(1000, ge=10, description="quota.window.size.seconds, in ms: one sample's length")
    snapshot_dir: Path | None = Field(
        None, description="where snapshots go [default: <data dir>.snapshots, beside the (first) "
        "log dir; never inside a log dir, which Kafka refuses]; on the log dirs' filesystem, "
        "snapshots hard-link segments, elsewhere they copy them"
    )
    snapshot_max_count: int = Field(
        32, ge=1, le=1_000_000, description="snapshots kept at once; more are refused (507 snapshot_limit) until one is deleted"
    )
    snapshot_max_bytes: int | str = Field(
        "10%", description="disk space snapshots may hold on their own (copies, and links whose live segment is "
        "gone; not links the live log still shares): bytes, or a percentage of the snapshot dir's filesystem; "
        "a snapshot that would pass it is refused (507 snapshot_limit)",
    )
    retention_check_interval_ms: int = Field(
        300_000, ge=100, description="log.retention.check.interval.ms: how often the retention deleter runs"
    )
    cleaner_enabled: bool = Field(True, description="log.cleaner.enable: run the compactor's loop")
    cleaner_backoff_ms: int = Field(15_000, ge=10, description="log.cleaner.backoff.ms: the compactor's sleep when nothing is due")
    cleaner_dedupe_buffer_size: int = Field(
        128 * 1024 * 1024, ge=1024 * 1024, description="log.cleaner.dedupe.buffer.size: the compactor's offset map, bytes"
    )
    cleaner_run_in: Literal["process", "thread"] = Field(
        "process", description="where a compaction pass's CPU work runs: a worker process (default) or a thread"
    )
    cleaner_io_max_bytes_per_sec: float = Field(
        math.inf, gt=0, description="log.cleaner.io.max.bytes.per.second: a compaction pass's bytes read + written "
        "per second, at most [default: unlimited]",
    )
    # this process's place in a shard family (app/shard.py sets it; never from the environment)
    _shard: ShardSpec | None = PrivateAttr(None)

    @field_validator("log_dirs", mode="before")
    @classmethod
    def _split_dirs(cls, value: Any) -> Any:
        if isinstance(value, str):
            return tuple(Path(p.strip()) for p in value.split(",") if p.strip())
        return value

    @field_validator("cors_origins", mode="before")
    @classmethod
    def _split_origins(cls, value: Any) -> Any:
        if isinstance(value, str):
            return tuple(o.strip().rstrip("/") for o in value.split(",") if o.strip())
        return value

    @field_validator("snapshot_max_bytes", mode="before")
    @classmethod
    def _parse_snapshot_max_bytes(cls, value: Any) -> Any:
        if isinstance(value, str) and value.strip().endswith("%"):
            try:
                percent = float(value.strip()[:-1])
            except ValueError:
                raise ValueError(f"{value!r}: expected bytes or a percentage such as 10%") from None
            if not 0 < percent <= 100:
                raise ValueError(f"{value!r}: a percentage above 0 and at most 100")
            return f"{percent:g}%"
        try:
            size = int(value)
        except (TypeError, ValueError):
            raise ValueError(f"{value!r}: expected bytes or a percentage such as 10%") from None
        if isinstance(value, bool) or size < 1:
            raise ValueError(f"{value!r}: at least 1 byte")
        return size

    @model_validator(mode="after")
    def _check_topic_defaults(self) -> Settings:
        try:
            config = LogConfig().with_overrides(self.topic_defaults)
        except InvalidConfigError as exc:
            raise ValueError(f"topic_defaults: {exc}") from exc
        if config.segment_bytes < config.max_message_bytes:
            raise ValueError(
                f"topic_defaults: segment.bytes ({config.segment_bytes}) is smaller than max.message.bytes "
                f"({config.max_message_bytes}); batches between the two sizes could never be stored"
            )
        return self

    @field_validator("auth_reload_ms")
    @classmethod
    def _check_auth_reload(cls, value: int) -> int:
        if 0 < value < 100:
            raise ValueError(f"{value}: 0 (only on SIGHUP) or at least 100 ms")
        return value

    @model_validator(mode="after")
    def _check_tls(self) -> Settings:
        if self.ssl_keyfile is not None and self.ssl_certfile is None:
            raise ValueError("ssl_keyfile needs ssl_certfile")
        for name in ("ssl_certfile", "ssl_keyfile"):
            path = getattr(self, name)
            if path is not None and not path.is_file():
                raise ValueError(f"{name}: {path} is not a readable file")
        return self

    def quota_config(self) -> QuotaConfig:
        from api.quotas import QuotaConfig

        return QuotaConfig(
            produce_bytes_per_sec=self.quota_produce_bytes_per_sec,
            fetch_bytes_per_sec=self.quota_fetch_bytes_per_sec,
            window_num=self.quota_window_num,
            window_size_ms=self.quota_window_size_ms,
        )

    def snapshot_limits(self) -> SnapshotLimits:
        from engine.snapshots import SnapshotLimits

        if isinstance(self.snapshot_max_bytes, str):
            fraction = float(self.snapshot_max_bytes.removesuffix("%")) / 100
            return SnapshotLimits(self.snapshot_max_count, max_disk_fraction=fraction)
        return SnapshotLimits(self.snapshot_max_count, max_bytes=self.snapshot_max_bytes)

    @property
    def snapshot_root(self) -> Path:
        from engine.snapshots import default_root

        return self.snapshot_dir or default_root(self.effective_log_dirs[0])

    @property
    def legacy_snapshot_root(self) -> Path:
        """Where older versions kept snapshots by default, inside the first log dir: moved out
        at start-up (engine/snapshots.py, move_legacy)."""
        from engine.snapshots import LEGACY_DIR

        return self.effective_log_dirs[0] / LEGACY_DIR

    @property
    def effective_log_dirs(self) -> tuple[Path, ...]:
        return self.log_dirs or (self.data_dir,)

    def worker_settings(self) -> WorkerSettings:
        from workers.manager import WorkerSettings

        return WorkerSettings(
            retention_check_interval_ms=self.retention_check_interval_ms,
            cleaner_enabled=self.cleaner_enabled,
            cleaner_backoff_ms=self.cleaner_backoff_ms,
            dedupe_buffer_bytes=self.cleaner_dedupe_buffer_size,
            cleaner_run_in=self.cleaner_run_in,
            cleaner_io_max_bytes_per_s=self.cleaner_io_max_bytes_per_sec,
        )

    def engine_config(self) -> EngineConfig:
        from engine.log_manager import EngineConfig

        return EngineConfig(
            log_dirs=self.effective_log_dirs,
            default_log_config=LogConfig().with_overrides(self.topic_defaults),
            node_id=self.node_id,
            recovery_threads=self.recovery_threads,
            checkpoint_interval_ms=self.checkpoint_interval_ms,
            default_partitions=self.default_partitions,
            max_partitions=self.max_partitions,
            producer_id_expiration_ms=self.producer_id_expiration_ms,
            writer_stop_timeout_ms=self.shutdown_timeout_ms,
            shard=self._shard,
            shared_sync=self.shared_sync,
        )

    @property
    def shard(self) -> ShardSpec | None:
        """This process's place in a shard family; None in a single process."""
        return self._shard

    def for_shard(self, shard: ShardSpec) -> Settings:
        """These settings for shard `shard` of a family: engine_config() carries it."""
        copy = self.model_copy()
        copy._shard = shard
        return copy

    def to_json(self) -> str:
        """Every field, for from_json() in another process (a shard gets its supervisor's
        settings this way, CLI flags included). Standard JSON but for an unlimited float, written
        as Infinity (Python's json reads it back; JSON null would not validate)."""
        return json.dumps(self.model_dump(mode="json"))

    @classmethod
    def from_json(cls, text: str) -> Settings:
        """The settings to_json() wrote, equal to the original (every field given, so nothing
        comes from this process's environment)."""
        return cls.model_validate(json.loads(text))

    @property
    def kafka_bind_host(self) -> str:
        return self.kafka_host or self.host

    @property
    def kafka_advertised(self) -> str:
        """The host Kafka clients are told to connect to (Metadata, FindCoordinator)."""
        if self.kafka_advertised_host:
            return self.kafka_advertised_host
        host = self.kafka_bind_host
        return "127.0.0.1" if host in ("0.0.0.0", "::", "") else host

    @property
    def listens_beyond_loopback(self) -> bool:
        return self.host not in ("127.0.0.1", "::1", "localhost")
