"""Table locations: a local path or ``file://`` URI, or an object store URI; and which
options are the object store's (:mod:`engine.storage`)."""

from __future__ import annotations

import re
from urllib.parse import unquote, urlsplit

from engine.errors import UnsupportedStorageError

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")

OBJECT_SCHEMES = ("s3", "s3a", "gs", "az", "abfs", "abfss")
"""Location schemes served by :class:`ObjectStorage`."""


STORAGE_OPTION_PREFIXES = ("aws_", "google_", "azure_")
"""How the keys of object store options begin (object_store's ``AmazonS3ConfigKey``,
``GoogleConfigKey`` and ``AzureConfigKey`` names, as obstore and hudi-rs take them:
``aws_endpoint_url``, ``aws_secret_access_key``, ``google_service_account_key``,
``azure_storage_account_key``, ...). Option maps that mix them with other options (the Spark
source's) tell them apart by :func:`is_storage_option`."""


def is_storage_option(key: str) -> bool:
    """True for a key of the object store's options (:data:`STORAGE_OPTION_PREFIXES`,
    case-insensitively: Spark lower-cases option keys)."""
    return str(key).lower().startswith(STORAGE_OPTION_PREFIXES)


def scheme_of(location: str) -> str | None:
    """The lower-case scheme of a URI location (``s3``, ``file``), None for a plain path."""
    match = _SCHEME.match(location)
    return match.group(1).lower() if match else None


def is_local(location: str) -> bool:
    """True for a plain path or a ``file://`` URI."""
    return scheme_of(location) in (None, "file")


def local_path(location: str) -> str:
    """The local folder of a table location: a path, or a ``file://`` URI.

    ``file:///data/t`` and ``file://localhost/data/t`` are ``/data/t`` (percent-escapes
    decoded); a plain path is returned as given. Any other scheme raises
    :class:`~engine.errors.UnsupportedStorageError` naming the location (an object store
    location has no local folder; such a string must never become a folder named ``s3:``
    in the working directory). The streaming job's locations go through this (it writes
    local folders only, so far); the engine takes object store URIs
    (:func:`normalize_location`).
    """
    scheme = scheme_of(location)
    if scheme is None:
        return location
    if scheme != "file":
        raise UnsupportedStorageError(
            f"{location}: {scheme}:// locations are not supported yet by the streaming job "
            "(the engine API and `tidelake table` take them); use a local folder or a "
            "file:// URI")
    parts = urlsplit(location)
    if parts.netloc not in ("", "localhost"):
        raise UnsupportedStorageError(
            f"{location}: a file:// URI must name a local path (file:///folder), not the "
            f"host '{parts.netloc}'")
    path = unquote(parts.path)
    if not path:
        raise UnsupportedStorageError(f"{location}: the file:// URI names no folder")
    return path


def normalize_location(location: str) -> str:
    """A table location as the engine keeps it: a local path for a path or ``file://`` URI,
    the URI without a trailing ``/`` for an object store; anything else raises
    :class:`~engine.errors.UnsupportedStorageError`."""
    scheme = scheme_of(location)
    if scheme in (None, "file"):
        return local_path(location)
    if scheme not in OBJECT_SCHEMES:
        raise UnsupportedStorageError(
            f"{location}: {scheme}:// locations are not supported (use a local folder, "
            "file://, s3://, gs://, az:// or abfs[s]://)")
    parts = urlsplit(location)
    if not parts.netloc:
        raise UnsupportedStorageError(f"{location}: the URI names no bucket or container")
    return location.rstrip("/")
