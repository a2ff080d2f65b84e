"""What the main job says about the year as it goes (scripts/materialize.py prints it): one line per run — what it
made, its failed checks —, the releases and the loop's canary decisions as they happen (``Follower``), a use case's
live span in a few lines at its end, why requests failed, and when the clock waits for the pipeline."""

from __future__ import annotations

import time

import dagster as dg
from dagster._core.events import DagsterEventType

from assets.usecase import wiring
from keel.usecase import UseCase

TERMINAL = {dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED}


def _metric_line(md, metrics: tuple[str, ...], prefix: str = "") -> str:
    """``AUC 0.712, LOG_LOSS 0.431`` for the use case's metrics a materialization's metadata holds."""
    shown = []
    for m in metrics:
        v = md.get(f"{prefix}{m}")
        if v is not None and v.value is not None:
            shown.append(f"{m.upper()} {v.value:.3f}")
    return ", ".join(shown)


def summary(instance: dg.DagsterInstance, run_id: str, uc: UseCase) -> tuple[str, list[str]]:
    """One line of what the run made (rows, drift verdict, the model's metrics, the live release) and its failed
    checks."""
    parts, failed = [], []
    events = instance.all_logs(
        run_id, of_type={DagsterEventType.ASSET_MATERIALIZATION, DagsterEventType.ASSET_CHECK_EVALUATION}
    )
    for entry in events:
        check = entry.asset_check_evaluation
        if check is not None:
            if not check.passed:
                sev = "warn" if check.severity == dg.AssetCheckSeverity.WARN else "error"
                failed.append(f"{check.asset_key.to_user_string()}:{check.check_name} ({sev})")
            continue
        mat = entry.asset_materialization
        md, key = mat.metadata, mat.asset_key.path[-1]  # the asset's name within its use case
        if "rows_in" in md:
            parts.append(
                f"{key} {md['rows_in'].value:,}→{md['valid'].value:,} valid/{md['quarantined'].value:,} quarantined"
            )
        elif "verdict" in md:
            parts.append(f"drift: {md['verdict'].value} ({md['drifted_features'].value})")
        elif key == uc.feature_table and "dagster/row_count" in md:
            parts.append(f"features {md['dagster/row_count'].value:,} rows")
        elif key == "model_evaluation":
            parts.append(_metric_line(md, uc.metrics))
        elif key == "model_deployment":
            parts.append(f"live: {md['release_id'].value} at {md['gateway'].value}")
        elif key == "challenger_model":
            parts.append(f"challenger v{md['version'].value} fitted on {md['fitted_on'].value}")
        elif key == "challenger_evaluation":
            verdict = "passed" if md["passed"].value else "not passed"
            parts.append(f"gate on {md['gate_month'].value} {verdict}: {md['reason'].value}")
        elif key == "loop_report":
            head = uc.metrics[0]  # the headline metric (AUC, RMSE)
            value = {n: md.get(f"{n}_{head}") for n in ("served", "static", "naive")}
            parts.append(f"{head.upper()} " + ", ".join(
                f"{n} {v.value:.3f}" if v is not None and v.value is not None else f"{n} –" for n, v in value.items()
            ))  # fmt: skip
    return "; ".join(parts), failed


def why_requests_failed(traffic: dict) -> str:
    """One line on a live span's failed requests: how many of how many, by error code and status, and the share the
    coarse fallback answered (the gateway's or the machine's trouble reads differently from a model's)."""
    answered = traffic.get("answered") or 0
    errors = sorted((traffic.get("by_error") or {}).items(), key=lambda kv: -kv[1])
    statuses = sorted((k, v) for k, v in (traffic.get("by_status") or {}).items() if k != "200")
    coarse = (traffic.get("by_degraded") or {}).get("coarse_fallback", 0)
    parts = [f"{traffic['failed']:,} of {answered:,} requests failed"]
    if errors:
        parts.append("by error: " + ", ".join(f"{code} {n:,}" for code, n in errors[:6]))
    if statuses:
        parts.append("by status: " + ", ".join(f"{'client timeout/transport' if k == '0' else k} {n:,}"
                                              for k, n in statuses))  # fmt: skip
    if coarse:
        parts.append(f"{coarse:,} answers came from the coarse fallback")
    return "; ".join(parts)


class Follower:
    """What happened since the last look: runs the sensors launched (finished), releases, canary decisions — of every
    use case played, each line naming its use case."""

    def __init__(self, instance: dg.DagsterInstance, home, ucs: list[UseCase]) -> None:
        self.instance, self.home, self.ucs = instance, home, ucs
        self.printed_runs: set[str] = set()
        self.ledger_seq = 0
        self.policy_version = 0

    def usecase_of(self, run) -> UseCase | None:
        """The use case a run is of: its job's name (``<use case>_…``) or its assets' prefix (``<use case>/…``)."""
        keys = {k.path[0] for k in run.asset_selection or ()}
        for uc in self.ucs:
            if run.job_name.startswith(f"{uc.name}_") or uc.name in keys:
                return uc
        return None

    def print_new(self) -> None:
        from keel.ledger import Ledger
        from keel.policies import PolicyStore

        for run in reversed(self.instance.get_runs(limit=50)):
            if run.run_id in self.printed_runs or run.status not in TERMINAL or "dagster/sensor_name" not in run.tags:
                continue
            self.printed_runs.add(run.run_id)
            uc = self.usecase_of(run)
            made, failed = summary(self.instance, run.run_id, uc) if uc else ("", [])
            what = (
                run.tags.get("dagster/partition")
                or run.tags.get("keel/metered_days")
                or run.tags.get("keel/canary_action")
                or ""
            )
            sim = run.tags.get("keel/sim_now", "")[:16]
            state = "ok" if run.status == dg.DagsterRunStatus.SUCCESS else run.status.value
            job = run.job_name  # a sensor's asset selection runs as an anonymous job: name its assets instead
            if job.startswith("__") and run.asset_selection:
                job = ", ".join(sorted(k.to_user_string() for k in run.asset_selection))
            print(f"  {sim or '':16} {job} {what} {state}  {made}", flush=True)
        if self.home.ledger.exists():
            with Ledger(self.home.ledger) as ledger:
                for entry in ledger.log()[self.ledger_seq :]:
                    parts = entry.manifest.get("model", {}).get("parts", {})
                    model = parts.get("sha256", "")[:12]
                    print(f"  {entry.live_from:%Y-%m-%d %H:%M} release {entry.release_id} live ({parts.get('asset')}"
                          f" {model})", flush=True)  # fmt: skip
                    self.ledger_seq = entry.seq
        if self.home.policies.exists():
            with PolicyStore(self.home.policies) as store:
                for version in range(self.policy_version + 1, store.version() + 1):
                    commit = store.commit(version)
                    if commit.author in ("loop", "canary-controller"):
                        names = ", ".join(sorted(commit.changes)) or "canary"  # e.g. room-rate.loop-v3
                        print(f"  {names}: {_reason_line(commit.reason)}", flush=True)
                    self.policy_version = version

    def traffic_line(self, uc: UseCase) -> str:
        path = self.home.serving.live_traffic(uc.name)
        if not path.exists():
            return "traffic: starting"
        import json

        t = json.loads(path.read_text())
        return f"traffic: {t['ok']:,} ok, {t['failed']:,} failed, {t['achieved_rps'] or 0:g} req/s"

    def summary(self, uc: UseCase) -> str:
        """A use case's live span in a few lines: traffic, the loop's canaries, loop_report's means over the live
        months."""
        from keel.policies import PolicyStore

        lines = [f"keel: {uc.name}: live span done; {self.traffic_line(uc)}"]
        if self.home.policies.exists():
            with PolicyStore(self.home.policies) as store:
                for name, p in sorted(store.state().items()):
                    if p.type == "canary" and name.startswith(f"{uc.model.name}.loop-"):
                        status = (p.body.get("state") or {}).get("status", "not started")
                        origin = p.body.get("origin") or {}
                        lines.append(f"  canary {name}: {status} (drift in {origin.get('drift_window')})")
        records = self.instance.fetch_materializations(wiring(uc).key("loop_report"), limit=100).records
        latest: dict[str, dict] = {}
        for r in records:  # newest first: keep each month's latest report
            latest.setdefault(r.asset_materialization.partition, r.asset_materialization.metadata)
        # the first live month is served by the first model alone (no challenger yet): the means start after it
        first_live = uc.months[len(uc.history_months)]
        months = [m for m in sorted(latest) if m > first_live]
        if months:
            metrics = uc.metrics
            lines.append(f"  loop_report, mean over {months[0]}…{months[-1]} ({', '.join(metrics)}):")
            for name in ("served", "static", "naive", "expanding"):
                means = []
                for metric in metrics:
                    values = [latest[m][f"{name}_{metric}"].value for m in months if f"{name}_{metric}" in latest[m]]
                    values = [v for v in values if v is not None]
                    means.append(f"{metric} {sum(values) / len(values):.4f}" if values else f"{metric} –")
                lines.append(f"    {name:<9} " + "  ".join(means))
            delays = [(m, latest[m]["promotion_delay_days"].value) for m in sorted(latest)
                      if latest[m].get("promotion_delay_days") is not None
                      and latest[m]["promotion_delay_days"].value is not None]  # fmt: skip
            if delays:
                shown = ", ".join(f"{m} {d:.1f}" for m, d in delays)
                lines.append(f"  promotions, days from the end of the drift month that caused them: {shown}")
        return "\n".join(lines)


def _reason_line(reason: str) -> str:
    import json

    try:
        d = json.loads(reason)
    except ValueError:
        return reason[:160]
    return f"{d.get('action')} at {d.get('percent')} %: {'; '.join(d.get('reasons', []))[:140]}"


def pipeline_hold(clock, held_at: float | None, queued: int, ucs) -> float | None:
    """Hold the ``SimClock`` (returns when it was held) or let it run again (returns None), and say so."""
    from datetime import UTC, datetime

    if held_at is None:
        state = clock.pause()
        when = ", ".join(f"{uc.name} {state.of(uc.name).now(datetime.now(UTC)):%Y-%m-%d %H:%M}" for uc in ucs)
        print(f"keel: the clock waits for the pipeline ({queued} runs queued) at {when}", flush=True)
        return time.monotonic()
    clock.resume()
    print(f"keel: the pipeline caught up: the clock runs again after {time.monotonic() - held_at:.0f} s", flush=True)
    return None
