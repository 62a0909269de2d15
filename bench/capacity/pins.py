"""Print `name==version` for every package the server needs at run time, as this venv has it:
the dependencies in pyproject.toml's [project] (their extras too, e.g. uvicorn[standard]) and
everything they require in turn, plus the load script's Python Redis client (redis, hiredis)
and Kafka client (confluent-kafka).
Versions are the installed ones, so the capacity run uses what the tests here ran against.

usage: .venv/bin/python bench/capacity/pins.py   (prepare.sh feeds this to pip download)
"""

from __future__ import annotations

import sys
import tomllib
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[2]
# the load script's Redis clients, and librdkafka's Python client for its Kafka cells (the wheel
# carries librdkafka itself)
EXTRA = ("redis[hiredis]", "confluent-kafka")


def closure(roots: list[str], environment: dict[str, str]) -> dict[str, str]:
    """canonical name -> installed version of `roots` and what they require, with markers
    evaluated for `environment` (extras followed where a requirement names them)."""
    pinned: dict[str, str] = {}
    todo = [Requirement(r) for r in roots]
    seen: set[tuple[str, tuple[str, ...]]] = set()
    while todo:
        req = todo.pop()
        name = canonicalize_name(req.name)
        extras = tuple(sorted(req.extras))
        if (name, extras) in seen:
            continue
        seen.add((name, extras))
        try:
            dist = distribution(name)
        except PackageNotFoundError:
            sys.exit(f"{name} is required but not installed in {sys.prefix}: run make install")
        pinned[name] = dist.version
        for text in dist.requires or ():
            sub = Requirement(text)
            wanted = [{**environment, "extra": e} for e in ("", *extras)]
            if sub.marker is None or any(sub.marker.evaluate(env) for env in wanted):
                todo.append(sub)
    return pinned


def main() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    environment = default_environment()
    # the device's Python: prepare.sh passes the version it downloads for
    if len(sys.argv) > 1:
        version = sys.argv[1]
        environment.update(python_version=version, python_full_version=f"{version}.0")
    for name, version in sorted(closure([*project["dependencies"], *EXTRA], environment).items()):
        print(f"{name}=={version}")


if __name__ == "__main__":
    main()
