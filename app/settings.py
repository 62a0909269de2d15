"""Server settings: one pydantic-settings model, environment prefix EVENTLOG_.

Every field can be set as EVENTLOG_<FIELD> (EVENTLOG_DATA_DIR, EVENTLOG_PORT, ...); the CLI's
flags override the environment. Built once by app/ and handed down; the engine receives the
plain EngineConfig that engine_config() derives.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from engine.config import LogConfig
from engine.errors import InvalidConfigError
from engine.log_manager import EngineConfig
from workers.manager import WorkerSettings


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="EVENTLOG_", extra="ignore", frozen=True)

    data_dir: Path = Field(Path("./data"), description="where topics live (and snapshots)")
    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)
    log_dirs: Annotated[tuple[Path, ...], NoDecode] = Field(
        (), description="log.dirs: comma-separated directories for partitions; default: data_dir"
    )
    node_id: int = Field(0, ge=0)
    default_partitions: int = Field(1, ge=1, le=10_000, description="num.partitions for new topics")
    max_partitions: int = Field(
        4096, ge=1, le=1_000_000,
        description="partitions of user topics on this server (each active one holds three file descriptors)",
    )
    topic_defaults: dict[str, Any] = Field(
        default_factory=dict,
        description='JSON object of topic config defaults, e.g. {"segment.bytes": 104857600}',
    )
    recovery_threads: int = Field(2, ge=1, le=64)
    checkpoint_interval_ms: int = Field(60_000, ge=100)
    log_level: str = Field("info", pattern="^(critical|error|warning|info|debug)$")
    access_log: bool = Field(True, description="one JSON line per request on the eventlog.access logger")
    auth_file: Path | None = Field(None, description="JSON file of bearer tokens, roles and topic prefixes; unset: no auth")
    max_request_bytes: int = Field(64 * 1024 * 1024, ge=1024, description="largest request body accepted")
    snapshot_dir: Path | None = Field(
        None, description="where snapshots go [default: <data dir>/snapshots]; on the log dirs' filesystem, "
        "snapshots hard-link segments, elsewhere they copy them"
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

    @field_validator("log_dirs", mode="before")
    @classmethod
    def _split_dirs(cls, value: Any) -> Any:
        if isinstance(value, str):
            return tuple(Path(p.strip()) for p in value.split(",") if p.strip())
        return value

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

    @property
    def snapshot_root(self) -> Path:
        return self.snapshot_dir or self.effective_log_dirs[0] / "snapshots"

    @property
    def effective_log_dirs(self) -> tuple[Path, ...]:
        return self.log_dirs or (self.data_dir,)

    def worker_settings(self) -> WorkerSettings:
        return WorkerSettings(
            retention_check_interval_ms=self.retention_check_interval_ms,
            cleaner_enabled=self.cleaner_enabled,
            cleaner_backoff_ms=self.cleaner_backoff_ms,
            dedupe_buffer_bytes=self.cleaner_dedupe_buffer_size,
            cleaner_run_in=self.cleaner_run_in,
        )

    def engine_config(self) -> EngineConfig:
        return EngineConfig(
            log_dirs=self.effective_log_dirs,
            default_log_config=LogConfig().with_overrides(self.topic_defaults),
            node_id=self.node_id,
            recovery_threads=self.recovery_threads,
            checkpoint_interval_ms=self.checkpoint_interval_ms,
            default_partitions=self.default_partitions,
            max_partitions=self.max_partitions,
        )

    @property
    def listens_beyond_loopback(self) -> bool:
        return self.host not in ("127.0.0.1", "::1", "localhost")
