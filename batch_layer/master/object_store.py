"""Where Delta tables live: a local folder or an object store, named by a URI.

A table location is a string (a ``Path`` is accepted too): an absolute local path (a relative one,
``~`` or ``file:///...`` is normalised to it), or ``s3://bucket/prefix/...``. Every module that
touches a table's files goes through these functions, so no code path assumes a shared local
folder: delta-rs takes the URI and :func:`storage_options`, Spark takes :func:`spark_uri`
(``s3a://``, Hadoop's S3A connector), and single files (the Delta log's commits, a generation's
parquet files) are read and listed through pyarrow's filesystems (:func:`read_bytes`,
:func:`list_files`).

Credentials never pass through this module: delta-rs, pyarrow and S3A all take them from the
standard AWS chain (``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` / ``AWS_SESSION_TOKEN`` in
the environment, a profile, or an instance role), where ``deploy`` puts the settings' credentials,
so no secret is held in an argument, an option dict or a Spark plan. The endpoint and the region
come from ``AWS_ENDPOINT_URL`` and ``AWS_REGION`` (an S3-compatible server such as MinIO: its URL;
unset: AWS).

Concurrent commits: a Delta commit is "create the file ``_delta_log/<version>.json`` unless it
exists". On S3 delta-rs does that with a conditional put (``If-None-Match: *``; refused with 412 when
another writer created it first, and retried at the next version): see :func:`storage_options`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Union
from urllib.parse import unquote, urlparse

import pyarrow.fs as pafs

from batch_layer.errors import StorageError

#: A table location: a URI string or a local path.
Location = Union[str, "os.PathLike[str]"]

OBJECT_STORE_SCHEMES = ("s3", "s3a")
ENDPOINT_VARIABLE = "AWS_ENDPOINT_URL"
REGION_VARIABLE = "AWS_REGION"


def table_uri(location: Location) -> str:
    """The normal form of ``location``: ``s3://bucket/key`` (no trailing slash) or an absolute local path."""
    text = os.fspath(location)
    parsed = urlparse(text)
    if parsed.scheme in OBJECT_STORE_SCHEMES:
        if not parsed.netloc:
            raise StorageError(f"{text!r} names no bucket: use s3://BUCKET/PREFIX")
        return f"s3://{parsed.netloc}{parsed.path.rstrip('/')}"
    if parsed.scheme == "file":
        return str(Path(unquote(parsed.path)).absolute())
    if parsed.scheme and len(parsed.scheme) > 1:  # not a Windows drive letter
        raise StorageError(f"unsupported table location {text!r}: use a local folder, file:///PATH or s3://BUCKET/PREFIX")
    return str(Path(text).expanduser().absolute())


def is_object_store(location: Location) -> bool:
    """True for ``s3://`` (or ``s3a://``) locations."""
    return urlparse(os.fspath(location)).scheme in OBJECT_STORE_SCHEMES


def join(location: Location, *parts: str) -> str:
    """``location`` with ``parts`` appended, as a URI (``/`` separated)."""
    base = table_uri(location)
    return "/".join([base, *(p.strip("/") for p in parts)]) if is_object_store(base) else str(Path(base, *parts))


def relative(location: Location, base: Location) -> str:
    """The path of ``location`` below ``base``, ``/`` separated (a Delta ``add`` action's path)."""
    child, root = table_uri(location), table_uri(base)
    if not is_object_store(child):
        return Path(child).relative_to(root).as_posix()
    if not child.startswith(root + "/"):
        raise StorageError(f"{child} is not inside {root}")
    return child[len(root) + 1:]


def storage_options(location: Location) -> dict[str, str]:
    """delta-rs storage options for ``location`` (none for a local table; never credentials).

    S3: ``conditional_put = etag`` (object_store's conditional put; commits themselves are created
    with ``If-None-Match: *``, which delta-rs uses on S3 either way: a concurrent commit of the same
    version is refused by the server, never overwritten), and plain HTTP allowed when
    ``AWS_ENDPOINT_URL`` is an ``http://`` URL (a loopback MinIO or moto).
    """
    if not is_object_store(location):
        return {}
    options = {"conditional_put": "etag"}
    if os.environ.get(ENDPOINT_VARIABLE, "").startswith("http://"):
        options["allow_http"] = "true"
    return options


def spark_uri(location: Location) -> str:
    """``location`` as Spark and Hadoop name it: ``s3a://`` (the S3A connector) or a local path."""
    uri = table_uri(location)
    return "s3a://" + uri[len("s3://"):] if is_object_store(uri) else uri


def filesystem(location: Location) -> tuple[pafs.FileSystem, str]:
    """A pyarrow filesystem for ``location`` and the path of ``location`` on it."""
    uri = table_uri(location)
    if not is_object_store(uri):
        return pafs.LocalFileSystem(), uri
    endpoint = os.environ.get(ENDPOINT_VARIABLE) or None
    parsed = urlparse(endpoint) if endpoint else None
    fs = pafs.S3FileSystem(
        endpoint_override=parsed.netloc if parsed else None,
        scheme=parsed.scheme if parsed else "https",
        region=os.environ.get(REGION_VARIABLE) or None,
        force_virtual_addressing=False,
    )
    return fs, uri[len("s3://"):]


def read_bytes(location: Location) -> bytes | None:
    """The content of the file at ``location``; None when there is no such file."""
    fs, path = filesystem(location)
    try:
        with fs.open_input_stream(path) as stream:
            return stream.read()
    except FileNotFoundError:
        return None
    except OSError as e:
        if "NoSuchKey" in str(e) or "does not exist" in str(e).lower():
            return None
        raise


def list_files(location: Location, suffix: str = "") -> list[tuple[str, int]]:
    """The files directly in the folder ``location`` ending with ``suffix``: (URI, size), sorted."""
    fs, path = filesystem(location)
    infos = fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))
    found = [(info.path, info.size or 0) for info in infos if info.type == pafs.FileType.File and info.path.endswith(suffix)]
    scheme = "s3://" if is_object_store(location) else ""
    return sorted((scheme + p, size) for p, size in found)


def delete_files(locations: list[str]) -> None:
    """Delete the files at ``locations`` (URIs as ``list_files`` gives them); one already gone is fine."""
    for location in locations:
        fs, path = filesystem(location)
        try:
            fs.delete_file(path)
        except FileNotFoundError:
            pass


def file_size(location: Location) -> int:
    """The size in bytes of the file at ``location`` (StorageError when there is none)."""
    fs, path = filesystem(location)
    info = fs.get_file_info(path)
    if info.type != pafs.FileType.File or info.size is None:
        raise StorageError(f"no file at {table_uri(location)}")
    return info.size


def make_folder(location: Location) -> None:
    """Create the local folder ``location`` (object stores have no folders: nothing to do)."""
    if not is_object_store(location):
        Path(table_uri(location)).mkdir(parents=True, exist_ok=True)
