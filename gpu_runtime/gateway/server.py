"""The gateway's HTTP server: uvicorn's httptools protocol with the bounds uvicorn does not have — a deadline for a
request's headers and a cap on open connections — so that clients which connect and stop sending cannot hold the
server (docs/serving.md, "Limits").

- **Headers**: a request's headers must be complete within ``header_timeout_s`` of its first byte (or of the
  connection, for the first request); a client that stops mid-headers gets ``408 header_timeout`` and its connection
  is closed. A connection that sends nothing at all is closed at the same deadline (no answer: there is no request).
- **Body**: bounded in the app (``Gateway``: ``body_timeout_s``, a 408 ``body_timeout`` and ``connection: close``),
  where the request can be logged like every other answer.
- **Connections**: at most ``max_connections`` open at once; one more is answered ``503 too_many_connections`` and
  closed at once, before anything of it is parsed. Requests on open connections are not affected.

- **The door**: once a request's headers are in, the gateway is asked whether its tier would shed it now
  (``Gateway.door``: the route names the model, so the request line is enough); if so the protocol writes the 503
  itself — no ASGI task, no header decoding, the body that follows is read and dropped by the parser, the
  connection kept for the next request — the cheapest refusal there is, so that a flood is refused at the rate it
  arrives. Not on a connection with a request still being answered (pipelining keeps its order).
- **Arrival and departure**: each request's scope carries when its first byte was read (``state["keel_arrived"]``,
  from which its deadline runs) and a check whether its client has gone (``state["keel_client_gone"]``: the
  connection is closed or closing), so no stage works for a client that left (request.py).

Each refusal is counted in the gateway's metrics (``keel_gateway_connection_refusals_total{reason}``: header_timeout,
idle, too_many_connections); ``keel_gateway_connections_open`` is the number open when /metrics is read (its own
connection included).
"""

from __future__ import annotations

import asyncio
import time
from http import HTTPStatus
from typing import Any

import orjson
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

HEADER_TIMEOUT_S = 10.0
MAX_CONNECTIONS = 1024


def _raw_answer(status: int, payload: dict, headers: dict[str, str], keep_alive: bool) -> bytes:
    body = orjson.dumps(payload)
    head = [f"HTTP/1.1 {status} {HTTPStatus(status).phrase}", "content-type: application/json",
            f"content-length: {len(body)}", *(f"{k}: {v}" for k, v in headers.items())]  # fmt: skip
    if not keep_alive:
        head.append("connection: close")
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body


def _raw_error(status: int, code: str, message: str) -> bytes:
    """A structured error written by the protocol itself, the connection closed after it."""
    return _raw_answer(status, {"error": {"code": code, "message": message}}, {}, keep_alive=False)


class _AnsweredAtDoor:
    """The cycle of a request refused at the door: its answer is written; the body still arriving is dropped (the
    protocol's body callbacks skip a complete response)."""

    response_complete = True
    keep_alive = True
    disconnected = False

    class message_event:  # noqa: N801 - what connection_lost sets on a cycle
        @staticmethod
        def set() -> None:
            pass


def bounded_protocol(
    gateway: Any, header_timeout_s: float = HEADER_TIMEOUT_S, max_connections: int = MAX_CONNECTIONS
):
    """The protocol class for ``uvicorn.Config(http=...)``, counting its refusals in ``gateway.metrics``."""

    def refused(reason: str) -> None:
        gateway.metrics.inc("keel_gateway_connection_refusals_total", {"reason": reason})

    class BoundedHttpToolsProtocol(HttpToolsProtocol):
        _header_deadline: asyncio.TimerHandle | None = None
        _in_headers = False  # bytes of a request arrived, its headers not yet complete

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            gateway.open_connections = self.connections  # the server's set: /metrics reports its size
            if len(self.connections) > max_connections:
                refused("too_many_connections")
                transport.write(_raw_error(
                    503, "too_many_connections",
                    f"the gateway holds its limit of {max_connections} open connections; retry shortly",
                ))  # fmt: skip
                transport.close()
                return
            self._arm()

        def _arm(self) -> None:
            self._disarm()
            self._header_deadline = self.loop.call_later(header_timeout_s, self._headers_too_slow)

        def _disarm(self) -> None:
            if self._header_deadline is not None:
                self._header_deadline.cancel()
                self._header_deadline = None

        def _headers_too_slow(self) -> None:
            self._header_deadline = None
            if self.transport.is_closing():
                return
            if self._in_headers:
                refused("header_timeout")
                self.transport.write(_raw_error(
                    408, "header_timeout",
                    f"the request's headers did not arrive within {header_timeout_s:g} s",
                ))  # fmt: skip
            else:
                refused("idle")
            self.transport.close()

        def on_message_begin(self) -> None:
            super().on_message_begin()
            state = self.scope["state"]
            state["keel_arrived"] = time.monotonic()
            state["keel_client_gone"] = self.transport.is_closing
            self._in_headers = True
            if self._header_deadline is None:
                self._arm()

        def on_headers_complete(self) -> None:
            self._in_headers = False
            self._disarm()
            if (self.cycle is None or self.cycle.response_complete) and not self.pipeline:
                state = self.scope["state"]
                state["keel_door_checked"] = True
                refused = gateway.door(self.url, self.parser.get_method(), state["keel_arrived"])
                if refused is not None:
                    self._answer_at_door(refused)
                    return
            super().on_headers_complete()

        def _answer_at_door(self, refused: Any) -> None:
            # a client that waits for "100 Continue" may never send the body the parser would wait for: close
            keep_alive = self.parser.should_keep_alive() and not self.expect_100_continue
            self.transport.write(_raw_answer(refused.status, refused.payload, refused.headers, keep_alive))
            self.cycle = _AnsweredAtDoor()  # type: ignore[assignment]
            if keep_alive:
                self.on_response_complete()  # ready for the next request, as after any answer
            else:
                self.transport.close()

        def on_response_complete(self) -> None:
            super().on_response_complete()  # arms uvicorn's keep-alive timer for the idle connection
            if not self.transport.is_closing() and not self.pipeline:
                self._arm()  # …and the next request's headers get the same deadline

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

    return BoundedHttpToolsProtocol
