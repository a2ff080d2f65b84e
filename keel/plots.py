"""Charts as SVG, embedded in Dagster markdown metadata (no plotting library needed): stacked bars (one bar per group
— a tenant, or a day — its segments by a second key), and lines over a calendar with markers (the year at a glance:
a metric per month and model, the releases and rollbacks on the months they happened)."""

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


def lines_svg(
    title: str,
    xs: list[str],
    series: dict[str, list[float | None]],
    markers: list[tuple[str, str]] = (),
    width: int = 640,
    height: int = 260,
) -> str:
    """``series``: line label → one value per ``xs`` label (None: no point there); ``markers``: (x label, text)
    drawn as a dashed vertical line at that x with the text above it (several on one x stack). A legend below."""
    values = [v for vs in series.values() for v in vs if v is not None]
    lo, hi = (min(values), max(values)) if values else (0.0, 1.0)
    if hi - lo < 1e-9:
        lo, hi = lo - 0.5, hi + 0.5
    pad = (hi - lo) * 0.1
    lo, hi = lo - pad, hi + pad
    left, right, top, bottom = 56, 16, 44, 48
    plot_w, plot_h = width - left - right, height - top - bottom
    step = plot_w / max(len(xs) - 1, 1)

    def px(i: int) -> float:
        return left + i * step if len(xs) > 1 else left + plot_w / 2

    def py(v: float) -> float:
        return top + plot_h * (1 - (v - lo) / (hi - lo))

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
        f'font-size="11"><text x="4" y="14" font-weight="bold" font-size="12">{escape(title)}</text>',
        f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#ccc"/>',
    ]
    for v in (lo + pad, (lo + hi) / 2, hi - pad):
        out.append(f'<text x="{left - 4}" y="{py(v) + 4:.1f}" text-anchor="end">{v:.3f}</text>')
    for i, x in enumerate(xs):
        out.append(f'<text x="{px(i):.1f}" y="{top + plot_h + 14}" text-anchor="middle">{escape(x)}</text>')
    stacked: dict[str, int] = {}
    for x, text in markers:
        if x not in xs:
            continue
        i, k = xs.index(x), stacked.get(x, 0)
        stacked[x] = k + 1
        out.append(f'<line x1="{px(i):.1f}" y1="{top}" x2="{px(i):.1f}" y2="{top + plot_h}" stroke="#888" '
                   f'stroke-dasharray="3,3"><title>{escape(text)}</title></line>')  # fmt: skip
        out.append(f'<text x="{px(i) + 3:.1f}" y="{top - 4 - 11 * k}" fill="#555">{escape(text)}</text>')
    for j, (name, vs) in enumerate(series.items()):
        colour = PALETTE[j % len(PALETTE)]
        points = [(px(i), py(v)) for i, v in enumerate(vs) if v is not None]
        if len(points) > 1:
            path = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
            out.append(f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="2"/>')
        for (x, y), v in zip(points, [v for v in vs if v is not None], strict=True):
            out.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="{colour}"><title>{escape(name)}: {v:.4f}'
                       "</title></circle>")  # fmt: skip
        lx = 4 + (j % 5) * (width // 5)
        out.append(f'<rect x="{lx}" y="{height - 16}" width="12" height="3" fill="{colour}"/>')
        out.append(f'<text x="{lx + 16}" y="{height - 12}">{escape(name)}</text>')
    out.append("</svg>")
    return "".join(out)


def svg_markdown(svg: str) -> str:
    """The SVG as a markdown image (a data URL), as Dagster's metadata renders it."""
    import base64

    return f"![plot](data:image/svg+xml;base64,{base64.b64encode(svg.encode()).decode()})"
