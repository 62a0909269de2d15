"""docs/ARCHITECTURE.md stays true to the code: its picture is what its source makes, every
module, path and function it names exists, and every module of the packages is on its map."""

from __future__ import annotations

import ast
import functools
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "ARCHITECTURE.md"
DIAGRAM_SOURCE = REPO / "docs" / "architecture_diagram.py"
DIAGRAM = REPO / "docs" / "architecture.svg"
PACKAGES = ("engine", "workers", "api", "broker", "app", "analytics")  # pyproject's packages
TOP_DIRS = (*PACKAGES, "bench", "tests", "docs")

# `engine/partition_log.py:PartitionLog.append_soon`: a file and a name defined in it
CITATION = re.compile(r"^([\w/]+\.py):([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)?)$")
# `PartitionLog.append_soon`: a class of the packages and one of its members
MEMBER = re.compile(r"^([A-Z]\w*)\.([A-Za-z_]\w*)$")


@functools.cache
def _spans() -> list[str]:
    """Every `code span` of the page (fenced blocks left out)."""
    text = re.sub(r"```.*?```", "", DOC.read_text(), flags=re.S)
    return re.findall(r"`([^`\n]+)`", text)


def _paths() -> list[str]:
    """The spans that name a path of the repository (`engine/format.py`, `tests/fuzz/`, a glob)."""
    found = []
    for span in _spans():
        path = span.split(":", 1)[0]
        if re.fullmatch(r"[\w./*-]+", path) and path.split("/", 1)[0] in TOP_DIRS and "/" in path:
            found.append(path)
    return found


@functools.cache
def _defined(path: Path) -> dict[str, set[str]]:
    """Top-level names of a module, each with its members if it is a class ({} otherwise)."""
    names: dict[str, set[str]] = {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names[node.name] = set()
        elif isinstance(node, ast.ClassDef):
            members = set()
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    members.add(item.name)
                elif isinstance(item, ast.Assign):
                    members |= {t.id for t in item.targets if isinstance(t, ast.Name)}
                elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    members.add(item.target.id)
            names[node.name] = members
        elif isinstance(node, ast.Assign):
            names.update({t.id: set() for t in node.targets if isinstance(t, ast.Name)})
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names[node.target.id] = set()
    return names


def _modules() -> list[str]:
    return sorted(
        p.relative_to(REPO).as_posix()
        for package in PACKAGES for p in (REPO / package).rglob("*.py") if "__pycache__" not in p.parts
    )


def test_the_picture_is_what_its_source_makes(tmp_path: Path) -> None:
    """docs/architecture.svg is generated: change docs/architecture_diagram.py, then run it
    (`make diagram`)."""
    out = tmp_path / "architecture.svg"
    subprocess.run([sys.executable, str(DIAGRAM_SOURCE), str(out)], check=True, timeout=60)
    assert out.read_bytes() == DIAGRAM.read_bytes(), (
        "docs/architecture.svg differs from what docs/architecture_diagram.py makes: run `make diagram`"
    )
    assert "](architecture.svg)" in DOC.read_text()


def test_every_module_of_the_packages_is_on_the_map() -> None:
    named = set(_spans())
    missing = [m for m in _modules() if m not in named]
    assert not missing, f"docs/ARCHITECTURE.md, 'The module map', lacks a line for: {missing}"


def test_every_path_the_map_names_exists() -> None:
    paths = _paths()
    assert len(paths) > 100, "the module map names the modules by their paths"
    gone = [p for p in paths if not (list(REPO.glob(p.rstrip("/"))) if "*" in p else (REPO / p).exists())]
    assert not gone, f"docs/ARCHITECTURE.md names what does not exist: {gone}"


def test_every_cited_function_exists() -> None:
    """`file.py:Name`, `file.py:Class.member`, and `Class.member` for a class of the packages."""
    citations = [m.groups() for m in map(CITATION.match, _spans()) if m]
    assert len(citations) > 20, "the paths cite their functions"
    wrong = []
    for path, name in citations:
        top, _, member = name.partition(".")
        defined = _defined(REPO / path) if (REPO / path).is_file() else {}
        if top not in defined or (member and member not in defined[top]):
            wrong.append(f"{path}:{name}")
    classes: dict[str, set[str]] = {}
    for module in _modules():
        for top, members in _defined(REPO / module).items():
            if top[:1].isupper() and members:
                classes.setdefault(top, set()).update(members)
    for m in filter(None, map(MEMBER.match, _spans())):
        cls, member = m.groups()
        if cls in classes and member not in classes[cls]:
            wrong.append(f"{cls}.{member}")
    assert not wrong, f"docs/ARCHITECTURE.md cites what the code does not define: {wrong}"


@pytest.mark.parametrize("page", ["docs/ARCHITECTURE.md", "README.md"])
def test_relative_links_resolve(page: str) -> None:
    source = REPO / page
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", source.read_text())
    local = [link for link in links if "://" not in link and not link.startswith("mailto:")]
    broken = [link for link in local if not (source.parent / link).exists()]
    assert not broken, f"{page}: broken links {broken}"


def test_the_readme_points_to_the_map() -> None:
    assert "docs/ARCHITECTURE.md" in (REPO / "README.md").read_text()
