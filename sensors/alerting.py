"""The sensors' alerts (keel.alerts): each decision a sensor carries out is also sent by severity route. A broken
alert configuration is a problem the sensor reports (automation_problems), never a reason to skip the action."""

from __future__ import annotations

from keel.alerts import Alert, AlertConfigError, AlertSender


def send_alerts(home, alerts: list[Alert], problems: list[str]) -> None:
    if not alerts:
        return
    try:
        sender = AlertSender.for_home(home)
    except AlertConfigError as exc:
        problems.append(f"alerts not sent: {exc}")
        return
    for a in alerts:
        sender.send(a)
