"""Where snapshots live: a local path, or a URI of any pyarrow filesystem (s3://, hdfs://, gs://).

A *location* is a plain string, so it pickles into input partitions and travels to the
executors; each process makes its filesystem from it when it first opens one (cached per
scheme, authority and query), never receiving a live filesystem object.

    /data/snapshots/<id>                          local (also file:///data/snapshots/<id>)
    s3://bucket/prefix/snapshots/<id>             pyarrow's S3FileSystem; s3a:// and s3n:// too
    s3://bucket/prefix?endpoint_override=host:9000&scheme=http
                                                  pyarrow's URI options (region, scheme,
                                                  endpoint_override, ...) stay with the location

Credentials come from the AWS SDK's default chain: AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY
(/ AWS_SESSION_TOKEN), AWS_REGION, a profile file, an instance role. The endpoint from
AWS_ENDPOINT_URL (pyarrow 26 honours it) or from the URI's `endpoint_override`. Executors need
the same: the environment (spark.executorEnv.*, or the cluster's role), or the URI option.

Local locations take the paths they always took (os and open): nothing changes for them.
A URI's query is kept on every location made from it (join), and left out of display().
"""

from __future__ import annotations

import functools
import os
import posixpath
import urllib.parse
from typing import BinaryIO

__all__ = [
    "basename",
    "display",
    "exists",
    "is_uri",
    "join",
    "list_dirs",
    "normalize",
    "open_input",
    "read_bytes",
    "resolve",
    "scheme",
    "with_query",
]

_ALIASES = {"s3a": "s3", "s3n": "s3"}  # Hadoop's names for S3; pyarrow knows s3 only


def is_uri(location) -> bool:
    """True for a URI of a filesystem other than the local one (file:// is local)."""
    text = str(location)
    scheme, sep, _ = text.partition("://")
    return bool(sep) and scheme.isidentifier() and scheme.lower() != "file"


def normalize(location) -> str:
    """A local location as an absolute path (file:// removed); a URI as given."""
    text = str(location)
    if is_uri(text):
        return text
    return os.path.abspath(text.removeprefix("file://"))


def join(location: str, *parts: str) -> str:
    """`location` / parts, ".." resolved in a URI; the URI's query stays at the end."""
    if not is_uri(location):
        joined = os.path.join(location, *parts)
        return os.path.normpath(joined) if ".." in joined.split(os.sep) else joined
    url = urllib.parse.urlsplit(location)
    path = posixpath.normpath(posixpath.join(url.path or "/", *parts))
    return urllib.parse.urlunsplit(url._replace(path=path))


def inside(location: str, root: str) -> bool:
    """Whether `location` (joined and normalized, as join makes it) is `root` or below it: the
    same filesystem, bucket and path prefix; queries are not compared."""
    if is_uri(location) != is_uri(root):
        return False
    if not is_uri(location):
        path, top = os.path.normpath(location), os.path.normpath(root)
        return path == top or path.startswith(top.rstrip(os.sep) + os.sep)
    a, b = urllib.parse.urlsplit(location), urllib.parse.urlsplit(root)
    if (scheme(location), a.netloc) != (scheme(root), b.netloc):
        return False
    path, top = posixpath.normpath(a.path or "/"), posixpath.normpath(b.path or "/")
    return path == top or path.startswith(top.rstrip("/") + "/")


def scheme(location: str) -> str:
    """The pyarrow filesystem's scheme of a URI (s3a:// is s3); "file" for a local location."""
    if not is_uri(location):
        return "file"
    name = urllib.parse.urlsplit(location).scheme.lower()
    return _ALIASES.get(name, name)


def with_query(location: str, **params: str) -> str:
    """A URI with more query parameters (pyarrow's URI options)."""
    url = urllib.parse.urlsplit(location)
    extra = urllib.parse.urlencode(params)
    return urllib.parse.urlunsplit(url._replace(query=f"{url.query}&{extra}" if url.query else extra))


def basename(location: str) -> str:
    if not is_uri(location):
        return os.path.basename(location)
    return posixpath.basename(urllib.parse.urlsplit(location).path)


def display(location: str) -> str:
    """The location without its URI query (for messages)."""
    if not is_uri(location):
        return location
    return urllib.parse.urlunsplit(urllib.parse.urlsplit(location)._replace(query=""))


def resolve(location: str):
    """(pyarrow FileSystem, path inside it) of a URI; (None, the path) for a local location."""
    if not is_uri(location):
        return None, normalize(location)
    url = urllib.parse.urlsplit(location)
    fs, root = _filesystem(url.scheme.lower(), url.netloc, url.query)
    return fs, root.rstrip("/") + (url.path or "/")


@functools.lru_cache(maxsize=32)
def _filesystem(scheme: str, netloc: str, query: str):
    from pyarrow import fs as pafs

    scheme = _ALIASES.get(scheme, scheme)
    uri = urllib.parse.urlunsplit((scheme, netloc, "/", query, ""))
    return pafs.FileSystem.from_uri(uri)


def open_input(location: str) -> BinaryIO:
    """A binary file for reading with seek/readinto/read (a context manager)."""
    if not is_uri(location):
        return open(str(location).removeprefix("file://"), "rb")  # the local path, as before
    fs, path = resolve(location)
    return fs.open_input_file(path)


def read_bytes(location: str) -> bytes:
    fs, path = resolve(location)
    if fs is None:
        with open(path, "rb") as f:
            return f.read()
    with fs.open_input_stream(path) as f:
        return f.read()


def exists(location: str) -> bool:
    fs, path = resolve(location)
    if fs is None:
        return os.path.exists(path)
    from pyarrow import fs as pafs

    return fs.get_file_info(path).type != pafs.FileType.NotFound


def list_dirs(location: str) -> list[str]:
    """Names of the directories (prefixes) right under `location`, sorted; [] when it is absent."""
    fs, path = resolve(location)
    if fs is None:
        try:
            return sorted(e.name for e in os.scandir(path) if e.is_dir())
        except (FileNotFoundError, NotADirectoryError):
            return []
    from pyarrow import fs as pafs

    infos = fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))
    return sorted(posixpath.basename(i.path) for i in infos if i.type == pafs.FileType.Directory)
