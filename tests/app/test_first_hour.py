"""A new user's first hour (issue 15): what `make run`, `eventlog serve --help` and the first
start of a new data dir say and do."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
import tomllib
from pathlib import Path

import httpx
import pytest

from ..conftest import REPO, VENV_BIN, free_port


def test_make_run_honours_the_environment(tmp_path: Path) -> None:
    """The README says every setting is an environment variable: `make run` must not override
    EVENTLOG_DATA_DIR, EVENTLOG_HOST and EVENTLOG_PORT with flags of its own."""
    port = free_port()
    data = tmp_path / "elsewhere"
    env = {**os.environ, "EVENTLOG_PORT": str(port), "EVENTLOG_HOST": "127.0.0.1", "EVENTLOG_DATA_DIR": str(data),
           "EVENTLOG_PROCESSES": "1"}
    proc = subprocess.Popen(["make", "--no-print-directory", "run"], cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else ""
            try:
                if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        else:
            pytest.fail("make run did not serve on EVENTLOG_PORT")
        assert (data / "meta.properties").exists(), "the data dir is EVENTLOG_DATA_DIR's"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # make and the server: make ends by the signal too
        out = proc.communicate(timeout=60)[0].decode()
    assert "engine closed (clean)" in out, out


def _name(requirement: str) -> str:
    """A requirement's distribution name, normalised as PEP 503 does."""
    from packaging.requirements import Requirement

    return re.sub(r"[-_.]+", "-", Requirement(requirement).name).lower()


def _service_closure(requirements: list[str]) -> set[str]:
    """Every distribution `pip install -e .` brings in: [project].dependencies and what they
    require in turn (their own extras as asked, e.g. uvicorn[standard]; markers evaluated
    here), read from the installed packages' metadata."""
    from importlib import metadata

    from packaging.requirements import Requirement

    seen: set[str] = set()
    todo = [(Requirement(r), frozenset(Requirement(r).extras)) for r in requirements]
    while todo:
        requirement, extras = todo.pop()
        name = _name(str(requirement))
        if name in seen and not extras:
            continue
        seen.add(name)
        try:
            requires = metadata.requires(requirement.name) or []
        except metadata.PackageNotFoundError:
            continue  # not installed here (a platform marker): nothing further to follow
        for line in requires:
            child = Requirement(line)
            markers = [{"extra": e} for e in extras] or [{"extra": ""}]
            if child.marker is None or any(child.marker.evaluate(m) for m in markers):
                todo.append((child, frozenset(child.extras)))
    return seen


def test_make_run_installs_only_what_the_service_needs() -> None:
    """Issue 27: `make run` on a fresh clone installs [project].dependencies only (the extras go
    to `make test` and `make bench`; bench/first_hour.py measures the time and the size). Its
    target depends on install-service alone, which installs `-e .` without an extra; and no
    package of the dev, bench or Spark extras is in the service's dependencies, nor anything
    they pull in."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    optional = project["optional-dependencies"]
    extras = {_name(r) for group in ("dev", "bench", "spark") for r in optional[group]}
    probe = {"pytest", "hypothesis", "playwright", "pyspark", "schemathesis", "matplotlib",
             "openapi-python-client", "confluent-kafka", "kafka-python"}
    assert probe <= extras  # the extras are read whole, not a list that went stale
    direct = {_name(r) for r in project["dependencies"]}
    assert not direct & extras, sorted(direct & extras)
    closure = _service_closure(project["dependencies"])
    assert direct <= closure and not closure & extras, sorted(closure & extras)

    makefile = (REPO / "Makefile").read_text()
    rules = dict(re.findall(r"^([A-Za-z$()_.-]+):(?!=)[ \t]*([^\n]*)$", makefile, re.MULTILINE))
    assert rules["run"].split() == ["install-service"], rules["run"]
    assert rules["install-service"].split() == ["$(SERVICE_STAMP)"]
    recipe = makefile.split("$(SERVICE_STAMP): pyproject.toml", 1)[1].split("\n\n", 1)[0]
    installs = re.findall(r"pip install ([^&;\n]*)", recipe)
    assert any(i.split()[-2:] == ["-e", "."] for i in installs), installs
    assert not [i for i in installs if "[" in i or "-r " in i], installs


def test_serve_help_names_every_options_environment_variable_and_default() -> None:
    env = {**os.environ, "COLUMNS": "200"}
    done = subprocess.run([str(VENV_BIN / "eventlog"), "serve", "--help"], capture_output=True, text=True, env=env, check=True)
    options: list[tuple[str, str]] = []  # (option, its help text, wrapped lines joined)
    for line in done.stdout.splitlines():
        m = re.match(r"^\s+(--[a-z-]+)\s+<\w+>\s+(.*)$", line)
        if m:
            options.append((m.group(1), m.group(2)))
        elif options and line.startswith(" " * 20) and line.strip():
            options[-1] = (options[-1][0], options[-1][1] + " " + line.strip())
    assert len(options) >= 10, done.stdout
    for option, text in options:
        name = "EVENTLOG_" + option[2:].replace("-", "_").upper()
        assert f"env {name}" in text, (option, text)
        assert re.search(r"; (default )?\S", text), (option, text)


def test_a_new_data_dir_is_not_an_unclean_shutdown(server_factory, tmp_path: Path) -> None:
    def start_line(server) -> str:
        return next(line for line in server.log().splitlines() if "engine ready:" in line)

    server = server_factory(tmp_path / "fresh", EVENTLOG_PROCESSES="1").start()
    assert server.stop() == 0
    assert "new data dir" in start_line(server) and "unclean" not in server.log(), server.log()
    again = server_factory(tmp_path / "fresh", EVENTLOG_PROCESSES="1").start()
    assert "clean shutdown" in start_line(again) and "unclean" not in start_line(again)
    assert again.kill() == -signal.SIGKILL
    third = server_factory(tmp_path / "fresh", EVENTLOG_PROCESSES="1").start()
    assert "unclean shutdown: recovered" in start_line(third)
    assert third.stop() == 0


def test_a_familys_first_start_on_a_new_data_dir_is_not_an_unclean_shutdown(
    server_factory, tmp_path: Path
) -> None:
    """The supervisor makes the dir (meta.properties) before its shards open it: each shard's
    start-up line must still call it new, not "unclean shutdown: recovered"."""
    def start_lines(server) -> list[str]:
        lines = server.log().splitlines()
        return [line for line in lines if " ready: " in line and "shard " in line]

    server = server_factory(tmp_path / "fresh", EVENTLOG_PROCESSES="2").start()
    assert server.stop() == 0
    lines = start_lines(server)
    assert len(lines) == 2 and all("new data dir" in line for line in lines), server.log()
    assert "unclean" not in server.log(), server.log()
    again = server_factory(tmp_path / "fresh", EVENTLOG_PROCESSES="2").start()
    lines = start_lines(again)
    assert len(lines) == 2, again.log()
    assert all("clean shutdown" in line and "unclean" not in line for line in lines), again.log()
    assert again.stop() == 0


def test_405_names_every_method_and_head_works_wherever_get_does(app_server) -> None:
    with app_server.client() as c:
        assert c.post("/v1/topics", json={"name": "t", "partitions": 1}).status_code == 201
        assert c.post("/v1/topics/t/records", json={"records": [{"key": "k", "value": "v"}]}).status_code == 200
        for method, path, allow in (("DELETE", "/v1/topics", "GET, HEAD, POST"), ("PUT", "/v1/topics/t", "DELETE, GET, HEAD"),
                                    ("PUT", "/healthz", "GET, HEAD"), ("DELETE", "/v1/topics/t/keys/k/records", "GET, HEAD, POST"),
                                    ("DELETE", "/v1/topics/t/records", "GET, HEAD, POST")):
            r = c.request(method, path)
            assert r.status_code == 405 and r.json()["code"] == "method_not_allowed", r.text
            assert r.headers["allow"] == allow, (method, path)
        for path in ("/healthz", "/readyz", "/metrics", "/openapi.json", "/v1/topics", "/v1/topics/t",
                     "/v1/topics/t/partitions/0/records", "/v1/topics/t/partitions/0/offsets", "/v1/topics/t/keys/k/records",
                     "/v1/topics/t/records", "/v1/topics/nope"):
            get, head = c.get(path), c.head(path)
            assert head.status_code == get.status_code and head.content == b"", path
            assert head.headers["content-type"] == get.headers["content-type"], path
        # an event stream's head, at once (the stream ends as its head is sent)
        head = c.head("/v1/topics/t/partitions/0/records/stream", timeout=10)
        assert head.status_code == 200 and head.headers["content-type"].startswith("text/event-stream")


def test_produce_takes_json_only_on_the_topic_endpoint_as_on_the_partition_one(app_server) -> None:
    with app_server.client() as c:
        assert c.post("/v1/topics", json={"name": "t", "partitions": 1}).status_code == 201
        body = b'{"records": [{"value": "v"}]}'
        for kind in ("text/plain", "application/x-www-form-urlencoded", "application/x-protobuf"):
            for path in ("/v1/topics/t/records", "/v1/topics/t/partitions/0/records", "/v1/topics/t/keys/k/records"):
                r = c.post(path, content=body, headers={"content-type": kind})
                assert r.status_code == 415 and r.json()["code"] == "unsupported_media_type", (kind, path, r.text)
        r = c.post("/v1/topics/t/records", content=b"\x00" * 70, headers={"content-type": "application/vnd.kafka.record-batch.v2"})
        assert r.status_code == 415 and "/partitions/{partition}/records" in r.json()["detail"]
        assert c.post("/v1/topics/t/records", content=body, headers={"content-type": "application/json; charset=utf-8"}).status_code == 200
        assert c.get("/v1/topics/t/partitions/0/offsets").json()["high_watermark"] == 1  # the refused wrote nothing
        # a body that is not JSON is invalid_json wherever a JSON body is expected
        for method, path in (("POST", "/v1/topics"), ("PATCH", "/v1/topics/t/configs"), ("POST", "/v1/groups/g/offsets")):
            r = c.request(method, path, content=b'{"name": "x",', headers={"content-type": "application/json"})
            assert r.status_code == 400 and r.json()["code"] == "invalid_json", (path, r.text)


def test_cors_is_off_by_default_and_allows_the_configured_origins(app_factory, tmp_path: Path) -> None:
    preflight = {"Origin": "https://console.example", "Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": "content-type, if-match, idempotency-key"}
    server = app_factory(tmp_path / "a").start()
    with server.client() as c:
        r = c.options("/v1/topics", headers=preflight)
        assert r.status_code == 204 and r.headers["allow"] == "GET, HEAD, POST, OPTIONS"
        assert "access-control-allow-origin" not in r.headers  # no origin is allowed: the browser refuses
        assert "access-control-allow-origin" not in c.get("/v1/topics", headers={"Origin": "https://console.example"}).headers
    server.stop()
    server = app_factory(tmp_path / "b", EVENTLOG_CORS_ORIGINS="https://console.example, http://localhost:3000").start()
    with server.client() as c:
        r = c.options("/v1/topics/t/records", headers=preflight)
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "https://console.example"
        assert {"content-type", "if-match", "idempotency-key"} <= {h.strip().lower() for h in r.headers["access-control-allow-headers"].split(",")}
        assert c.post("/v1/topics", json={"name": "t", "partitions": 1}).status_code == 201
        # the hot lane's answers carry the headers too, and the ones a client reads are exposed
        r = c.post("/v1/topics/t/partitions/0/records", json={"records": [{"value": "v"}]}, headers={"Origin": "http://localhost:3000"})
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "http://localhost:3000"
        assert "ETag" in r.headers["access-control-expose-headers"]
        assert c.options("/v1/topics", headers={**preflight, "Origin": "https://evil.example"}).status_code == 400
        assert "access-control-allow-origin" not in c.get("/v1/topics", headers={"Origin": "https://evil.example"}).headers
    server.stop()


def test_metrics_has_process_build_lag_and_disk_and_no_created_series(app_server) -> None:
    with app_server.client() as c:
        assert c.post("/v1/topics", json={"name": "t", "partitions": 2}).status_code == 201
        assert c.post("/v1/topics/t/partitions/1/records", json={"records": [{"value": "v"}] * 5}).status_code == 200
        assert c.post("/v1/groups/g/offsets", json={"offsets": [{"topic": "t", "partition": 1, "offset": 2},
                                                                {"topic": "t", "partition": 0, "offset": 0}]}).status_code == 200
        text = c.get("/metrics").text
    samples = dict(line.rsplit(" ", 1) for line in text.splitlines() if line and not line.startswith("#"))
    assert not [name for name in samples if "_created" in name]
    assert float(samples['eventlog_consumer_group_lag{group="g",partition="1",topic="t"}']) == 3
    assert float(samples['eventlog_consumer_group_lag{group="g",partition="0",topic="t"}']) == 0
    assert float(samples['eventlog_log_dir_free_bytes{log_dir="0"}']) > 0
    assert float(samples['eventlog_log_dir_total_bytes{log_dir="0"}']) >= float(samples['eventlog_log_dir_free_bytes{log_dir="0"}'])
    assert any(name.startswith("eventlog_build_info{") for name in samples)
    for name in ("process_resident_memory_bytes", "process_open_fds", "process_cpu_seconds_total"):
        assert float(samples[name]) > 0, name
    assert any(name.startswith("python_gc_objects_collected_total") for name in samples)


def test_docs_and_redoc_work_offline_and_with_auth(app_factory, tmp_path: Path) -> None:
    """Every script and stylesheet of /docs and /redoc comes from the server (no CDN: without
    internet FastAPI's own pages stay blank); with an auth file the pages open without a token
    and the document needs one, which the pages' token field sends."""
    import json as _json

    auth = tmp_path / "auth.json"
    auth.write_text(_json.dumps({"tokens": [{"name": "ops", "token": "docs-token", "role": "admin"}]}))
    server = app_factory(tmp_path / "d", EVENTLOG_AUTH_FILE=str(auth)).start()
    with server.client() as c:
        for page in ("/docs", "/redoc"):
            r = c.get(page)
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/html"), page
            urls = re.findall(r'(?:src|href)="([^"]+)"', r.text)
            assert urls and all(u.startswith("/static/docs/") for u in urls), (page, urls)
            assert "cdn" not in r.text.lower() and "Authorization" in r.text and "sessionStorage" in r.text
            for url in urls:
                asset = c.get(url)
                assert asset.status_code == 200 and len(asset.content) > 1000, url
        assert c.get("/static/docs/index.html").status_code == 404  # only the files the pages use
        assert c.get("/openapi.json").status_code == 401
        assert c.get("/openapi.json", headers={"Authorization": "Bearer docs-token"}).json()["info"]["title"] == "eventlog"
    server.stop()


def test_the_default_shard_count_follows_a_container_cpu_quota(tmp_path: Path) -> None:
    """In a container limited to 2 CPUs on a big host, the default is 2 shard processes, not one
    per host core (cgroup v2 cpu.max, or v1's CFS quota); no quota: the CPUs it may run on."""
    import os

    from app.settings import usable_cpus

    may_run_on = len(os.sched_getaffinity(0))
    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / "cpu.max").write_text("150000 100000\n")  # 1.5 CPUs: 2 processes
    assert usable_cpus(v2) == min(may_run_on, 2)
    (v2 / "cpu.max").write_text("max 100000\n")
    assert usable_cpus(v2) == may_run_on
    v1 = tmp_path / "v1"
    (v1 / "cpu").mkdir(parents=True)
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("100000\n")
    (v1 / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert usable_cpus(v1) == 1
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    assert usable_cpus(v1) == may_run_on
    assert usable_cpus(tmp_path / "none") == may_run_on


def test_the_documents_pages_load_nothing_from_elsewhere(app_server) -> None:
    """/docs and /redoc, and every file they load, name no image, script, style or font of
    another origin (ReDoc's bundle shows Redocly's logo from their CDN: the server serves it
    pointed at a data: URL). A link the reader may follow ("API docs by Redocly") is no load."""
    loads = re.compile(
        r"""(?:\bsrc\s*[:=]|\bsrcset\s*[:=]|url\(|@import)\s*["'`]?\s*(https?:)?//"""
    )
    with app_server.client() as c:
        for page in ("/docs", "/redoc"):
            html = c.get(page).text
            assert not re.findall(r"https?://", html), page
            for url in re.findall(r'(?:src|href)="([^"]+)"', html):
                body = c.get(url).content.decode("utf-8", "replace")
                found = [body[max(m.start() - 40, 0):m.end() + 40] for m in loads.finditer(body)]
                assert not found, (url, found)
        assert "cdn.redoc.ly" not in c.get("/static/docs/redoc.standalone.js").text
