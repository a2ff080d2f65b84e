"""Alerts: what the platform decided or found, sent where a person will see it — routed by severity.

An ``Alert`` (kind, severity, summary, details) is routed by ``route(alert, config)`` (pure): the design articles'
default is critical → page, warning → chat, info → mail; each channel names where it goes — a webhook in
Alertmanager's JSON (``/api/v2/alerts``) or Slack's (``{"text": …}``), or only the log. ``AlertSender.send`` always
appends the alert, its route and what delivery did to ``$KEEL_HOME/alerts/alerts.jsonl`` (the default sink: with no
configuration nothing leaves the machine), then POSTs to the channel's webhook when there is one. A delivery that
fails is recorded, never raised: an alert must not stop the sensor that raised it.

Configuration (``$KEEL_HOME/alerts.yaml``, or the file ``KEEL_ALERTS_CONFIG`` names)::

    routes:                 # severity → channel (these are the defaults)
      critical: page
      warning: chat
      info: mail
    channels:
      page: {format: alertmanager, url: "http://127.0.0.1:9093/api/v2/alerts"}
      chat: {format: slack, url_env: KEEL_SLACK_WEBHOOK}   # a secret URL comes from the environment
      mail: {format: log}                                  # only the JSONL file

A webhook URL must be http(s); ``url_env`` names an environment variable holding it (secrets never sit in files).
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from keel.errors import KeelError

SEVERITIES = ("critical", "warning", "info")
FORMATS = ("alertmanager", "slack", "log")
DEFAULT_ROUTES = {"critical": "page", "warning": "chat", "info": "mail"}
TIMEOUT_S = 5.0


class AlertConfigError(KeelError):
    """An alert configuration that cannot be used: names the file and the entry."""


@dataclass(frozen=True)
class Alert:
    kind: str  # e.g. drift_freeze, canary_rollback, contract_breach, incident
    severity: str  # critical | warning | info
    summary: str
    details: dict[str, Any] = field(default_factory=dict)
    source: str = "keel"  # the sensor or asset that raised it
    at: str = ""  # ISO 8601; set when sent if empty

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"alert severity must be one of {', '.join(SEVERITIES)}, got {self.severity!r}")


@dataclass(frozen=True)
class Channel:
    name: str
    format: str = "log"
    url: str | None = None
    url_env: str | None = None

    def target(self) -> str | None:
        """The webhook URL (from the environment when ``url_env`` is set), or None: log only."""
        url = os.environ.get(self.url_env) if self.url_env else self.url
        return url or None


@dataclass(frozen=True)
class AlertConfig:
    routes: dict[str, str]
    channels: dict[str, Channel]

    @classmethod
    def default(cls) -> AlertConfig:
        return cls(dict(DEFAULT_ROUTES), {name: Channel(name) for name in set(DEFAULT_ROUTES.values())})

    @classmethod
    def load(cls, path: Path) -> AlertConfig:
        """The configuration at ``path``; the defaults when there is no file."""
        if not path.exists():
            return cls.default()
        try:
            raw = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as exc:
            raise AlertConfigError(f"{path}: not YAML ({exc})") from None
        if not isinstance(raw, dict):
            raise AlertConfigError(f"{path}: expected a mapping with routes and channels")
        routes = dict(DEFAULT_ROUTES) | dict(raw.get("routes") or {})
        for severity in routes:
            if severity not in SEVERITIES:
                raise AlertConfigError(f"{path}: routes.{severity}: not a severity ({', '.join(SEVERITIES)})")
        channels = {name: Channel(name) for name in set(DEFAULT_ROUTES.values())}  # log-only unless configured
        for name, spec in (raw.get("channels") or {}).items():
            if not isinstance(spec, dict):
                raise AlertConfigError(f"{path}: channels.{name}: expected a mapping")
            unknown = set(spec) - {"format", "url", "url_env"}
            if unknown:
                raise AlertConfigError(f"{path}: channels.{name}: unknown keys {sorted(unknown)}")
            fmt = spec.get("format", "log")
            if fmt not in FORMATS:
                raise AlertConfigError(f"{path}: channels.{name}.format: one of {', '.join(FORMATS)}, got {fmt!r}")
            url = spec.get("url")
            if url is not None and not str(url).startswith(("http://", "https://")):
                raise AlertConfigError(f"{path}: channels.{name}.url: an http(s) URL, got {url!r}")
            channels[name] = Channel(name, fmt, url, spec.get("url_env"))
        missing = sorted(set(routes.values()) - set(channels))
        if missing:
            raise AlertConfigError(f"{path}: routes name channels that are not defined: {missing}")
        return cls(routes, channels)


def route(alert: Alert, config: AlertConfig) -> Channel:
    """The channel an alert goes to: by its severity."""
    return config.channels[config.routes[alert.severity]]


def payload(alert: Alert, channel: Channel) -> Any:
    """The webhook body in the channel's format."""
    if channel.format == "alertmanager":
        return [
            {
                "labels": {
                    "alertname": alert.kind,
                    "severity": alert.severity,
                    "channel": channel.name,
                    "source": alert.source,
                },
                "annotations": {"summary": alert.summary, "details": json.dumps(alert.details, default=str)},
                "startsAt": alert.at,
            }
        ]
    if channel.format == "slack":
        heads = alert.details.get("witness") or {}
        witness = f" (witness: {', '.join(f'{k} {v}' for k, v in sorted(heads.items()))})" if heads else ""
        return {"text": f"[{alert.severity}] {alert.kind}: {alert.summary}{witness}"}
    return None


class AlertSender:
    """Sends alerts by ``config`` and keeps every one in ``log_path`` (JSONL, appended)."""

    def __init__(self, log_path: Path, config: AlertConfig | None = None, witness=None):
        self.log_path = Path(log_path)
        self.config = config or AlertConfig.default()
        # () -> {chain: "SEQ:HASH"}: the control plane's published heads, carried by every alert off this machine —
        # a witness a rollback of every local file cannot reach (`keel policy verify --head`, docs/policy.md)
        self.witness = witness

    @classmethod
    def for_home(cls, home) -> AlertSender:
        """The sender of a KEEL_HOME: its configuration (``KEEL_ALERTS_CONFIG`` or ``alerts.yaml``) and log."""
        from keel.chain import published_heads

        config_path = Path(os.environ.get("KEEL_ALERTS_CONFIG") or Path(home.root) / "alerts.yaml")
        return cls(
            Path(home.root) / "alerts" / "alerts.jsonl", AlertConfig.load(config_path), lambda: published_heads(home)
        )

    def _heads(self) -> dict[str, str]:
        if self.witness is None:
            return {}
        try:
            return self.witness()
        except Exception:  # noqa: BLE001 - an unreadable head must not stop the alert that carries it
            return {}

    def sent_once(self, key: str) -> bool:
        """Whether an alert sent with ``once=key`` is in the log already."""
        return any(r.get("once") == key for r in read_alerts(self.log_path))

    def send(self, alert: Alert, once: str | None = None) -> dict[str, Any] | None:
        """Send ``alert`` by its route and log it. ``once``: a key that makes it a one-time alert — when an alert with
        that key is in the log already, nothing is sent (a month rebuilt for each delivery breaks its rule once)."""
        if once is not None and self.sent_once(once):
            return None
        if not alert.at:
            alert = Alert(**(asdict(alert) | {"at": datetime.now(UTC).isoformat(timespec="seconds")}))
        heads = self._heads()
        if heads:
            alert = Alert(**(asdict(alert) | {"details": alert.details | {"witness": heads}}))
        channel = route(alert, self.config)
        record: dict[str, Any] = {**asdict(alert), "channel": channel.name, "format": channel.format}
        if once is not None:
            record["once"] = once
        url = channel.target()
        body = payload(alert, channel)
        if url and body is not None:
            try:
                request = urllib.request.Request(
                    url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST"
                )
                with urllib.request.urlopen(request, timeout=TIMEOUT_S) as resp:  # noqa: S310 - http(s) checked
                    record["delivered"] = 200 <= resp.status < 300
                    record["status"] = resp.status
            except (urllib.error.URLError, OSError, ValueError) as exc:
                record["delivered"] = False
                record["error"] = f"{type(exc).__name__}: {exc}"
        else:
            record["delivered"] = None  # log only
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "a") as fh:
            fh.write(json.dumps(record, default=str) + "\n")
        return record


def read_alerts(log_path: Path) -> list[dict[str, Any]]:
    """Every alert kept in ``log_path`` (a torn last line is skipped)."""
    if not Path(log_path).exists():
        return []
    out = []
    for line in Path(log_path).read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out
