"""The HTTP server's own refusals in the API's error shape: ``uvicorn.run(app, http=JsonErrorHttpProtocol)``.

uvicorn answers a request it cannot parse itself, before the application sees it, with a plain-text
``400 Invalid HTTP request received.``: a malformed request line or header, and, with httptools (the
parser ``uvicorn[standard]`` brings, which ``auto`` picks), a request target (path and query) longer
than 65535 bytes, which its URL parser cannot hold. Nothing in the application can change that
answer. ``JsonErrorHttpProtocol`` is uvicorn's own protocol (the one ``auto`` picks) with that one
answer written as every other error of the API: ``{"error": "BadRequestError", "detail": ...}``,
``application/json``, still 400, still closing the connection. Everything else is uvicorn's.
"""

from __future__ import annotations

import json
from typing import Any

import h11
from uvicorn.protocols.http.auto import AutoHTTPProtocol
from uvicorn.protocols.http.h11_impl import H11Protocol

from serving.api.key_pages import MAX_CURSOR_CHARS
from serving.api.queries import MAX_KEY_CHARS

DETAIL = (
    "the request could not be read as HTTP/1.1: its request line or a header is malformed, or its URL (path and "
    "query) is longer than the 65535 bytes this server reads; nothing was done. A key, a prefix or a key column "
    f"filter is at most {MAX_KEY_CHARS} characters and a cursor at most {MAX_CURSOR_CHARS} (GET /docs)"
)
BODY = json.dumps({"error": "BadRequestError", "detail": DETAIL}).encode()


class JsonErrorH11Protocol(H11Protocol):
    """uvicorn's h11 protocol, its unparsable-request answer in the API's error shape."""

    def send_400_response(self, msg: str) -> None:
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(BODY)).encode()),
                   (b"connection", b"close")]
        for event in (h11.Response(status_code=400, headers=headers, reason=b"Bad Request"), h11.Data(data=BODY),
                      h11.EndOfMessage()):
            self.transport.write(self.conn.send(event))
        self.transport.close()


def _httptools_protocol() -> type[Any] | None:
    try:
        from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol
    except ImportError:  # uvicorn without httptools: ``auto`` is h11
        return None

    class JsonErrorHttpToolsProtocol(HttpToolsProtocol):
        """uvicorn's httptools protocol, its unparsable-request answer in the API's error shape."""

        def send_400_response(self, msg: str) -> None:
            content = [STATUS_LINE[400]]
            for name, value in self.server_state.default_headers:
                content.extend([name, b": ", value, b"\r\n"])
            content.extend([b"content-type: application/json\r\n", b"content-length: %d\r\n" % len(BODY),
                            b"connection: close\r\n", b"\r\n", BODY])
            self.transport.write(b"".join(content))
            self.transport.close()

    return JsonErrorHttpToolsProtocol if AutoHTTPProtocol is HttpToolsProtocol else None


#: The protocol to give uvicorn (``http=``): the one its ``auto`` picks, answering unparsable requests in JSON.
JsonErrorHttpProtocol: type[Any] = _httptools_protocol() or JsonErrorH11Protocol
