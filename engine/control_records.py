"""Control records: what the records of a control batch (attribute bit 5) hold.

    key     version int16 (0), type int16
    value   for ABORT (0) and COMMIT (1), an end-transaction marker:
            version int16 (0), coordinator_epoch int32

Other types are KRaft's (LEADER_CHANGE 2, SNAPSHOT_HEADER 3, SNAPSHOT_FOOTER 4, KRAFT_VERSION 5,
KRAFT_VOTERS 6); their values are not decoded here. eventlog never writes control batches; it
reads them in files written by Kafka (dump-log, import-kafka). Pure.
"""

from __future__ import annotations

import struct

ABORT, COMMIT = 0, 1
TYPE_NAMES = {
    0: "ABORT", 1: "COMMIT", 2: "LEADER_CHANGE", 3: "SNAPSHOT_HEADER", 4: "SNAPSHOT_FOOTER",
    5: "KRAFT_VERSION", 6: "KRAFT_VOTERS",
}
_KEY = struct.Struct(">hh")
_END_TXN_MARKER = struct.Struct(">hi")


def control_type(key: bytes | None) -> int | None:
    """The type in a control record's key; None if the key is too short to hold one."""
    if key is None or len(key) < _KEY.size:
        return None
    return _KEY.unpack_from(key, 0)[1]


def coordinator_epoch(value: bytes | None) -> int | None:
    """The coordinator epoch of an end-transaction marker's value; None if malformed."""
    if value is None or len(value) < _END_TXN_MARKER.size:
        return None
    return _END_TXN_MARKER.unpack_from(value, 0)[1]
