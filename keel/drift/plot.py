"""A bar chart of a drift report as SVG, embedded in Dagster markdown metadata (no plotting library needed)."""

from __future__ import annotations

import base64
import math

from keel.drift.report import DriftReport


def drift_svg(report: DriftReport, width: int = 640) -> str:
    feats = [f for f in report.features if f.value is not None]
    feats.sort(key=lambda f: -(f.value / f.threshold if f.threshold else 0))
    row, left, right = 22, 170, 150
    height = row * len(feats) + 40
    ratios = [min(f.value / f.threshold, 10.0) if f.threshold and not math.isinf(f.value) else 10.0 for f in feats]
    scale = (width - left - right) / max(max(ratios, default=1.0), 1.5)
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="12">',
        f'<text x="4" y="14" font-weight="bold">{report.window} vs {report.reference_window}: distance ÷ threshold</text>',
    ]
    x1 = left + scale
    parts.append(
        f'<line x1="{x1:.1f}" y1="20" x2="{x1:.1f}" y2="{height - 4}" stroke="#c00" stroke-dasharray="4 3"/>'
    )
    for i, (f, r) in enumerate(zip(feats, ratios, strict=True)):
        y = 26 + i * row
        color = "#d9534f" if f.severity == "error" else "#f0ad4e" if f.drifted else "#5cb85c"
        parts.append(f'<text x="{left - 6}" y="{y + 13}" text-anchor="end">{f.feature}</text>')
        parts.append(
            f'<rect x="{left}" y="{y + 2}" width="{max(r * scale, 1):.1f}" height="{row - 6}" fill="{color}"/>'
        )
        # the label says what the bar shows — distance ÷ threshold — and then the distance and its threshold
        if math.isinf(f.value) or not f.threshold:
            label = "∞"
        else:
            label = f"{f.value / f.threshold:.2f}× ({f.value:.2f} of {f.threshold:g})"
        parts.append(f'<text x="{left + max(r * scale, 1) + 4:.1f}" y="{y + 13}">{label}</text>')
    parts.append("</svg>")
    return "".join(parts)


def drift_svg_markdown(report: DriftReport) -> str:
    data = base64.b64encode(drift_svg(report).encode()).decode()
    return f"![drift](data:image/svg+xml;base64,{data})"
