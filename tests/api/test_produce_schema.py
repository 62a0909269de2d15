"""The OpenAPI document's ProduceRequest is the one definition of a JSON produce body: the fast
parser (engine/produce.py) accepts exactly its fields, no more, no fewer."""

from __future__ import annotations

import httpx
import pytest

from api.schemas import ProduceRecord, ProduceRequest, RecordHeader
from engine import produce


def _document(client: httpx.Client) -> dict:
    return client.get("/openapi.json").json()["components"]["schemas"]


def test_the_parser_accepts_the_models_fields() -> None:
    assert produce.BODY_KEYS == set(ProduceRequest.model_fields)
    assert produce.RECORD_KEYS == set(ProduceRecord.model_fields)
    assert produce.HEADER_KEYS == set(RecordHeader.model_fields)
    assert "expected_offset" in produce.BODY_KEYS
    assert set(produce.FORMATS) == set(ProduceRequest.model_json_schema()["$defs"]["Format"]["enum"])


def test_the_published_document_lists_the_same_fields(app_server) -> None:
    with app_server.client() as c:
        schemas = _document(c)
    assert set(schemas["ProduceRequest"]["properties"]) == produce.BODY_KEYS
    assert set(schemas["ProduceRecord"]["properties"]) == produce.RECORD_KEYS
    assert set(schemas["RecordHeader"]["properties"]) == produce.HEADER_KEYS
    assert schemas["ProduceRequest"]["required"] == ["records"]
    # closed objects: a field outside the document is refused, as the parser refuses it
    assert all(schemas[name].get("additionalProperties") is False for name in ("ProduceRequest", "ProduceRecord", "RecordHeader"))


def test_a_body_with_every_documented_field_is_accepted_and_one_more_is_refused(app_server) -> None:
    with app_server.client() as c:
        assert c.post("/v1/topics", json={"name": "t", "partitions": 1}).status_code == 201
        record = {"key": "k", "value": "v", "timestamp": 5, "partition": 0, "headers": [{"key": "h", "value": "x"}]}
        assert set(record) == produce.RECORD_KEYS and set(record["headers"][0]) == produce.HEADER_KEYS
        body = {"records": [record], "key_format": "string", "value_format": "string", "expected_offset": 0}
        assert set(body) == produce.BODY_KEYS
        ok = c.post("/v1/topics/t/records", json=body)
        assert ok.status_code == 200, ok.text
        assert ok.json() == {"offsets": [{"partition": 0, "offset": 0, "timestamp": 5}],
                             "partitions": [{"partition": 0, "base_offset": 0, "last_offset": 0}]}
        for where, extended, unknown in [
            ("body", {**body, "expected_offset": 1, "extra": 1}, "unknown field(s): extra"),
            ("record", {"records": [{**record, "extra": 1}]}, "records[0]: unknown field(s): extra"),
            ("header", {"records": [{**record, "headers": [{"key": "h", "extra": 1}]}]},
             'records[0].headers[0]: must be {"key": string, "value": ...}'),
        ]:
            refused = c.post("/v1/topics/t/records", json=extended)
            assert refused.status_code == 422, where
            assert refused.json()["code"] == "validation_error" and refused.json()["detail"] == unknown, where


@pytest.mark.parametrize("model", [ProduceRequest, ProduceRecord, RecordHeader])
def test_the_models_refuse_unknown_fields_as_the_parser_does(model) -> None:
    assert model.model_config.get("extra") == "forbid"
