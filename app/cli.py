"""The `eventlog` command: serve, dump-log, import-kafka, snapshot, upload-snapshot, prune-upload, nightly,
groups reset-offsets, version."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import typer

# app.server (uvicorn, FastAPI, every router: about half a CPU-second to import) is imported by
# `serve` alone, and the settings (pydantic, a fifth of a second) by the commands that read
# them: --help, --version and `groups reset-offsets` start with typer alone (issue 24;
# tests/app/test_cli.py holds it).
from . import __version__
from .startup import CannotStart, configure_logging

if TYPE_CHECKING:
    from .settings import Settings

cli = typer.Typer(
    name="eventlog",
    help="Apache Kafka's log layer behind a REST API.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # help texts are plain: their "[env EVENTLOG_...]" is not markup
)


def _print_error(markup: str, detail: str | None = None) -> None:
    """One error line on stderr: `markup` in rich's markup, then `detail` as plain text. rich
    is imported here, not at the top: a command that does not fail never loads it."""
    from rich.console import Console
    from rich.markup import escape

    line = markup if detail is None else f"{markup} {escape(detail)}"
    Console(stderr=True, highlight=False, soft_wrap=True).print(line)


class PlainUsage(typer.core.TyperCommand):
    """A command whose usage line names its arguments as click does (`FILE...`, `SNAPSHOT_DIR`,
    `[URI]` when optional) where typer writes `{files}`, `{SNAPSHOT_DIR}`."""

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        pieces = [self.options_metavar] if self.options_metavar else []
        for param in self.get_params(ctx):
            if isinstance(param, typer.core.TyperArgument):
                name = param.make_metavar(ctx)  # the plain metavar (typer adds braces for usage)
                pieces.append(name if param.required else f"[{name}]")
            else:
                pieces.extend(param.get_usage_pieces(ctx))
        return pieces


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"eventlog {__version__}")
        raise typer.Exit()


@cli.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", is_eager=True, callback=_print_version, help="print the version and exit"
    ),
) -> None:
    """Apache Kafka's log layer behind a REST API. Each command's --help lists its options,
    with the EVENTLOG_* variable each one reads; docs/OPERATIONS.md has every setting."""


# False: `eventlog serve` without --processes or EVENTLOG_PROCESSES runs one process, as before
# the shard family existed. True: it runs Settings.processes' default, one shard per core.
SHARDS_BY_DEFAULT = True


def _settings(**overrides: object) -> Settings:
    from pydantic import ValidationError

    from .settings import Settings

    given = {k: v for k, v in overrides.items() if v is not None}
    try:
        return Settings(**given)  # type: ignore[arg-type]
    except ValidationError as exc:
        _print_error("[red]invalid settings:[/red]", str(exc))
        raise typer.Exit(2) from None


SERVE_EPILOG = (
    "Every setting is also an EVENTLOG_* variable, most with no option here (docs/OPERATIONS.md, "
    "\"Settings\", lists them all). Among them: authentication, EVENTLOG_AUTH_FILE (a JSON file of "
    "bearer tokens, roles and prefixes; unset: no auth; edits apply without a restart); quotas, "
    "EVENTLOG_QUOTA_PRODUCE_BYTES_PER_SEC and EVENTLOG_QUOTA_FETCH_BYTES_PER_SEC (per token); "
    "snapshot limits, EVENTLOG_SNAPSHOT_DIR, EVENTLOG_SNAPSHOT_MAX_COUNT (32) and "
    "EVENTLOG_SNAPSHOT_MAX_BYTES (10%); the Kafka listener, EVENTLOG_KAFKA_PORT; request limits, "
    "EVENTLOG_MAX_REQUEST_BYTES. Running it: docs/OPERATIONS.md."
)


@cli.command(
    cls=PlainUsage, epilog=SERVE_EPILOG,
    short_help="Run the HTTP service (and the Kafka listener) until SIGTERM or SIGINT.",
)
def serve(
    data_dir: Optional[Path] = typer.Option(None, "--data-dir", help="data directory [env EVENTLOG_DATA_DIR; default ./data]"),
    host: Optional[str] = typer.Option(None, "--host", help="listen address [env EVENTLOG_HOST; default 127.0.0.1]"),
    port: Optional[int] = typer.Option(None, "--port", help="listen port [env EVENTLOG_PORT; default 8080]"),
    log_level: Optional[str] = typer.Option(None, "--log-level", help="critical|error|warning|info|debug [env EVENTLOG_LOG_LEVEL; default info]"),
    ssl_certfile: Optional[Path] = typer.Option(None, "--ssl-certfile", help="PEM certificate: serve https [env EVENTLOG_SSL_CERTFILE; default none: http]"),
    ssl_keyfile: Optional[Path] = typer.Option(None, "--ssl-keyfile", help="PEM private key [env EVENTLOG_SSL_KEYFILE; default none]"),
    limit_concurrency: Optional[int] = typer.Option(
        None, "--limit-concurrency", help="connections + requests at once, 503 beyond [env EVENTLOG_LIMIT_CONCURRENCY; default none]"
    ),
    timeout_keep_alive_ms: Optional[int] = typer.Option(
        None, "--timeout-keep-alive-ms", help="close idle keep-alive connections after this [env EVENTLOG_TIMEOUT_KEEP_ALIVE_MS; 5000]"
    ),
    backlog: Optional[int] = typer.Option(None, "--backlog", help="listen queue length [env EVENTLOG_BACKLOG; 2048]"),
    max_header_bytes: Optional[int] = typer.Option(
        None, "--max-header-bytes", help="largest request line + headers [env EVENTLOG_MAX_HEADER_BYTES; 65536]"
    ),
    header_timeout_ms: Optional[int] = typer.Option(
        None, "--header-timeout-ms", help="time for a request's headers to arrive [env EVENTLOG_HEADER_TIMEOUT_MS; 10000]"
    ),
    request_timeout_ms: Optional[int] = typer.Option(
        None, "--request-timeout-ms", help="time for a body to arrive, a GET to answer [env EVENTLOG_REQUEST_TIMEOUT_MS; 30000]"
    ),
    processes: Optional[int] = typer.Option(
        None, "--processes", help="shard processes serving the data dir together; 1: one process [env EVENTLOG_PROCESSES; default: the number of cores]"
    ),
) -> None:
    """Run the HTTP service until SIGTERM or SIGINT, then shut down cleanly."""
    settings = _settings(
        data_dir=data_dir, host=host, port=port, log_level=log_level, ssl_certfile=ssl_certfile, ssl_keyfile=ssl_keyfile,
        limit_concurrency=limit_concurrency, timeout_keep_alive_ms=timeout_keep_alive_ms, backlog=backlog,
        max_header_bytes=max_header_bytes, header_timeout_ms=header_timeout_ms, request_timeout_ms=request_timeout_ms,
        processes=processes,
    )
    if "processes" not in settings.model_fields_set and not SHARDS_BY_DEFAULT:
        settings = settings.model_copy(update={"processes": 1})
    if settings.processes > 1:
        configure_logging(settings.log_level, "supervisor")
    else:
        configure_logging(settings.log_level)
    log = logging.getLogger("eventlog.app")
    if settings.listens_beyond_loopback and settings.auth_file is None:
        log.warning(
            "listening on %s without EVENTLOG_AUTH_FILE: anyone who can reach this address can read, "
            "write and delete every topic", settings.host,
        )
    elif settings.listens_beyond_loopback and settings.ssl_certfile is None:
        log.warning("listening on %s without TLS (EVENTLOG_SSL_CERTFILE): bearer tokens cross the network in clear", settings.host)
    try:
        if settings.processes > 1:
            from .supervisor import supervise

            status = supervise(settings)
            if status != 0:
                raise typer.Exit(status)
            return
        from .server import serve as serve_http

        serve_http(settings)
    except CannotStart as exc:
        if exc.message is not None:
            _print_error("[red]eventlog: cannot start:[/red]", exc.message)
        raise typer.Exit(exc.status) from None


@cli.command(
    "dump-log", cls=PlainUsage,
    short_help="Print segment files, like kafka-dump-log.sh; --verify checks them.",
)
def dump_log(
    files: list[Path] = typer.Argument(
        ..., exists=True, dir_okay=False, metavar="FILE...",
        help=".log, .index, .timeindex or .keyindex files, or a partition's dropped-offsets-checkpoint",
    ),
    verify: bool = typer.Option(False, "--verify", help="check every batch's CRC and every index entry against the log"),
    records: bool = typer.Option(False, "--records", help="print each record, not only batches"),
    values: bool = typer.Option(False, "--print-values", help="with --records, print keys and values too"),
) -> None:
    """Print what a segment file holds, like Kafka's kafka-dump-log.sh; non-zero exit on a problem."""
    from .dump import run_dump

    raise typer.Exit(run_dump(files, verify=verify, records=records, values=values))


@cli.command(
    "import-kafka", cls=PlainUsage,
    short_help="Adopt an Apache Kafka broker's partition directories.",
    epilog="Reads EVENTLOG_DATA_DIR for the data directory when --data-dir is not given.",
)
def import_kafka(
    kafka_log_dir: Path = typer.Argument(
        ..., exists=True, file_okay=False, metavar="KAFKA_LOG_DIR", help="a Kafka broker's log.dirs entry"
    ),
    data_dir: Optional[Path] = typer.Option(
        None, "--data-dir", help="eventlog data directory [env EVENTLOG_DATA_DIR; default ./data]"
    ),
    topics: Optional[str] = typer.Option(None, "--topics", help="comma-separated topics to import (default: all)"),
    link: bool = typer.Option(False, "--link/--copy", help="hard-link segment files instead of copying them"),
) -> None:
    """Adopt partition directories written by Apache Kafka into an eventlog data dir."""
    from .importer import run_import

    settings = _settings(data_dir=data_dir)
    configure_logging("warning")
    wanted = [t.strip() for t in topics.split(",") if t.strip()] if topics else None
    raise typer.Exit(run_import(settings, kafka_log_dir, wanted, link=link))


@cli.command(
    cls=PlainUsage,
    short_help="Take a consistent snapshot (hard links + manifest.json) for Spark or a backup.",
)
def snapshot(
    topics: Optional[str] = typer.Option(None, "--topics", help="comma-separated topics (default: every user topic)"),
    url: Optional[str] = typer.Option(
        None, "--url", envvar="EVENTLOG_URL", show_envvar=False,
        help="a running server, e.g. http://127.0.0.1:8080 [env EVENTLOG_URL; default: none, the data dir]",
    ),
    token: Optional[str] = typer.Option(
        None, "--token", envvar="EVENTLOG_TOKEN", show_envvar=False,
        help="an admin's bearer token for --url [env EVENTLOG_TOKEN]",
    ),
    data_dir: Optional[Path] = typer.Option(
        None, "--data-dir",
        help="without --url: a data dir no server is using; with --url and --to: the server's "
        "[env EVENTLOG_DATA_DIR; default ./data]",
    ),
    to: Optional[str] = typer.Option(
        None, "--to", metavar="URI",
        help="then upload it, incrementally: s3://bucket/prefix, any pyarrow filesystem URI, or a directory "
        "(AWS_* env for S3); with --url, run where the server's snapshot dir is readable",
    ),
) -> None:
    """Take a consistent snapshot (hard links + manifest.json) for Spark or a backup."""
    from .snapshot import run_snapshot

    settings = _settings(data_dir=data_dir)
    configure_logging("warning")
    wanted = [t.strip() for t in topics.split(",") if t.strip()] if topics else None
    raise typer.Exit(run_snapshot(settings, wanted, url=url, token=token, to=to))


@cli.command(
    "upload-snapshot", cls=PlainUsage,
    short_help="Upload a finished snapshot to shared storage (S3, any pyarrow URI), incrementally.",
    epilog="S3 credentials and region come from the AWS_* variables (AWS_ACCESS_KEY_ID, "
    "AWS_SECRET_ACCESS_KEY, AWS_REGION, AWS_ENDPOINT_URL) or the machine's role.",
)
def upload_snapshot(
    directory: Path = typer.Argument(
        ..., exists=True, file_okay=False, metavar="SNAPSHOT_DIR", help="a snapshot directory (with manifest.json)"
    ),
    to: str = typer.Option(
        ..., "--to", metavar="URI",
        help="s3://bucket/prefix, any pyarrow filesystem URI, or a directory; segments already there are not sent again",
    ),
) -> None:
    """Upload a finished snapshot to shared storage, incrementally (for Spark on a cluster)."""
    from .snapshot import run_upload

    configure_logging("warning")
    raise typer.Exit(run_upload(directory, to))


@cli.command(
    "prune-upload", cls=PlainUsage,
    short_help="Remove old snapshots from an upload root, and segments none names.",
    epilog="S3 credentials and region come from the AWS_* variables or the machine's role.",
)
def prune_upload(
    root: str = typer.Argument(
        ..., metavar="URI", help="an upload root: what snapshot --to and upload-snapshot --to were given"
    ),
    keep: Optional[int] = typer.Option(
        None, "--keep", min=0, metavar="N", help="keep the newest N finished snapshots, remove the others (default: keep all)"
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="list what would be removed, remove nothing"),
    grace_ms: int = typer.Option(
        3_600_000, "--grace-ms", min=0,  # analytics.prune.GRACE_MS (not imported: pyarrow may be missing)
        help="leave objects and unfinished snapshots younger than this (uploads in progress); longer than the longest upload",
    ),
) -> None:
    """Remove old snapshots from an upload root, then the segment objects no remaining manifest names."""
    from .snapshot import run_prune

    configure_logging("warning")
    raise typer.Exit(run_prune(root, keep, dry_run=dry_run, grace_ms=grace_ms))


@cli.command(
    cls=PlainUsage,
    short_help="Run the nightly Spark job over a snapshot: tables of compacted topics, daily counts.",
    epilog="Environment: JAVA_HOME, the Java 17 Spark runs on (default: one found in the usual "
    "places); AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION, AWS_ENDPOINT_URL for an s3:// "
    "--snapshot. The session runs with TZ=UTC and SPARK_LOCAL_IP=127.0.0.1 unless they are set.",
)
def nightly(
    snapshot: str = typer.Option(
        ..., "--snapshot",
        help="a snapshot directory (with manifest.json), or a directory of snapshots: the newest is read; "
        "local or a URI (s3://bucket/prefix/snapshots, AWS_* env)",
    ),
    out: str = typer.Option(..., "--out", help="output directory (local, or a mount): Parquet tables and daily counts"),
    topics: Optional[str] = typer.Option(None, "--topics", help="comma-separated topics (default: every user topic)"),
    master: str = typer.Option("local[2]", "--master", help="Spark master for the local session"),
    memory: str = typer.Option("1g", "--driver-memory", help="Spark driver memory"),
    full: bool = typer.Option(False, "--full", help="forget the last run's watermarks: rebuild every output from the snapshot"),
    schema: list[str] = typer.Option(
        [], "--schema", metavar="TOPIC=SCHEMA",
        help="a topic's value schema (Spark DDL, or a DDL or JSON Schema file): its table gets typed columns; repeatable",
    ),
) -> None:
    """Run the nightly Spark job over a snapshot: table views of compacted topics, daily counts."""
    from .nightly import run_nightly_cli

    wanted = [t.strip() for t in topics.split(",") if t.strip()] if topics else None
    raise typer.Exit(run_nightly_cli(snapshot, out, wanted, master=master, memory=memory, full=full, schemas=schema))


groups = typer.Typer(
    help="Consumer groups on a running server (Kafka's kafka-consumer-groups.sh).",
    no_args_is_help=True, rich_markup_mode=None,
)
cli.add_typer(
    groups, name="groups", short_help="Consumer groups on a running server: reset-offsets."
)


@groups.command(
    "reset-offsets", cls=PlainUsage,
    short_help="Reset a group's offsets, as kafka-consumer-groups.sh --reset-offsets.",
)
def reset_offsets(
    group: str = typer.Argument(..., metavar="GROUP", help="the consumer group"),
    topic: Optional[str] = typer.Option(
        None, "--topic", metavar="TOPIC[:P,P]",
        help="a topic (all its partitions), or some: orders:0,2",
    ),
    all_topics: bool = typer.Option(
        False, "--all-topics", help="every topic the group has offsets on"
    ),
    to_earliest: bool = typer.Option(False, "--to-earliest", help="to the log start offset"),
    to_latest: bool = typer.Option(False, "--to-latest", help="to the high watermark"),
    to_datetime: Optional[str] = typer.Option(
        None, "--to-datetime", metavar="ISO-8601",
        help="to the first record at or after this time, e.g. 2024-05-01T09:30:00Z (no zone: UTC)",
    ),
    to_offset: Optional[int] = typer.Option(
        None, "--to-offset", metavar="N", min=0, help="to offset N"
    ),
    shift_by: Optional[int] = typer.Option(
        None, "--shift-by", metavar="N", help="the committed offset plus N (negative: back)"
    ),
    execute: bool = typer.Option(False, "--execute", help="commit the new offsets"),
    dry_run: bool = typer.Option(
        False, "--dry-run", help="print the new offsets only (the default)"
    ),
    url: str = typer.Option(
        "http://127.0.0.1:8080", "--url", envvar="EVENTLOG_URL", show_envvar=False,
        help="the server [env EVENTLOG_URL]",
    ),
    token: Optional[str] = typer.Option(
        None, "--token", envvar="EVENTLOG_TOKEN", show_envvar=False,
        help="bearer token (a consumer of the group, or admin) [env EVENTLOG_TOKEN]",
    ),
) -> None:
    """Reset a group's committed offsets, as kafka-consumer-groups.sh --reset-offsets: refused
    while the group has live Kafka members; without --execute nothing is committed."""
    from .group_admin import run_reset

    if execute and dry_run:
        _print_error("[red]reset-offsets:[/red] give --execute or --dry-run, not both")
        raise typer.Exit(2)
    chosen = {
        "to_earliest": True if to_earliest else None, "to_latest": True if to_latest else None,
        "to_datetime": to_datetime, "to_offset": to_offset, "shift_by": shift_by,
    }
    strategy = {k: v for k, v in chosen.items() if v is not None}
    raise typer.Exit(run_reset(url, token, group, topic, all_topics, strategy, execute))


@cli.command(cls=PlainUsage, short_help="Print the version (also: eventlog --version).")
def version() -> None:
    """Print the version."""
    typer.echo(f"eventlog {__version__}")


def main() -> None:
    cli()


if __name__ == "__main__":
    main()
