"""What the gateway accepts and how it answers: bounded bodies, identifiers and headers, the JSON body, the
structured error for anything else, and the two ways a response is written (JSON, text).

Every limit here protects the gateway's memory and the files it writes from what a caller sends (docs/serving.md,
"Limits"): the body size (413), identifiers that end up in the exposure log and in metric labels (422), header bytes
(400), and the per-tenant state (token buckets for tenants the policy does not name live in a bounded LRU; their
metric label is ``other``).
"""

from __future__ import annotations

import asyncio
import string
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import orjson

from keel.names import TENANT_ID_RULE, is_tenant_id

MAX_BODY_BYTES = 1 << 20  # 1 MiB; GatewayConfig.max_body_bytes / --max-body-bytes / KEEL_GATEWAY_MAX_BODY_BYTES
BODY_TIMEOUT_S = 10.0  # the whole body, from the end of the headers; GatewayConfig.body_timeout_s
MAX_ID_CHARS = 128
ID_CHARS = frozenset(string.ascii_letters + string.digits + "._:@/+=-")
ID_RULE = f"1…{MAX_ID_CHARS} characters from A–Z a–z 0–9 . _ : @ / + = -"
MAX_TENANT_BUCKETS = 1024  # token buckets of tenants the policy does not name, least recently used evicted first
OTHER_TENANT = "other"  # the metric label of every tenant the policy does not name


class RequestError(Exception):
    """An answer other than 200, with a structured error body."""

    def __init__(self, status: int, code: str, message: str, **details: Any):
        super().__init__(message)
        self.status, self.code, self.details = status, code, details

    def body(self, request_id: str) -> dict[str, Any]:
        return {"request_id": request_id, "error": {"code": self.code, "message": str(self), **self.details}}


def identifier(value: Any, field: str) -> str:
    """A caller's identifier (unit, tenant, experiment, request id) checked before it is logged or hashed: a string
    (or an integer) of at most MAX_ID_CHARS safe characters — 422 ``invalid_input`` naming the field otherwise."""
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str):
        raise RequestError(422, "invalid_input", f"{field} must be a string", field=field)
    if not value or len(value) > MAX_ID_CHARS or not ID_CHARS.issuperset(value):
        shown = value[:40] + ("…" if len(value) > 40 else "")
        raise RequestError(
            422, "invalid_input", f"{field} must be {ID_RULE} (got {len(value)} characters: {shown!r})", field=field
        )
    return value


def tenant_identifier(value: Any) -> str:
    """A caller's ``tenant_id``: the tenant-id alphabet of keel.names (no '.', '/' or ':'), the one policies use —
    422 ``invalid_input`` naming the field otherwise."""
    tenant = identifier(value, "tenant_id")
    if not is_tenant_id(tenant):
        shown = tenant[:40] + ("…" if len(tenant) > 40 else "")
        raise RequestError(
            422, "invalid_input", f"tenant_id must be {TENANT_ID_RULE} (got {shown!r})", field="tenant_id"
        )
    return tenant


def decode_headers(raw: list[tuple[bytes, bytes]]) -> dict[str, str]:
    """The request's headers as text; bytes that are not UTF-8 are the caller's error (400 ``bad_header``)."""
    out = {}
    for k, v in raw:
        try:
            out[k.decode("ascii").lower()] = v.decode("utf-8")
        except UnicodeDecodeError:
            name = k.decode("ascii", "replace").lower()
            raise RequestError(400, "bad_header", f"header {name!r} is not valid UTF-8", header=name) from None
    return out


class BodyTooLarge(Exception):
    def __init__(self, limit: int):
        super().__init__(limit)
        self.limit = limit


async def read_body(
    receive: Any, limit: int, declared: str | None = None, timeout_s: float = BODY_TIMEOUT_S
) -> bytes:
    """The whole request body, or BodyTooLarge as soon as it is known to exceed ``limit`` bytes (from the declared
    content-length, else while reading: the rest is never buffered). A body that is not complete within
    ``timeout_s`` (a client that stopped sending: shorter than its content-length, a chunked body with no last
    chunk) is 408 ``body_timeout``; a client that went away mid-body is 400 ``incomplete_body``."""
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge(limit)
    chunks, size = [], 0
    try:
        async with asyncio.timeout(timeout_s):
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    raise RequestError(400, "incomplete_body", "the client closed the connection mid-body")
                chunk = message.get("body", b"")
                size += len(chunk)
                if size > limit:
                    raise BodyTooLarge(limit)
                chunks.append(chunk)
                if not message.get("more_body"):
                    return b"".join(chunks)
    except TimeoutError:
        raise RequestError(
            408, "body_timeout", f"the request body did not arrive within {timeout_s:g} s ({size:,} bytes came)",
            timeout_s=timeout_s,
        ) from None  # fmt: skip


K = TypeVar("K")
V = TypeVar("V")


class BoundedLRU(Generic[K, V]):
    """A dict of at most ``capacity`` entries; the least recently used one goes first."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self._items: OrderedDict[K, V] = OrderedDict()

    def get_or_create(self, key: K, create: Callable[[], V]) -> V:
        item = self._items.get(key)
        if item is None:
            item = self._items[key] = create()
            if len(self._items) > self.capacity:
                self._items.popitem(last=False)
        else:
            self._items.move_to_end(key)
        return item

    def clear(self) -> None:
        self._items.clear()

    def __len__(self) -> int:
        return len(self._items)


def parse_json(body: bytes) -> dict[str, Any]:
    try:
        req = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise RequestError(400, "bad_json", f"the body is not JSON: {exc}") from None
    if not isinstance(req, dict):
        raise RequestError(400, "bad_json", "the body must be a JSON object")
    return req


async def respond(send: Any, status: int, payload: dict[str, Any], headers: dict[str, str] | None = None) -> None:
    data = orjson.dumps(payload, option=orjson.OPT_SERIALIZE_NUMPY)
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    raw += [(k.encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": data})


async def respond_text(send: Any, status: int, text: str, content_type: str) -> None:
    data = text.encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", content_type.encode()), (b"content-length", str(len(data)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": data})
