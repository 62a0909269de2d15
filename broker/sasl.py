"""SaslHandshake and SaslAuthenticate: SASL/PLAIN with the bearer token as the password.

With an auth file (api/auth.py) a Kafka connection must authenticate before any request but
ApiVersions and the two SASL ones; it then acts as the token's principal (its role and topic
and group prefixes), exactly as an HTTP request with that token would. The user name is not
checked (the token alone names the principal, as on HTTP); an authorization id, if given, must
be empty or equal to the user name (RFC 4616). A failed authentication is answered with
SASL_AUTHENTICATION_FAILED and the connection closes, as Kafka closes it.

Without an auth file every connection is the anonymous admin, and SASL/PLAIN is accepted with
any credentials, so a client configured for SASL still connects.

Both flows are served: KIP-152's (SaslHandshake v1, then SaslAuthenticate, what every current
client uses) and KIP-43's (SaslHandshake v0, then the PLAIN message alone in the next frame,
without a Kafka header, answered with an empty frame; broker/listener.py reads it). Kafka 4
serves both; librdkafka before 2.x will not use SASL/PLAIN at all with a broker whose
SaslHandshake versions do not include v0 (Debian's kcat: "SASL Handshake not supported by
broker"), though it then sends v1.
"""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from api.auth import ANONYMOUS_ADMIN

from .listener import Call
from .protocol import make, ms, serves

PLAIN = "PLAIN"


@serves(17, "SaslHandshake", 0, 1)
async def sasl_handshake(call: Call, request: Any) -> Any:
    connection = call.connection
    if request.mechanism != PLAIN:
        call.error = ErrorCode.unsupported_sasl_mechanism
        return make(call.response, error_code=call.error, mechanisms=(PLAIN,))
    connection.mechanism = PLAIN
    connection.raw_sasl = call.version == 0  # KIP-43: the next frame is the bare PLAIN message
    return make(call.response, error_code=ErrorCode.none, mechanisms=(PLAIN,))


def authenticate_plain(policy: Any, connection: Any, message: bytes) -> tuple[ErrorCode, str]:
    """Check a PLAIN message (RFC 4616: authzid NUL user NUL password) and, when the password
    is a valid token, make the connection that token's principal: (ErrorCode.none, "") then,
    else (SASL_AUTHENTICATION_FAILED, why). Both flows (SaslAuthenticate, KIP-43's bare
    message) come here."""
    parts = bytes(message).split(b"\0")
    if len(parts) != 3:
        return ErrorCode.sasl_authentication_failed, "malformed PLAIN message"
    authzid, user, password = parts
    if authzid and authzid != user:
        return ErrorCode.sasl_authentication_failed, "authorization id differs from the user"
    if policy.authenticator is None:
        connection.principal = ANONYMOUS_ADMIN
    else:
        try:
            connection.principal = policy.authenticate(b"Bearer " + password)
        except Exception:
            return ErrorCode.sasl_authentication_failed, "invalid token"
    connection.authenticated = True
    connection.mechanism = None
    return ErrorCode.none, ""


@serves(36, "SaslAuthenticate", 0, 2)
async def sasl_authenticate(call: Call, request: Any) -> Any:
    connection = call.connection
    if connection.mechanism != PLAIN:
        return _failed(call, ErrorCode.illegal_sasl_state, "SaslHandshake (PLAIN) must come first")
    code, why = authenticate_plain(call.broker.policy, connection, request.auth_bytes)
    if code != ErrorCode.none:
        return _failed(call, code, why)
    return make(
        call.response, error_code=ErrorCode.none, error_message=None, auth_bytes=b"",
        session_lifetime=ms(0),
    )


def _failed(call: Call, code: ErrorCode, message: str) -> Any:
    call.error = code
    call.close = True
    return make(
        call.response, error_code=code, error_message=message, auth_bytes=b"",
        session_lifetime=ms(0),
    )
