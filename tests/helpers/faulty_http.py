"""A real HTTP server on the loopback interface that serves a folder with the faults a download
meets, chosen by the URL's first path part: ``/ok/<file>`` (Range honoured, HTTP 416 past the
end), ``/norange/`` (Range ignored: the whole file, 200), ``/chunkcut/`` (a chunked transfer cut
off halfway), ``/cutonce/`` (the first request's body cut off halfway, Range honoured after),
``/html/`` (an HTML page, 200, whatever the file), ``/held/`` (half the file, then the rest once the
test sets ``release``: a transfer under way for as long as a test needs one)."""

from __future__ import annotations

import http.server
import re
import threading
from pathlib import Path

HTML = b"<!DOCTYPE html><html><head><title>Maintenance</title></head><body>down for maintenance</body></html>\n"


class FaultyServer(http.server.ThreadingHTTPServer):
    """Serves ``root``; ``requests`` lists each GET as (path, Range header or None)."""

    daemon_threads = True

    def __init__(self, root: Path):
        self.root, self.requests, self.cut, self.release = root, [], set(), threading.Event()
        super().__init__(("127.0.0.1", 0), _Handler)
        threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()  # a quick shutdown

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: FaultyServer

    def log_message(self, *args) -> None:
        pass

    def _head(self, status: int, length: int | None, **headers: str) -> None:
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name.replace("_", "-"), value)
        if length is not None:
            self.send_header("Content-Length", str(length))
        self.end_headers()

    def do_GET(self) -> None:
        asked = self.headers.get("Range")
        self.server.requests.append((self.path, asked))
        mode, _, name = self.path.lstrip("/").partition("/")
        if mode == "html":
            self._head(200, len(HTML), Content_Type="text/html")
            self.wfile.write(HTML)
            return
        path = self.server.root / name
        if not path.is_file():
            self._head(404, 0)
            return
        data = path.read_bytes()
        if mode == "chunkcut":
            self._head(200, None, Transfer_Encoding="chunked")
            half = data[: len(data) // 2]
            self.wfile.write(b"%x\r\n" % len(data) + half)  # announces the whole, sends half, ends
            self.close_connection = True
            return
        start = int(re.match(r"bytes=(\d+)-", asked)[1]) if asked and mode != "norange" else 0
        if start >= len(data) > 0:
            self._head(416, 0, Content_Range=f"bytes */{len(data)}")
            return
        body = data[start:]
        if start:
            self._head(206, len(body), Content_Range=f"bytes {start}-{len(data) - 1}/{len(data)}")
        else:
            self._head(200, len(body))
        if mode == "cutonce" and name not in self.server.cut:
            self.server.cut.add(name)
            self.wfile.write(body[: len(body) // 2])
            self.close_connection = True
            return
        if mode == "held":
            self.wfile.write(body[: len(body) // 2])
            self.wfile.flush()
            self.server.release.wait(60)  # a bound on a test that never sets it, not a pace
            body = body[len(body) // 2 :]
        self.wfile.write(body)
