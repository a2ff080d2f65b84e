"""A stand-in for a gateway worker process behind the edge (tests/edge/test_envoy.py): a plain HTTP server on a
loopback port that answers every POST (and GET) 200 with its port, the path and the request id — after the delay in ms a
``delay`` query parameter asks for — and appends the size of each body it was sent to ``<port>.seen``.

    python -m tests.edge.stand_in PORT DIR
"""

from __future__ import annotations

import json
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


class StandInWorker(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self):  # noqa: N802 - http.server's naming
        self.do_POST()

    def do_POST(self):  # noqa: N802 - http.server's naming
        body = self.rfile.read(int(self.headers.get("content-length") or 0))
        with open(self.server.seen_path, "a") as fh:
            fh.write(f"{len(body)}\n")
        if "delay=" in self.path:
            time.sleep(int(self.path.split("delay=")[1]) / 1000)
        out = json.dumps({"worker": self.server.server_port, "path": self.path,
                          "request_id": self.headers.get("x-request-id"),
                          "labels": {h: self.headers.get(h) for h in ("x-keel-tenant", "x-keel-tier", "x-keel-edge",
                                                                 "x-keel-risk-levels")}
                          }).encode()  # fmt: skip
        # the whole answer in one write: a worker killed under traffic (the tests do) has answered or not — a kill
        # between its headers and its body is a broken answer no proxy can retry (it has been forwarded)
        head = f"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {len(out)}\r\n\r\n"
        self.wfile.write(head.encode() + out)

    def log_message(self, *args):
        pass


def main() -> None:
    port, directory = int(sys.argv[1]), Path(sys.argv[2])
    server = ThreadingHTTPServer(("127.0.0.1", port), StandInWorker)
    server.daemon_threads = True
    server.seen_path = directory / f"{port}.seen"
    server.seen_path.touch()
    (directory / f"{port}.up").touch()
    server.serve_forever()


if __name__ == "__main__":
    main()
