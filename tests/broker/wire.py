"""One Kafka connection that sends requests built with kafka-python's protocol classes (generated
from Kafka's message schemas by kafka-python, independently of kio, which the listener uses),
for what no client's public API reaches: a given version of an API, the exact bytes a Fetch
answers, a request repeated on purpose, a frame no client would send."""

from __future__ import annotations

import socket
import struct
from typing import Any

from kafka.protocol.parser import KafkaProtocol

TIMEOUT_S = 10.0


class Wire:
    """A blocking connection to one broker; every read is bounded by TIMEOUT_S."""

    def __init__(self, bootstrap: str) -> None:
        host, port = bootstrap.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=TIMEOUT_S)
        self.protocol = KafkaProtocol(client_id="eventlog-wire-test")

    def __enter__(self) -> Wire:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.sock.close()

    def call(self, request: Any) -> Any:
        """Send `request` (a kafka-python message at a version) and return its decoded answer."""
        self.protocol.send_request(request)
        self.sock.sendall(self.protocol.send_bytes())
        while True:
            data = self.sock.recv(1 << 16)
            if not data:
                raise ConnectionError("the broker closed the connection")
            answers = self.protocol.receive_bytes(data)
            if answers:
                return answers[0][1]

    def send_frame(self, payload: bytes) -> None:
        """Send `payload` as one request frame (its size first), whatever it holds."""
        self.sock.sendall(struct.pack(">i", len(payload)) + payload)

    def read_frame(self) -> bytes | None:
        """The next response frame's bytes (without the size), or None when the broker closed
        the connection instead."""
        head = self._read(4)
        if head is None:
            return None
        (size,) = struct.unpack(">i", head)
        return self._read(size)

    def _read(self, n: int) -> bytes | None:
        out = b""
        while len(out) < n:
            try:
                data = self.sock.recv(n - len(out))
            except ConnectionResetError:
                return None
            if not data:
                return None
            out += data
        return out

    def closed_by_peer(self) -> bool:
        """Whether the broker has closed the connection (reads end-of-stream within TIMEOUT_S)."""
        try:
            return self.sock.recv(1) == b""
        except ConnectionResetError:
            return True
