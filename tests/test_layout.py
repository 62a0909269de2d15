"""The import arrows of the design: engine imports nothing of ours above it."""

from __future__ import annotations

import ast
import fnmatch
import functools
import json
import re
import shlex
import shutil
import subprocess
import urllib.parse
from pathlib import Path, PurePosixPath
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent

ALLOWED = {
    "engine": {"engine"},
    "workers": {"engine", "workers"},
    "api": {"engine", "workers", "api"},
    "broker": {"engine", "workers", "api", "broker"},
    "analytics": {"engine", "analytics"},
    "app": {"engine", "workers", "api", "broker", "app", "analytics"},
}
FORBIDDEN_THIRD_PARTY = {
    "engine": {"fastapi", "starlette", "pydantic", "pydantic_settings", "uvicorn", "typer", "rich"},
    # the Kafka listener speaks Kafka, not HTTP: it reuses api/'s policy, never its web stack
    "broker": {"fastapi", "starlette", "pydantic", "pydantic_settings", "uvicorn"},
}
OURS = set(ALLOWED)


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_package_imports_follow_the_design(package: str) -> None:
    for path in sorted((REPO / package).rglob("*.py")):
        imported = _imports(path)
        ours = imported & OURS
        assert ours <= ALLOWED[package], f"{path.relative_to(REPO)} imports {sorted(ours - ALLOWED[package])}"
        bad = imported & FORBIDDEN_THIRD_PARTY.get(package, set())
        assert not bad, f"{path.relative_to(REPO)} imports {sorted(bad)}"


# engine/format.py is the one home of the batch header's and the index entries' layouts; a
# literal that spells one of them elsewhere is a second definition that can drift (issue 24)
WIRE_LAYOUTS = {
    ">qiibIhiqqqhii": "format.BATCH_HEADER",
    ">qiib": "the header before the CRC (format.pack_header)",
    ">hiqqqhii": "the header from the CRC's range on (format.pack_header)",
    ">qi": "format.BATCH_PREFIX / format.TIME_INDEX_ENTRY",
    ">ii": "format.OFFSET_INDEX_ENTRY",
    ">i4": "format.OFFSET_INDEX_DTYPE / format.TIME_INDEX_DTYPE",
    ">i8": "format.TIME_INDEX_DTYPE",
}
# (file, layout) that spell the same characters for another wire struct, and what it is
OTHER_WIRE_STRUCTS = {
    ("engine/compression.py", ">ii"): "snappy-java's xerial framing: version, compatible version",
}


def _string_literals(path: Path) -> list[tuple[int, str]]:
    return [
        (node.lineno, node.value) for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    ]


def test_wire_layouts_have_one_home() -> None:
    from engine import format as fmt

    # what the layouts above name is what engine/format.py exports
    assert fmt.BATCH_HEADER.format == ">qiibIhiqqqhii" and fmt.BATCH_PREFIX.format == ">qi"
    assert fmt.OFFSET_INDEX_ENTRY.format == ">ii" and fmt.TIME_INDEX_ENTRY.format == ">qi"
    assert fmt.OFFSET_INDEX_DTYPE.descr == [("relative_offset", ">i4"), ("position", ">i4")]
    assert fmt.TIME_INDEX_DTYPE.descr == [("timestamp", ">i8"), ("relative_offset", ">i4")]
    found = []
    for package in sorted(ALLOWED):
        for path in sorted((REPO / package).rglob("*.py")):
            where = path.relative_to(REPO).as_posix()
            if where == "engine/format.py":
                continue
            for line, value in _string_literals(path):
                if value in WIRE_LAYOUTS and (where, value) not in OTHER_WIRE_STRUCTS:
                    found.append(f"{where}:{line}: {value!r} is {WIRE_LAYOUTS[value]}: import it from engine.format")
    assert not found, "\n".join(found)


def test_container_images_pin_their_debian_release() -> None:
    """python:3.11-slim follows Debian's newest release (13 ships no Java 17): each image names
    the release its packages come from."""
    for name in ("Dockerfile", "Dockerfile.spark"):
        froms = [line.split()[1] for line in (REPO / name).read_text().splitlines() if line.startswith("FROM ")]
        assert froms and all(f.startswith("python:") and f.endswith(("-bookworm", "-trixie")) for f in froms), (name, froms)
    assert "openjdk-17-jre-headless" not in (REPO / "Dockerfile.spark").read_text() or "bookworm" in (REPO / "Dockerfile.spark").read_text()


# -- the containers: what can be checked without a Docker engine --------------------------------
# (the images are not built here; this holds docker-compose.yml, the Dockerfiles and the README's
# container commands to the CLI, the settings and the app they name)

COMPOSE_FILE = REPO / "docker-compose.yml"
# environment variables of a container that are not settings of ours
OTHER_ENV = {"TZ", "JAVA_HOME", "PYTHONUNBUFFERED"}


@functools.cache
def _compose() -> dict[str, Any] | str:
    """The compose file as data (pyyaml, else `docker compose config`); a str: why neither works."""
    try:
        import yaml
    except ImportError:
        pass
    else:
        return yaml.safe_load(COMPOSE_FILE.read_text())
    if shutil.which("docker") is not None:
        done = subprocess.run(
            ["docker", "compose", "-f", str(COMPOSE_FILE), "--profile", "*", "config", "--format", "json"],
            capture_output=True, text=True, timeout=30,
        )
        if done.returncode == 0:
            return json.loads(done.stdout)
        return f"no pyyaml, and `docker compose config` failed: {done.stderr.strip()[:200]}"
    return "neither pyyaml nor a docker client with compose to read docker-compose.yml"


@pytest.fixture
def compose() -> dict[str, Any]:
    data = _compose()
    if isinstance(data, str):
        pytest.skip(data)
    return data


def _build(service: dict[str, Any]) -> tuple[Path, Path]:
    build = service["build"]
    build = {"context": build} if isinstance(build, str) else build
    context = (REPO / build.get("context", ".")).resolve()
    return context, context / build.get("dockerfile", "Dockerfile")


def _dockerfile(path: Path) -> dict[str, Any]:
    """FROM images, COPY sources, ENV settings, CMD argv and the `# Build: docker build ...`
    comment's argv, of a Dockerfile written one instruction a line (no continuations but RUN's)."""
    out: dict[str, Any] = {"from": [], "copy": [], "env": {}, "cmd": None, "build": None}
    for line in path.read_text().splitlines():
        word, _, rest = line.partition(" ")
        if word == "FROM":
            out["from"].append(rest.split()[0])
        elif word == "COPY":
            out["copy"].extend(shlex.split(rest)[:-1])
        elif word == "ENV":
            out["env"].update(item.split("=", 1) for item in shlex.split(rest))
        elif word == "CMD":
            out["cmd"] = json.loads(rest)
        elif line.startswith("#") and "Build: docker build " in line:
            out["build"] = shlex.split(line.split("Build: ", 1)[1])
    return out


def _environment(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {k: str(v) for k, v in env.items()}


def _container_env(service: dict[str, Any]) -> dict[str, str]:
    """What the container's process sees: the image's ENV, then the compose file's."""
    return {**_dockerfile(_build(service)[1])["env"], **_environment(service)}


def _mounts(service: dict[str, Any]) -> list[tuple[str, str, bool]]:
    """(source, target, read_only) of each volume."""
    out = []
    for v in service.get("volumes") or []:
        if isinstance(v, str):
            parts = v.split(":")
            out.append((parts[0], parts[1], len(parts) > 2 and "ro" in parts[2].split(",")))
        else:
            out.append((v["source"], v["target"], bool(v.get("read_only"))))
    return out


def _command(service: dict[str, Any]) -> list[str]:
    cmd = service.get("command") or _dockerfile(_build(service)[1])["cmd"]
    return shlex.split(cmd) if isinstance(cmd, str) else list(cmd)


def _settings_of(env: dict[str, str]) -> Any:
    from app.settings import Settings

    fields = {k.removeprefix("EVENTLOG_").lower(): v for k, v in env.items() if k.startswith("EVENTLOG_")}
    return Settings(**fields)


def _seconds(duration: str) -> float:
    """A compose duration: 80s, 1m30s, 1m, 500ms."""
    units = {"h": 3600, "m": 60, "s": 1, "ms": 0.001, "us": 1e-6}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|us|h|m|s)", duration)
    assert parts and "".join(n + u for n, u in parts) == duration, duration
    return sum(float(n) * units[u] for n, u in parts)


@functools.cache
def _app() -> Any:
    """The app (no lifespan: nothing is opened)."""
    from app.main import create_app
    from app.settings import Settings

    return create_app(Settings(data_dir=REPO / "no-such-dir"))


def _has_route(method: str, path: str) -> bool:
    """Whether the app's router takes `method` on `path` (as it matches a request)."""
    from starlette.routing import Match

    scope = {"type": "http", "method": method, "path": path, "root_path": "", "query_string": b"", "headers": []}
    return any(route.matches(scope)[0] == Match.FULL for route in _app().router.routes)


def test_compose_services_build_from_files_that_exist(compose: dict[str, Any]) -> None:
    """Each service's build context and Dockerfile exist, and the image it names is the one
    the Dockerfile's `# Build:` comment tags."""
    assert set(compose["services"]) == {"eventlog", "nightly"}
    for name, service in compose["services"].items():
        context, dockerfile = _build(service)
        assert context.is_dir() and dockerfile.is_file(), (name, context, dockerfile)
        build = _dockerfile(dockerfile)["build"]
        assert build is not None and build[:2] == ["docker", "build"] and build[-1] == ".", (name, build)
        tag = build[build.index("-t") + 1]
        assert service["image"] in (tag, f"{tag}:latest"), (name, service["image"], tag)
        named = build[build.index("-f") + 1] if "-f" in build else "Dockerfile"
        assert (context / named).resolve() == dockerfile.resolve(), (name, named)


def test_dockerignore_keeps_what_the_images_copy() -> None:
    """The build context leaves out .venv, .git and data (gigabytes sent to the engine on every
    build otherwise) and nothing a Dockerfile copies."""
    patterns = [
        p.strip().rstrip("/") for p in (REPO / ".dockerignore").read_text().splitlines()
        if p.strip() and not p.startswith("#")
    ]
    assert not any(p.startswith("!") for p in patterns)  # not understood here

    def ignored(path: str) -> bool:
        parts = path.split("/")
        prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        return any(
            fnmatch.fnmatch(prefix, p) or (p.startswith("**/") and fnmatch.fnmatch(parts[i], p[3:]))
            for p in patterns for i, prefix in enumerate(prefixes)
        )

    for name in (".venv", ".git", "data", "warehouse", "app/__pycache__", "engine/__pycache__/format.cpython-311.pyc"):
        assert ignored(name), name
    for dockerfile in ("Dockerfile", "Dockerfile.spark"):
        for source in _dockerfile(REPO / dockerfile)["copy"]:
            assert (REPO / source).exists() and not ignored(source), (dockerfile, source)
        for package in ("app", "engine", "api", "workers", "analytics"):  # pyproject's packages
            assert package in _dockerfile(REPO / dockerfile)["copy"], (dockerfile, package)


def test_container_commands_are_real_cli_commands(compose: dict[str, Any]) -> None:
    """Each service's command, and each image's CMD, is an `eventlog` command with options it
    has, given as it needs them (the required ones present, a value after each that takes one)."""
    import typer

    from app.cli import cli

    group = typer.main.get_command(cli)
    commands = [_command(s) for s in compose["services"].values()]
    commands += [_dockerfile(REPO / name)["cmd"] for name in ("Dockerfile", "Dockerfile.spark")]
    for argv in commands:
        assert argv[0] == "eventlog" and argv[1] in group.commands, argv
        command = group.commands[argv[1]]
        known = {opt for p in command.params for opt in p.opts + p.secondary_opts}
        assert {a for a in argv[2:] if a.startswith("-")} <= known, (argv, sorted(known))
        # parsed as the container would, the paths' existence aside (they are the container's)
        with command.make_context(argv[1], argv[2:], resilient_parsing=True) as ctx:
            missing = [p.name for p in command.params if p.required and ctx.params.get(p.name) is None
                       and not any(o in argv for o in p.opts)]
            assert not missing, (argv, missing)


def test_container_environment_is_settings(compose: dict[str, Any]) -> None:
    """Each EVENTLOG_ variable of an image or a service is a setting, with a valid value."""
    from app.settings import Settings

    for name, service in compose["services"].items():
        env = _container_env(service)
        for key in env:
            assert key in OTHER_ENV or (
                key.startswith("EVENTLOG_") and key.removeprefix("EVENTLOG_").lower() in Settings.model_fields
            ), (name, key)
        _settings_of(env)  # raises for a value the server would refuse


def test_the_service_healthcheck_and_port_are_the_apps(compose: dict[str, Any]) -> None:
    """The healthcheck asks a GET route the app has, on the port the server listens on, which
    is the one the compose file publishes; it needs no token, also once an operator sets
    EVENTLOG_AUTH_FILE (the file's comment says how): /healthz, the one route open then."""
    service = compose["services"]["eventlog"]
    settings = _settings_of(_container_env(service))
    test = service["healthcheck"]["test"]
    assert test[0] == "CMD" and test[1:3] == ["python", "-c"], test
    compile(test[3], "healthcheck", "exec")
    url = re.search(r"'(http://[^']+)'", test[3])
    assert url is not None, test
    parsed = urllib.parse.urlsplit(url.group(1))
    assert parsed.hostname == "127.0.0.1" and settings.host == "0.0.0.0" and parsed.port == settings.port
    assert _has_route("GET", parsed.path), parsed.path
    assert parsed.path == "/healthz", "with an auth file, only /healthz answers without a token"
    published = [p if isinstance(p, str) else f"{p['published']}:{p['target']}" for p in service["ports"]]
    assert [p.rsplit(":", 1)[-1] for p in published] == [str(settings.port)], published


def test_the_service_stops_before_docker_kills_it(compose: dict[str, Any]) -> None:
    """SIGTERM, and a stop_grace_period longer than the server's own bound on a shutdown (its
    watchdog; a shard family's supervisor waits KILL_SLACK_S more): a clean close is not cut
    short by Docker's SIGKILL."""
    from app.server import shutdown_watchdog_s
    from app.supervisor import KILL_SLACK_S

    service = compose["services"]["eventlog"]
    settings = _settings_of(_container_env(service))
    assert service.get("stop_signal", "SIGTERM") == "SIGTERM"
    grace = service["stop_grace_period"]
    grace_s = float(grace) / 1e9 if isinstance(grace, int) else _seconds(grace)  # `config` gives ns
    assert grace_s >= shutdown_watchdog_s(settings) + KILL_SLACK_S, grace_s


def test_the_nightly_job_reads_the_snapshots_the_service_writes(compose: dict[str, Any]) -> None:
    """The nightly service's --snapshot is the service's snapshot dir, through the same named
    volume; its --out is a writable mount; the snapshots are mounted read-only."""
    service, nightly = compose["services"]["eventlog"], compose["services"]["nightly"]
    settings = _settings_of(_container_env(service))
    argv = _command(nightly)
    snapshot = PurePosixPath(argv[argv.index("--snapshot") + 1])
    out = PurePosixPath(argv[argv.index("--out") + 1])

    def mount_of(mounts: list[tuple[str, str, bool]], path: PurePosixPath) -> tuple[str, str, bool]:
        found = [m for m in mounts if path.is_relative_to(m[1])]
        assert found, (path, mounts)
        return max(found, key=lambda m: len(m[1]))

    source, target, read_only = mount_of(_mounts(nightly), snapshot)
    assert read_only and source in compose["volumes"], (source, target)
    served = [m for m in _mounts(service) if m[0] == source]
    assert served and not served[0][2], "the service writes its snapshots into the volume"
    root = PurePosixPath(str(settings.snapshot_root))
    assert root.is_relative_to(served[0][1]), (root, served)
    assert root.relative_to(served[0][1]) == snapshot.relative_to(target), (root, snapshot)
    out_source, _, out_read_only = mount_of(_mounts(nightly), out)
    # a directory of the host (`config` writes it absolute)
    assert not out_read_only and (out_source.startswith("./") or Path(out_source).is_relative_to(REPO)), out_source


_COMPOSE_GLOBAL_WITH_VALUE = {"-f", "--file", "-p", "--project-name", "--profile", "--env-file", "--project-directory"}
_COMPOSE_FLAGS_WITH_VALUE = {"-e", "--env", "-v", "--volume", "-p", "--publish", "--name", "--entrypoint", "-u", "--user",
                             "-w", "--workdir", "-l", "--label", "--scale", "-t", "--timeout", "--pull"}


def _documented_compose_commands() -> list[tuple[str, list[str]]]:
    """(where, argv after `docker compose`) of every `docker compose ...` in the README, the
    docs, the Dockerfiles and the compose file's comments."""
    found = []
    for path in [REPO / "README.md", COMPOSE_FILE, *sorted((REPO / "docs").glob("*.md"))]:
        for line in path.read_text().splitlines():
            for m in re.finditer(r"docker compose ((?:[\w./=:-]+ ?)+)", line):
                found.append((f"{path.name}: {line.strip()}", m.group(1).split()))
    return found


def test_documented_compose_commands_name_services_that_run(compose: dict[str, Any]) -> None:
    """`docker compose run --rm nightly`, `docker compose up -d eventlog`: each names services
    of the compose file; `run` targets one explicitly, which enables its profile; a bare `up`
    starts what has no profile, which must include the service and no one-off job."""
    services = compose["services"]
    documented = _documented_compose_commands()
    assert {" ".join(argv[:3]) for _, argv in documented} >= {"up -d eventlog", "run --rm nightly"}
    for where, argv in documented:
        profiles: set[str] = set()
        while argv and argv[0].startswith("-"):
            flag = argv.pop(0)
            if flag in _COMPOSE_GLOBAL_WITH_VALUE:
                value = argv.pop(0)
                if flag == "--profile":
                    profiles.add(value)
        sub, args = argv[0], argv[1:]
        named = []
        while args:
            arg = args.pop(0)
            if arg.startswith("-"):
                if arg in _COMPOSE_FLAGS_WITH_VALUE:
                    args.pop(0)
                continue
            named.append(arg)
            if sub in ("run", "exec"):
                break  # the rest is the container's command
        if sub in ("run", "exec"):
            assert named and named[0] in services, where
        else:
            assert set(named) <= set(services), where
        if sub == "up" and not named:
            started = {n for n, s in services.items() if not s.get("profiles") or set(s["profiles"]) & profiles}
            assert "eventlog" in started and "nightly" not in started, where
    # a bare `up` starts no one-off job, and nothing it starts needs a service it does not start
    for name, service in services.items():
        if _command(service)[1] in ("nightly", "snapshot", "import-kafka", "dump-log"):
            assert service.get("profiles"), f"{name} is a one-off job: give it a profile"
        if not service.get("profiles"):
            for needed in service.get("depends_on") or ():
                assert not services[needed].get("profiles"), (name, needed)


def test_curl_commands_in_the_compose_file_name_routes_of_the_app() -> None:
    assert not _has_route("POST", "/v1/no-such-thing")
    for line in COMPOSE_FILE.read_text().splitlines():
        m = re.search(r"curl (?:-\w+ )*-X ?(\w+) +\S*?localhost:\d+(/\S*)", line)
        if m:
            assert _has_route(m.group(1), m.group(2)), line


# -- the repository stands alone -------------------------------------------------------------
# The team's notes sit beside the checkout, in a folder a clone does not have: nothing tracked
# may send a reader there. What a reader needs is in docs/ (ARCHITECTURE.md, FORMAT.md, API.md,
# ANALYTICS.md, ...). The names are spelled in pieces so that this file does not match itself.
_OUTSIDE = ("../" + "shared").encode()
_TEAM_NOTES = re.compile(rb"(?<![\w/.-])(" + b"|".join([b"DESIGN", b"KAFKA-FORMAT", b"SPARK", b"STYLE"]) + rb")\.md\b")


def test_no_tracked_file_points_outside_the_repository() -> None:
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True, timeout=60).stdout
    names = [n.decode() for n in listed.split(b"\0") if n]
    basenames = {PurePosixPath(n).name.encode() for n in names}
    found = []
    for name in names:
        path = REPO / name
        if not path.is_file():  # deleted in the working tree
            continue
        data = path.read_bytes()
        if b"\0" in data[:8192]:  # binary
            continue
        for number, line in enumerate(data.splitlines(), 1):
            notes = [m.group(0) for m in _TEAM_NOTES.finditer(line) if m.group(0) not in basenames]
            if _OUTSIDE in line or notes:
                found.append(f"{name}:{number}: {line.decode(errors='replace').strip()[:120]}")
    assert not found, "point to the repository's own docs instead:\n" + "\n".join(found)


def test_the_license_is_an_spdx_expression() -> None:
    """setuptools 77+ warns, twice a build, that `project.license` as a table is deprecated
    (PEP 639): the license is the SPDX string, and the build asks for a setuptools that reads it
    (an older one would refuse the string)."""
    import tomllib

    data = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert data["project"]["license"] == "Apache-2.0"
    floors = [
        int(m.group(1)) for r in data["build-system"]["requires"]
        if (m := re.fullmatch(r"setuptools>=(\d+)(?:\.\d+)*", r.replace(" ", "")))
    ]
    assert floors and floors[0] >= 77, data["build-system"]["requires"]
    assert not any("License ::" in c for c in data["project"].get("classifiers", []))
