"""The import arrows of the design: engine imports nothing of ours above it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

ALLOWED = {
    "engine": {"engine"},
    "workers": {"engine", "workers"},
    "api": {"engine", "workers", "api"},
    "analytics": {"engine", "analytics"},
    "app": {"engine", "workers", "api", "app", "analytics"},
}
FORBIDDEN_THIRD_PARTY = {
    "engine": {"fastapi", "starlette", "pydantic", "pydantic_settings", "uvicorn", "typer", "rich"},
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


def test_container_images_pin_their_debian_release() -> None:
    """python:3.11-slim follows Debian's newest release (13 ships no Java 17): each image names
    the release its packages come from."""
    for name in ("Dockerfile", "Dockerfile.spark"):
        froms = [line.split()[1] for line in (REPO / name).read_text().splitlines() if line.startswith("FROM ")]
        assert froms and all(f.startswith("python:") and f.endswith(("-bookworm", "-trixie")) for f in froms), (name, froms)
    assert "openjdk-17-jre-headless" not in (REPO / "Dockerfile.spark").read_text() or "bookworm" in (REPO / "Dockerfile.spark").read_text()
