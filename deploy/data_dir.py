"""The data dir's private files: folders made 0700 from the start, and the local API key.

Everything a platform keeps on local disk (events, keys, Redis data, logs) lives under the data dir,
so every folder of it is made private as it is made, never tightened after the fact.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from deploy.errors import ConfigError
from deploy.settings import Settings

#: The scopes of the local API key: everything (it never leaves the machine's data dir).
LOCAL_API_KEY_SCOPES = ("read", "ingest", "admin")


def private_dir(path: Path) -> Path:
    """Create ``path`` and every missing parent as private folders (0700) from the start; returns it.

    An existing folder is left as it is.
    """
    path = path.resolve()
    for folder in [*reversed(path.parents), path]:
        if not folder.exists():
            try:
                folder.mkdir(mode=0o700)
            except FileExistsError:
                pass  # created meanwhile by another process
    return path


def local_api_key(settings: Settings, *, create: bool = True) -> str | None:
    """The data dir's local API key: read, or (``create``) made if missing, 0600 from the start.

    Several processes may race to make it: each writes a private temporary file and links it into
    place only if no key is there yet, so all of them end up with the same key, and a reader never
    sees a half-written one.
    """
    path = settings.local_api_key_path
    if not path.exists():
        if not create:
            return None
        private_dir(path.parent)
        temporary = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "w") as fh:
                fh.write(secrets.token_urlsafe(24))
                fh.flush()
                os.fsync(fh.fileno())
            try:
                os.link(temporary, path)
            except FileExistsError:
                pass  # another process made it first: use theirs
        finally:
            temporary.unlink(missing_ok=True)
    key = path.read_text().strip()
    if not key:
        raise ConfigError(f"the local API key file {path} is empty: delete it and a new key is made, "
                          "or set LAMBDA_API_KEYS")
    return key


def with_api_keys(settings: Settings, *, create: bool = True) -> tuple[Settings, str | None]:
    """The settings with the API keys every command uses, and the local key if that is what they are.

    LAMBDA_API_KEYS set: those keys, and None. Unset: the data dir's local key with every scope
    (made if missing and ``create``), exactly as ``up`` uses it, so ``serve``, ``generate`` and
    ``status`` started alone accept and send the same key.
    """
    if settings.api_keys:
        return settings, None
    key = local_api_key(settings, create=create)
    if key is None:
        return settings, None
    return settings.model_copy(update={"api_keys": {key: list(LOCAL_API_KEY_SCOPES)}}), key
