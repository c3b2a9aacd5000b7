"""moto's S3 server with atomic conditional puts: ``python tests/object_store/s3_server.py -H HOST -p PORT``.

moto 5 answers a ``PUT`` with ``If-None-Match: *`` in two steps, a look-up of the key and then the store,
and its server runs each request on a thread of its own: two racing puts of one new key can both be
answered 200. A suite run saw it once: two writers each committed Delta log version 2, and one append was
lost. Real S3 (and MinIO) decide a conditional put atomically, and safe Delta commits rely on exactly that;
so this wrapper serialises moto's object puts, then runs moto's own server entry point.
"""

from __future__ import annotations

import threading

from moto.core.common_types import TYPE_RESPONSE
from moto.s3.responses import S3Response
from moto.server import main

_PUTS = threading.Lock()
_put_object = S3Response.put_object


def _atomic_put_object(self: S3Response) -> TYPE_RESPONSE:
    with _PUTS:
        return _put_object(self)


S3Response.put_object = _atomic_put_object  # type: ignore[method-assign]

if __name__ == "__main__":
    main()
