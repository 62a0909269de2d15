"""The `eventlog` command: serve, dump-log, import-kafka, version."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Callable, Iterator, Optional

import typer
import uvicorn
from pydantic import ValidationError
from rich.console import Console
from rich.markup import escape

from .settings import Settings

cli = typer.Typer(
    name="eventlog",
    help="Apache Kafka's log layer behind a REST API.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
err = Console(stderr=True, highlight=False, soft_wrap=True)
# beyond the two shutdown_timeout_ms waits: checkpoints, the clean-shutdown markers
SHUTDOWN_SLACK_S = 10.0


def _settings(**overrides: object) -> Settings:
    given = {k: v for k, v in overrides.items() if v is not None}
    try:
        return Settings(**given)  # type: ignore[arg-type]
    except ValidationError as exc:
        err.print(f"[red]invalid settings:[/red] {escape(str(exc))}")
        raise typer.Exit(2) from None


class _Server(uvicorn.Server):
    """uvicorn's server, minus re-raising the shutdown signal afterwards: SIGTERM and SIGINT
    mean a clean shutdown and exit status 0. The first signal also ends long-polls and event
    streams at once (on_exit), so the graceful wait for open requests is short, and arms a
    watchdog: a shutdown still running `watchdog_s` later (a writer stuck in a system call on a
    hung disk, which no task can cancel) ends the process with status 1. Acknowledged appends
    were fsynced; the next start recovers as after a crash."""

    on_exit: Callable[[], None] | None = None
    watchdog_s: float | None = None
    _watchdog: threading.Timer | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        super().handle_exit(sig, frame)
        if self._watchdog is None and self.watchdog_s is not None:
            self._watchdog = threading.Timer(self.watchdog_s, _shutdown_overdue, (self.watchdog_s,))
            self._watchdog.daemon = True
            self._watchdog.start()
        if self.on_exit is not None:
            self.on_exit()

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        handled = (signal.SIGINT, signal.SIGTERM)
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in handled}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def _shutdown_overdue(after_s: float) -> None:
    logging.getLogger("eventlog.app").error(
        "shutdown did not finish within %.0f s of the signal; exiting now without a clean close "
        "(the next start recovers the partitions)", after_s,
    )
    logging.shutdown()
    os._exit(1)


class _HideStartupTraceback(logging.Filter):
    """When the engine refuses to start (a locked or broken data dir), the lifespan has logged
    one clear line and the CLI prints it again; uvicorn's traceback of it adds only noise."""

    def __init__(self, app: object) -> None:
        super().__init__()
        self.app = app

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.levelno >= logging.ERROR and self.app.state.startup_error is not None)  # type: ignore[attr-defined]


def _configure_logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


@cli.command()
def serve(
    data_dir: Optional[Path] = typer.Option(None, "--data-dir", help="data directory [env EVENTLOG_DATA_DIR; default ./data]"),
    host: Optional[str] = typer.Option(None, "--host", help="listen address [env EVENTLOG_HOST; default 127.0.0.1]"),
    port: Optional[int] = typer.Option(None, "--port", help="listen port [env EVENTLOG_PORT; default 8080]"),
    log_level: Optional[str] = typer.Option(None, "--log-level", help="critical|error|warning|info|debug"),
    ssl_certfile: Optional[Path] = typer.Option(None, "--ssl-certfile", help="PEM certificate: serve https [env EVENTLOG_SSL_CERTFILE]"),
    ssl_keyfile: Optional[Path] = typer.Option(None, "--ssl-keyfile", help="PEM private key [env EVENTLOG_SSL_KEYFILE]"),
    limit_concurrency: Optional[int] = typer.Option(
        None, "--limit-concurrency", help="connections + requests at once, 503 beyond [env EVENTLOG_LIMIT_CONCURRENCY]"
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
) -> None:
    """Run the HTTP service until SIGTERM or SIGINT, then shut down cleanly."""
    from api.auth import AuthConfigError

    from .main import begin_shutdown, create_app
    from .server import uvicorn_config

    settings = _settings(
        data_dir=data_dir, host=host, port=port, log_level=log_level, ssl_certfile=ssl_certfile, ssl_keyfile=ssl_keyfile,
        limit_concurrency=limit_concurrency, timeout_keep_alive_ms=timeout_keep_alive_ms, backlog=backlog,
        max_header_bytes=max_header_bytes, header_timeout_ms=header_timeout_ms, request_timeout_ms=request_timeout_ms,
    )
    _configure_logging(settings.log_level)
    log = logging.getLogger("eventlog.app")
    if settings.listens_beyond_loopback and settings.auth_file is None:
        log.warning(
            "listening on %s without EVENTLOG_AUTH_FILE: anyone who can reach this address can read, "
            "write and delete every topic", settings.host,
        )
    elif settings.listens_beyond_loopback and settings.ssl_certfile is None:
        log.warning("listening on %s without TLS (EVENTLOG_SSL_CERTFILE): bearer tokens cross the network in clear", settings.host)
    try:
        app = create_app(settings)
    except AuthConfigError as exc:
        err.print(f"[red]eventlog: cannot start:[/red] {escape(str(exc))}")
        raise typer.Exit(2) from None
    logging.getLogger("uvicorn.error").addFilter(_HideStartupTraceback(app))
    server = _Server(uvicorn_config(app, settings))
    server.on_exit = lambda: begin_shutdown(app)
    # requests get shutdown_timeout_ms, then the partition writers as long again
    server.watchdog_s = 2 * settings.shutdown_timeout_ms / 1000 + SHUTDOWN_SLACK_S
    try:
        server.run()  # on uvloop when installed (uvicorn picks the loop)
    except SystemExit:  # uvicorn exits with status 3 when the lifespan fails
        pass
    if app.state.startup_error is not None:
        err.print(f"[red]eventlog: cannot start:[/red] {escape(str(app.state.startup_error))}")
        raise typer.Exit(1)
    if not server.started:
        raise typer.Exit(1)


@cli.command("dump-log")
def dump_log(
    files: list[Path] = typer.Argument(..., exists=True, dir_okay=False, help=".log, .index or .timeindex files"),
    verify: bool = typer.Option(False, "--verify", help="check every batch's CRC and every index entry against the log"),
    records: bool = typer.Option(False, "--records", help="print each record, not only batches"),
    values: bool = typer.Option(False, "--print-values", help="with --records, print keys and values too"),
) -> None:
    """Print what a segment file holds, like Kafka's kafka-dump-log.sh; non-zero exit on a problem."""
    from .dump import run_dump

    raise typer.Exit(run_dump(files, verify=verify, records=records, values=values))


@cli.command("import-kafka")
def import_kafka(
    kafka_log_dir: Path = typer.Argument(..., exists=True, file_okay=False, help="a Kafka broker's log.dirs entry"),
    data_dir: Optional[Path] = typer.Option(None, "--data-dir", help="eventlog data directory [default ./data]"),
    topics: Optional[str] = typer.Option(None, "--topics", help="comma-separated topics to import (default: all)"),
    link: bool = typer.Option(False, "--link/--copy", help="hard-link segment files instead of copying them"),
) -> None:
    """Adopt partition directories written by Apache Kafka into an eventlog data dir."""
    from .importer import run_import

    settings = _settings(data_dir=data_dir)
    _configure_logging("warning")
    wanted = [t.strip() for t in topics.split(",") if t.strip()] if topics else None
    raise typer.Exit(run_import(settings, kafka_log_dir, wanted, link=link))


@cli.command()
def snapshot(
    topics: Optional[str] = typer.Option(None, "--topics", help="comma-separated topics (default: every user topic)"),
    url: Optional[str] = typer.Option(
        None, "--url", envvar="EVENTLOG_URL", help="a running server, e.g. http://127.0.0.1:8080 [env EVENTLOG_URL]"
    ),
    token: Optional[str] = typer.Option(None, "--token", envvar="EVENTLOG_TOKEN", help="bearer token for --url"),
    data_dir: Optional[Path] = typer.Option(None, "--data-dir", help="without --url: a data dir no server is using"),
) -> None:
    """Take a consistent snapshot (hard links + manifest.json) for Spark or a backup."""
    from .snapshot import run_snapshot

    settings = _settings(data_dir=data_dir)
    _configure_logging("warning")
    wanted = [t.strip() for t in topics.split(",") if t.strip()] if topics else None
    raise typer.Exit(run_snapshot(settings, wanted, url=url, token=token))


@cli.command()
def nightly(
    snapshot: Path = typer.Option(
        ..., "--snapshot", exists=True, file_okay=False,
        help="a snapshot directory (with manifest.json), or a directory of snapshots: the newest is read",
    ),
    out: Path = typer.Option(..., "--out", help="output directory: Parquet tables and daily counts"),
    topics: Optional[str] = typer.Option(None, "--topics", help="comma-separated topics (default: every user topic)"),
    master: str = typer.Option("local[2]", "--master", help="Spark master for the local session"),
    memory: str = typer.Option("1g", "--driver-memory", help="Spark driver memory"),
) -> None:
    """Run the nightly Spark job over a snapshot: table views of compacted topics, daily counts."""
    from .nightly import run_nightly_cli

    wanted = [t.strip() for t in topics.split(",") if t.strip()] if topics else None
    raise typer.Exit(run_nightly_cli(snapshot, out, wanted, master=master, memory=memory))


@cli.command()
def version() -> None:
    """Print the version."""
    from .main import __version__

    typer.echo(f"eventlog {__version__}")


def main() -> None:
    cli()


if __name__ == "__main__":
    main()
