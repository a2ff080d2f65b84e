"""The Dagster UI's front door: a small proxy that answers only requests addressed to the UI's own address.

Dagster's webserver answers GraphQL (``launchRun``, ``wipeAssets``, ``deleteRun``, …) for any ``Host`` header and any
``Origin``. Binding 127.0.0.1 keeps other machines out, not other web pages: a page the user visits can rebind its
name to 127.0.0.1 (DNS rebinding: the browser then sends ``Host: evil.example:3000``) or post to
``http://127.0.0.1:3000/graphql`` from its own origin (``Origin: https://evil.example``). dagster-webserver has no
option to refuse either, so ``scripts/up`` runs the webserver on an internal loopback port and this proxy on the
UI's port in front of it:

- ``Host`` must be one of the UI's addresses (``127.0.0.1:PORT``, ``localhost:PORT``, ``[::1]:PORT``, and any listed
  in ``$KEEL_UI_ALLOWED_HOSTS``, comma-separated ``host:port``) — else ``403 host_not_allowed``;
- an ``Origin``, when the request has one (browsers send it with every POST, every WebSocket handshake and every
  cross-origin request), must be ``http://`` one of those addresses — else ``403 origin_not_allowed``. Requests
  without one (curl, scripts, the tests' GraphQL clients) are not from a web page and pass;
- everything else is forwarded unchanged, WebSocket upgrades included (GraphQL subscriptions: live run logs). Each
  connection carries one request (``Connection: close`` is set on the way in), so every request's headers are
  checked, and a client that stops sending its headers is dropped after ``HEADER_TIMEOUT_S``.

    python -m keel.uiguard --listen 127.0.0.1:3000 --upstream 127.0.0.1:43117
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Iterable

from keel.signals import restore_default_signals

HEADER_TIMEOUT_S = 30.0
MAX_HEAD_BYTES = 64 * 1024
ALLOWED_HOSTS_ENV = "KEEL_UI_ALLOWED_HOSTS"


def allowed_hosts(port: int, extra: Iterable[str] = ()) -> frozenset[str]:
    """The ``Host`` values the UI answers: its loopback names on ``port``, and ``extra`` (lower-cased)."""
    base = {f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}"}
    return frozenset(base | {h.strip().lower() for h in extra if h.strip()})


def refusal(head: bytes, hosts: frozenset[str]) -> tuple[int, str, str] | None:
    """Why a request with this head (request line and headers, without the final blank line) is refused —
    (status, code, message) — or None when it may pass. A decision on bytes, tested without sockets."""
    lines = head.split(b"\r\n")
    if len(lines[0].split(b" ")) != 3:
        return 400, "bad_request", "the request line is not 'METHOD TARGET HTTP/x.y'"
    found: dict[bytes, list[bytes]] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep or not name or name != name.strip():
            return 400, "bad_request", "a header line is not 'Name: value'"
        found.setdefault(name.strip().lower(), []).append(value.strip())
    host = found.get(b"host", [])
    if len(host) != 1:
        return 400, "bad_request", "a request names exactly one Host"
    shown = host[0].decode("latin-1")[:80]
    if shown.lower() not in hosts:
        return (
            403,
            "host_not_allowed",
            f"Host {shown!r} is not this UI's address (allowed: {', '.join(sorted(hosts))})",
        )
    origins = found.get(b"origin", [])
    if len(origins) > 1:
        return 400, "bad_request", "a request names at most one Origin"
    if origins:
        origin = origins[0].decode("latin-1")[:120]
        if origin.lower().removeprefix("http://") not in hosts or not origin.lower().startswith("http://"):
            return 403, "origin_not_allowed", f"Origin {origin!r} is not this UI (a request from another web page)"
    return None


def forwarded_head(head: bytes) -> bytes:
    """The head sent upstream: unchanged, except ``Connection: close`` unless it is a WebSocket upgrade (one request
    per connection, so that the next request's headers go through ``refusal`` too)."""
    lines = head.split(b"\r\n")
    headers = lines[1:]
    connection = [ln for ln in headers if ln.lower().startswith(b"connection:")]
    if any(b"upgrade" in ln.lower() for ln in connection):
        return head
    kept = [ln for ln in headers if not ln.lower().startswith((b"connection:", b"keep-alive:"))]
    return b"\r\n".join([lines[0], *kept, b"Connection: close"])


def _response(status: int, code: str, message: str) -> bytes:
    reason = {400: "Bad Request", 403: "Forbidden", 408: "Request Timeout", 502: "Bad Gateway"}[status]
    body = json.dumps({"error": {"code": code, "message": message}}).encode()
    return (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
        "connection: close\r\n\r\n"
    ).encode() + body


class UIGuard:
    def __init__(self, upstream: tuple[str, int], hosts: frozenset[str], log=print):
        self.upstream, self.hosts, self.log = upstream, hosts, log
        self.refused = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            try:
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HEADER_TIMEOUT_S)
            except TimeoutError:
                writer.write(_response(408, "header_timeout", f"no request headers within {HEADER_TIMEOUT_S:g} s"))
                return
            except asyncio.LimitOverrunError:
                writer.write(_response(400, "bad_request", f"request headers over {MAX_HEAD_BYTES:,} bytes"))
                return
            except asyncio.IncompleteReadError:
                return  # the client left before sending a request
            why = refusal(head[:-4], self.hosts)
            if why is not None:
                self.refused += 1
                self.log(f"keel ui guard: refused {head.split(b' ', 2)[:2]!r}: {why[2]}")
                writer.write(_response(*why))
                return
            try:
                up_reader, up_writer = await asyncio.open_connection(*self.upstream)
            except OSError as exc:
                writer.write(_response(502, "ui_unavailable", f"the Dagster webserver is not reachable: {exc}"))
                return
            up_writer.write(forwarded_head(head[:-4]) + b"\r\n\r\n")
            to_upstream = asyncio.ensure_future(_pipe(reader, up_writer))
            try:
                await _pipe(up_reader, writer)  # the answer (or the WebSocket's frames) until the webserver closes
            finally:
                to_upstream.cancel()
                up_writer.close()
        finally:
            try:
                await writer.drain()
            except ConnectionError:
                pass
            writer.close()


async def _pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
    try:
        while data := await src.read(65536):
            dst.write(data)
            await dst.drain()
    except ConnectionError:
        pass
    finally:
        try:
            if dst.can_write_eof():
                dst.write_eof()
        except (OSError, RuntimeError):
            dst.close()


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected host:port, got {text!r}")
    return host, int(port)


async def serve(listen: tuple[str, int], upstream: tuple[str, int], hosts: frozenset[str]) -> None:
    guard = UIGuard(upstream, hosts, log=lambda m: print(m, file=sys.stderr, flush=True))
    server = await asyncio.start_server(guard.handle, *listen, limit=MAX_HEAD_BYTES)
    print(f"keel ui guard: http://{listen[0]}:{listen[1]} → {upstream[0]}:{upstream[1]}", flush=True)
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> int:
    restore_default_signals()  # stops on TERM whatever it inherited (keel/signals.py)
    parser = argparse.ArgumentParser(prog="python -m keel.uiguard", description=__doc__.split("\n\n")[0])
    parser.add_argument("--listen", type=_address, required=True, help="host:port the UI is served on")
    parser.add_argument("--upstream", type=_address, required=True, help="host:port of the Dagster webserver")
    args = parser.parse_args(argv)
    extra = os.environ.get(ALLOWED_HOSTS_ENV, "").split(",")
    try:
        asyncio.run(serve(args.listen, args.upstream, allowed_hosts(args.listen[1], extra)))
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
