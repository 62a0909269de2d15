"""Every API module of the listener, imported once so each registers its handlers
(protocol.serves) before the first request."""

from . import (  # noqa: F401
    admin,
    cluster,
    fetch,
    group_offsets,
    groups,
    produce,
    sasl,
)
