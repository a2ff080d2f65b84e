"""A drift report's per-feature summary, as drift_report's metadata carries it (shared by the policy and sensor
tests)."""


def feat(drifted, severity="none", value=0.1, mean=1.0) -> dict:
    return {
        "drifted": drifted,
        "severity": severity,
        "value": value,
        "threshold": 0.15,
        "metric": "wasserstein_norm",
        "reference_mean": mean,
    }
