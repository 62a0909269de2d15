"""The composition root: the `eventlog` command (cli.py), the settings, the HTTP service
(main.py, server.py) and the shard family's supervisor.

__version__ lives here, not in main.py, so `eventlog --version` reads it without importing the
HTTP service."""

__version__ = "0.1.0"
