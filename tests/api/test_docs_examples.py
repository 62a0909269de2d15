"""Every curl example in docs/API.md runs against a real server and prints what the doc shows.

A ```console block holds `$ command` lines, each followed by its expected output, where `...`
stands for anything (dots included). ```console auth blocks run against a server with an auth
file in which $TOKEN is a consumer of topics starting with "billing.".
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import httpx
import pytest

from ..conftest import REPO

DOC = REPO / "docs" / "API.md"
ADMIN_TOKEN = "docs-admin-token"
CONSUMER_TOKEN = "docs-consumer-token"


def examples(kind: str) -> list[tuple[str, str]]:
    """(command, expected output) pairs of the doc's ```console{kind} blocks, in order."""
    out = []
    for block in re.finditer(r"```console" + re.escape(kind) + r"\n(.*?)```", DOC.read_text(), re.S):
        command, expected = None, []
        for line in block.group(1).splitlines():
            if line.startswith("$ "):
                if command is not None:
                    out.append((command, "\n".join(expected)))
                command, expected = line[2:], []
            else:
                expected.append(line)
        if command is not None:
            out.append((command, "\n".join(expected)))
    return out


def matches(expected: str, actual: str) -> bool:
    pattern = ".*?".join(re.escape(part) for part in expected.strip().split("..."))
    return re.fullmatch(pattern, actual.strip(), re.S) is not None


def run_examples(pairs: list[tuple[str, str]], url: str) -> None:
    env = {**os.environ, "TOKEN": CONSUMER_TOKEN}
    for command, expected in pairs:
        command = command.replace("localhost:8080", url.removeprefix("http://"))
        result = subprocess.run(["bash", "-c", command], capture_output=True, text=True, env=env, timeout=60)
        allowed = (0, 28) if "--max-time" in command else (0,)  # 28: curl's timeout, ending a stream
        assert result.returncode in allowed, f"{command}\n{result.stderr}"
        assert matches(expected, result.stdout), f"\n$ {command}\nexpected:\n{expected}\ngot:\n{result.stdout}"


def test_the_doc_has_an_example_for_every_operation(app_server) -> None:
    with app_server.client() as c:
        spec = c.get("/openapi.json").json()
    text = " ".join(command for command, _ in examples("") + examples(" auth"))
    for path, operations in spec["paths"].items():
        pattern = re.sub(r"\\\{[^}]+\\\}", r"[^/?' ]+", re.escape(path)) + r"(?:[?' ]|$)"
        for method in operations:
            if method in ("get",):
                found = re.search(r"(?<!-X)(?:curl [^$]*?)localhost:8080" + pattern, text)
            else:
                found = re.search(rf"-X{method.upper()} [^$]*?localhost:8080" + pattern, text)
            assert found, f"docs/API.md has no curl example for {method.upper()} {path}"


def test_doc_examples_run_as_shown(server) -> None:
    run_examples(examples(""), server.url)


def test_auth_doc_examples_run_as_shown(server_factory, tmp_path: Path) -> None:
    auth = tmp_path / "auth.json"
    auth.write_text(json.dumps({"tokens": [
        {"name": "ops", "token": ADMIN_TOKEN, "role": "admin"},
        {"name": "reader", "token": CONSUMER_TOKEN, "role": "consumer", "topics": ["billing."]},
    ]}))
    server = server_factory(EVENTLOG_AUTH_FILE=str(auth)).start(token=ADMIN_TOKEN)
    with httpx.Client(base_url=server.url, headers={"authorization": f"Bearer {ADMIN_TOKEN}"}) as admin:
        assert admin.post("/v1/topics", json={"name": "billing.invoices"}).status_code == 201
        assert admin.post("/v1/topics", json={"name": "orders"}).status_code == 201
    run_examples(examples(" auth"), server.url)
    server.stop()


@pytest.mark.parametrize(("expected", "actual", "ok"), [
    ('{"a":...,"b":2}', '{"a":[1,2],"b":2}', True),
    ('{"a":1}', '{"a":12}', False),
    ("...x...", "a\nx\nb", True),
])
def test_matching_rules(expected: str, actual: str, ok: bool) -> None:
    assert matches(expected, actual) is ok
