"""Redis replies as text, typed.

redis-py types a reply as ``bytes | str``: which one arrives depends on the client's
``decode_responses`` (``redis_client(..., decode=...)``), known only at runtime. These helpers give
the same ``str`` for either, so callers need neither a ``cast`` nor a ``type: ignore``.
"""

from __future__ import annotations

from collections.abc import Mapping

#: An ``HGETALL`` reply from either kind of client.
HashReply = Mapping[bytes, bytes] | Mapping[str, str] | Mapping[bytes | str, bytes | str]


def text(value: bytes | str) -> str:
    """``value`` as str (bytes are UTF-8, as everything the platform writes)."""
    return value.decode() if isinstance(value, bytes) else value


def text_hash(values: HashReply) -> dict[str, str]:
    """An ``HGETALL`` reply with every field and value as str."""
    return {text(k): text(v) for k, v in values.items()}
