"""Alerts for a contract breached by a partition (keel.alerts: routed by severity)."""

import os

from keel.alerts import Alert, AlertConfigError, AlertSender
from keel.contracts.engine import ValidationReport
from keel.contracts.spec import ContractSpec
from keel.home import KeelHome


def breach_alerts(spec: ContractSpec, report: ValidationReport, complete: bool = True) -> list[tuple[Alert, str]]:
    """The contract's breaches in one partition, as alerts by the rule's severity (warning and critical rules whose
    failures exceed their allowance, and a critical budget exceeded), each with its one-time key (contract, rule,
    partition, contract hash: a month rebuilt for each new delivery alerts once; an edited contract, again).

    ``complete=False`` (a live month, partly delivered): an allowance is a share of the whole partition, so only a
    rule allowed no failure at all breaches yet — three readings of the hour that repeats when the clocks go back
    are 0.14 % of November but 1.1 % of its first three days."""
    if report.dry_run:
        return []
    where = report.partition or "all rows"
    out = []
    for r in report.rules:
        if r.severity == "info" or r.within_threshold or (not complete and r.max_failure_fraction > 0):
            continue
        share = 1 - r.pass_rate
        out.append((
            Alert("contract_breach", r.severity,
                  f"contract {spec.name} v{spec.version}, {where}: rule {r.id} failed on {r.failed:,} "
                  f"row{'s' if r.failed != 1 else ''} "
                  f"({share:.2%}, allowed {r.max_failure_fraction:.2%}): {r.reason}",
                  {"contract": spec.name, "rule": r.id, "partition": report.partition, "action": r.action},
                  source=f"validate_{spec.name}"),
            f"contract:{spec.name}:{r.id}:{report.partition}:{spec.content_hash[:12]}",
        ))  # fmt: skip
    if report.budget_exceeded and complete:
        out.append((
            Alert("contract_breach", "critical",
                  f"contract {spec.name} v{spec.version}, {where}: {report.critical_failed_fraction:.2%} of rows "
                  f"break a critical rule (budget {report.budget_text}): nothing downstream runs",
                  {"contract": spec.name, "rule": "critical_budget", "partition": report.partition},
                  source=f"validate_{spec.name}"),
            f"contract:{spec.name}:critical_budget:{report.partition}:{spec.content_hash[:12]}",
        ))  # fmt: skip
    return out


def send_breach_alerts(spec: ContractSpec, report: ValidationReport, log, complete: bool = True) -> None:
    """Send the partition's breach alerts through the KEEL_HOME's alert routes (keel.alerts); only where a KEEL_HOME
    is set (the platform's runs), and never failing the validation: a configuration problem is logged."""
    alerts = breach_alerts(spec, report, complete)
    if not alerts or not os.environ.get("KEEL_HOME"):
        return
    try:
        sender = AlertSender.for_home(KeelHome.from_env())
    except AlertConfigError as exc:
        log.error(f"contract breach alerts not sent: {exc}")
        return
    for alert, key in alerts:
        sender.send(alert, once=key)
