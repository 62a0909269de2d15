"""The OpenAPI document's examples are real (issue 27): each error response shows its own codes'
problem+json bodies at its own status, never one body generated from the schema (status 0,
every optional member empty); request examples are docs/API.md's and the API accepts them."""

from __future__ import annotations

import json
import re
from http import HTTPStatus
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from api.errors import PROBLEM_JSON
from api.schemas import (
    GroupOffsetsCommit,
    GroupOffsetsReset,
    KeyProduceRequest,
    ProduceRequest,
    TopicCreate,
)
from app.main import create_app
from app.settings import Settings

from ..conftest import REPO

MODELS = {
    "createTopic": TopicCreate,
    "produceRecords": ProduceRequest,
    "produceToPartition": ProduceRequest,
    "appendKeyRecords": KeyProduceRequest,
    "commitGroupOffsets": GroupOffsetsCommit,
    "resetGroupOffsets": GroupOffsetsReset,
}


@pytest.fixture(scope="module")
def document(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    data_dir = Path(tmp_path_factory.mktemp("openapi")) / "data"
    return create_app(Settings(data_dir=data_dir)).openapi()


def _operations(document: dict[str, Any]) -> list[dict[str, Any]]:
    return [op for item in document["paths"].values() for op in item.values()]


def _placeholders(value: Any) -> list[Any]:
    """Values a generator puts where it knows nothing: "string", 0 as a status, empty names."""
    if isinstance(value, dict):
        return [
            v
            for k, item in value.items()
            for v in _placeholders(item) + ([k] if k in ("string", "") else [])
        ]
    if isinstance(value, list):
        return [v for item in value for v in _placeholders(item)]
    return [value] if value in ("string", "") else []


def test_every_error_response_shows_its_own_codes_at_its_own_status(
    document: dict[str, Any],
) -> None:
    seen_codes = set()
    for op in _operations(document):
        for status, response in op["responses"].items():
            if not status.startswith(("4", "5")):
                continue
            content = response["content"]
            assert list(content) == [PROBLEM_JSON], (op["operationId"], status)
            examples = content[PROBLEM_JSON]["examples"]
            assert examples, (op["operationId"], status)
            for code, example in examples.items():
                body = example["value"]
                jsonschema.validate(body, document["components"]["schemas"]["Problem"])
                where = (op["operationId"], status, code)
                assert body["status"] == int(status) and body["status"] != 0, where
                assert body["code"] == code and body["type"] == f"urn:eventlog:problem:{code}", (
                    where
                )
                assert body["title"] == HTTPStatus(int(status)).phrase, where
                assert len(body["detail"]) > 10, where
                assert not _placeholders(body), where
                assert all(v is not None for v in body.values()), where  # only the members it has
                seen_codes.add(code)
            named = [c for c in examples if c in response["description"]]
            assert named or len(examples) == 1, (op["operationId"], status, list(examples))
    # each documented code of docs/API.md's table that an operation lists has its example
    doc = (REPO / "docs" / "API.md").read_text()
    for code in (
        "topic_not_found",
        "offset_out_of_range",
        "group_not_empty",
        "quota_exceeded",
        "validation_error",
    ):
        assert f"`{code}`" in doc and code in seen_codes, code


def test_a_404_lists_topic_and_partition_not_found_with_their_details(
    document: dict[str, Any],
) -> None:
    produce = document["paths"]["/v1/topics/{topic}/records"]["post"]
    examples = produce["responses"]["404"]["content"][PROBLEM_JSON]["examples"]
    assert set(examples) == {"topic_not_found", "partition_not_found"}
    assert examples["topic_not_found"]["value"]["detail"] == "topic 'orders' does not exist"
    reset = document["paths"]["/v1/groups/{group}/offsets/reset"]["post"]
    refused = reset["responses"]["409"]["content"][PROBLEM_JSON]["examples"]["group_not_empty"][
        "value"
    ]
    assert (refused["status"], refused["members"], refused["group_state"]) == (409, 2, "Stable")


def test_request_examples_are_real_and_accepted(document: dict[str, Any]) -> None:
    found = {}
    for op in _operations(document):
        body = op.get("requestBody", {}).get("content", {}).get("application/json")
        if body is not None and "example" in body:
            found[op["operationId"]] = body["example"]
    assert set(MODELS) <= set(found), sorted(set(MODELS) - set(found))
    for operation_id, example in found.items():
        assert not _placeholders(example), (operation_id, example)
        if operation_id in MODELS:
            MODELS[operation_id].model_validate(example)  # the API takes it as it is
    produce = found["produceRecords"]
    assert produce["records"][0] == {
        "key": "user-42",
        "value": "hello",
        "headers": [{"key": "source", "value": "curl"}],
    }  # docs/API.md's first produce
    assert all(r.get("value") is not None for r in produce["records"])
    # each example of a documented operation is a body docs/API.md's curl examples send
    bodies = [
        json.loads(b)
        for b in re.findall(r" -d '(\{.*?\})'", (REPO / "docs" / "API.md").read_text())
    ]
    for operation_id in (
        "createTopic",
        "produceRecords",
        "produceToPartition",
        "appendKeyRecords",
        "commitGroupOffsets",
        "resetGroupOffsets",
    ):
        assert found[operation_id] in bodies, (operation_id, found[operation_id])
