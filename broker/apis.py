"""Every API module of the listener, imported once so each registers its handlers
(protocol.serves) before the first request."""

from . import admin, cluster, fetch, group_offsets, produce, sasl  # noqa: F401
