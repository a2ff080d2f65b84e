"""Stacked bars as SVG, embedded in Dagster markdown metadata (no plotting library needed): one bar per group
(a tenant, or a day), its segments by a second key (model version, or tenant)."""

from __future__ import annotations

from html import escape

PALETTE = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7", "#9c755f")


OTHER = "other"  # a segment of that name is drawn grey, last (the rest of a top-k)


def stacked_bars_svg(
    title: str,
    bars: dict[str, dict[str, float]],
    unit: str,
    width: int = 640,
    order: list[str] | None = None,
    totals: bool = True,
) -> str:
    """``bars``: bar label → {segment label → amount}. Segment colours are shared across bars, with a legend;
    ``order``: the segments' order (default: by name, ``other`` last); ``totals``: print each bar's sum."""
    present = {s for parts in bars.values() for s in parts}
    segments = [s for s in order if s in present and s != OTHER] if order else []
    segments += sorted(present - set(segments) - {OTHER}) + ([OTHER] if OTHER in present else [])
    colour = {s: PALETTE[i % len(PALETTE)] for i, s in enumerate(segments)} | {OTHER: "#bab0ac"}
    row, left, right = 22, 150, 110
    legend_h = 18 * ((len(segments) + 3) // 4)
    height = 30 + row * max(len(bars), 1) + legend_h + 10
    biggest = max((sum(p.values()) for p in bars.values()), default=0.0) or 1.0
    scale = (width - left - right) / biggest
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
        f'font-size="12"><text x="4" y="14" font-weight="bold">{escape(title)}</text>'
    ]
    for i, (label, parts) in enumerate(bars.items()):
        y, x = 24 + i * row, float(left)
        out.append(f'<text x="{left - 6}" y="{y + 13}" text-anchor="end">{escape(label)}</text>')
        for seg in segments:
            w = parts.get(seg, 0.0) * scale
            if w > 0:
                out.append(
                    f'<rect x="{x:.1f}" y="{y + 2}" width="{max(w, 0.5):.1f}" height="{row - 6}" '
                    f'fill="{colour[seg]}"><title>{escape(seg)}: {parts[seg]:.4f} {escape(unit)}</title></rect>'
                )
                x += w
        if totals:
            out.append(f'<text x="{x + 4:.1f}" y="{y + 13}">{sum(parts.values()):.4f} {escape(unit)}</text>')
    y0 = 30 + row * max(len(bars), 1)
    for j, seg in enumerate(segments):
        lx, ly = 4 + (j % 4) * (width // 4), y0 + 18 * (j // 4)
        out.append(f'<rect x="{lx}" y="{ly}" width="12" height="12" fill="{colour[seg]}"/>')
        out.append(f'<text x="{lx + 16}" y="{ly + 11}">{escape(seg)}</text>')
    out.append("</svg>")
    return "".join(out)


def svg_markdown(svg: str) -> str:
    """The SVG as a markdown image (a data URL), as Dagster's metadata renders it."""
    import base64

    return f"![plot](data:image/svg+xml;base64,{base64.b64encode(svg.encode()).decode()})"
