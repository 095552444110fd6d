"""The replay report: figures per strategy and the groups that would gain most, as one HTML file.

Charts are inline SVG drawn here, so the file opens anywhere without network
access or scripts.
"""

from __future__ import annotations

import html
import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from importlib import resources
from string import Template
from typing import Any, NamedTuple

from mqbalance.pipeline.replay import CANDIDATE_LABELS
from mqbalance.pipeline.scoring import GroupSummary, StrategyTotals, Weights

TOP_GROUPS = 20


class StrategyOverview(NamedTuple):
    """One strategy's figures over every replayed group."""

    strategy: str
    groups: int
    events: int
    moved: int
    forced: int
    minimum_moves: int
    spread_sum: int
    excess_spread: int
    max_spread: int
    cross_zone: int
    held: int
    recommended: int
    """Groups for which this strategy is the recommendation."""
    load_spread_sum: float = 0.0
    """Sum over events of the busiest member's rate over the mean's (0 at events without rates)."""
    max_load_spread: float = 0.0

    @property
    def mean_load_spread(self) -> float:
        """Mean ``load_spread`` over the events (0 where no event carried rates)."""
        return self.load_spread_sum / self.events if self.events else 0.0

    @property
    def move_ratio(self) -> float | None:
        return self.moved / self.minimum_moves if self.minimum_moves else None

    @property
    def mean_spread(self) -> float:
        return self.spread_sum / self.events if self.events else 0.0

    @property
    def cross_zone_share(self) -> float:
        return self.cross_zone / self.held if self.held else 0.0


def strategy_order(label: str) -> tuple[int, str]:
    return (CANDIDATE_LABELS.index(label) if label in CANDIDATE_LABELS else len(CANDIDATE_LABELS), label)


@dataclass(frozen=True)
class ReportData:
    source: str
    groups: int
    events: int
    skipped_lines: int
    invalid_lines: int
    weights: Weights
    strategies: list[StrategyOverview]
    top_groups: list[GroupSummary]
    invalid_example: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "groups": self.groups,
            "events": self.events,
            "skippedLines": self.skipped_lines,
            "invalidLines": self.invalid_lines,
            "invalidExample": self.invalid_example,
            "weights": asdict(self.weights),
            "strategies": [
                {
                    **s._asdict(),
                    "move_ratio": s.move_ratio,
                    "mean_spread": s.mean_spread,
                    "cross_zone_share": s.cross_zone_share,
                    "mean_load_spread": s.mean_load_spread,
                }
                for s in self.strategies
            ],
            "topGroups": [g._asdict() for g in self.top_groups],
            **self.extra,
        }


def overview(totals: Iterable[StrategyTotals], summaries: Sequence[GroupSummary]) -> list[StrategyOverview]:
    """Per-strategy sums over groups (the single-process twin of the Spark aggregation)."""
    by_strategy: dict[str, list[StrategyTotals]] = {}
    for t in totals:
        by_strategy.setdefault(t.strategy, []).append(t)
    recommended: dict[str, int] = {}
    for g in summaries:
        recommended[g.recommended] = recommended.get(g.recommended, 0) + 1
    return [
        StrategyOverview(
            strategy=label,
            groups=len(ts),
            events=sum(t.events for t in ts),
            moved=sum(t.moved for t in ts),
            forced=sum(t.forced for t in ts),
            minimum_moves=sum(t.minimum_moves for t in ts),
            spread_sum=sum(t.spread_sum for t in ts),
            excess_spread=sum(t.excess_spread for t in ts),
            max_spread=max(t.max_spread for t in ts),
            cross_zone=sum(t.cross_zone for t in ts),
            held=sum(t.held for t in ts),
            recommended=recommended.get(label, 0),
            load_spread_sum=math.fsum(t.load_spread_sum for t in ts),
            max_load_spread=max(t.max_load_spread for t in ts),
        )
        for label, ts in sorted(by_strategy.items(), key=lambda item: strategy_order(item[0]))
    ]


def top_groups(summaries: Iterable[GroupSummary], limit: int = TOP_GROUPS) -> list[GroupSummary]:
    """Groups that would gain most by switching, best first (only those with a gain)."""
    gaining = [g for g in summaries if g.gain > 0]
    return sorted(gaining, key=lambda g: (-g.gain, g.namespace, g.group))[:limit]


# --- SVG -----------------------------------------------------------------------------

PALETTE = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f")
LABEL_WIDTH = 210
BAR_HEIGHT = 22
CHART_WIDTH = 860
VALUE_WIDTH = 170
"""Room right of the longest bar for its value."""


class Bar(NamedTuple):
    label: str
    value: float
    text: str
    marker: float | None = None
    """A second value drawn as a tick over the bar (e.g. the minimum)."""


def bar_chart(chart_id: str, title: str, bars: Sequence[Bar], *, marker_name: str = "") -> str:
    """A horizontal bar chart as an inline SVG element."""
    top = 30
    height = top + len(bars) * (BAR_HEIGHT + 8) + (26 if marker_name else 8)
    plot = CHART_WIDTH - LABEL_WIDTH - VALUE_WIDTH
    peak = max([b.value for b in bars] + [b.marker or 0 for b in bars] + [1e-12])
    parts = [
        f'<svg id="{chart_id}" class="chart" role="img" aria-label="{html.escape(title)}" '
        f'xmlns="http://www.w3.org/2000/svg" width="{CHART_WIDTH}" height="{height}" '
        f'viewBox="0 0 {CHART_WIDTH} {height}">',
        f'<text x="0" y="18" class="title">{html.escape(title)}</text>',
    ]
    for i, b in enumerate(bars):
        y = top + i * (BAR_HEIGHT + 8)
        width = max(b.value / peak * plot, 0.0)
        colour = PALETTE[i % len(PALETTE)]
        baseline = f"{y + BAR_HEIGHT * 0.7:.1f}"
        parts.append(
            f'<text x="{LABEL_WIDTH - 8}" y="{baseline}" text-anchor="end">{html.escape(b.label)}</text>'
        )
        parts.append(
            f'<rect class="bar" x="{LABEL_WIDTH}" y="{y}" width="{width:.1f}" height="{BAR_HEIGHT}" '
            f'fill="{colour}">'
            f"<title>{html.escape(b.label)}: {html.escape(b.text)}</title></rect>"
        )
        parts.append(f'<text x="{LABEL_WIDTH + width + 6:.1f}" y="{baseline}">{html.escape(b.text)}</text>')
        if b.marker is not None:
            x = LABEL_WIDTH + b.marker / peak * plot
            parts.append(
                f'<line class="marker" x1="{x:.1f}" x2="{x:.1f}" y1="{y - 3}" y2="{y + BAR_HEIGHT + 3}" '
                'stroke="#222" stroke-width="3"/>'
            )
    if marker_name:
        y = height - 10
        parts.append(
            f'<line x1="{LABEL_WIDTH}" x2="{LABEL_WIDTH + 14}" y1="{y - 4}" y2="{y - 4}" '
            'stroke="#222" stroke-width="3"/>'
        )
        parts.append(f'<text x="{LABEL_WIDTH + 20}" y="{y}">{html.escape(marker_name)}</text>')
    parts.append("</svg>")
    return "\n".join(parts)


def _fmt(value: float | None, digits: int = 2) -> str:
    return "–" if value is None else f"{value:,.{digits}f}"


def charts(data: ReportData) -> dict[str, str]:
    s = data.strategies
    return {
        "moves": bar_chart(
            "chart-moves",
            "Queue moves over the whole history (tick: the fewest any balanced assignment allows)",
            [
                Bar(o.strategy, o.moved, f"{o.moved:,} ({_fmt(o.move_ratio)}× min)", o.minimum_moves)
                for o in s
            ],
            marker_name="minimum moves",
        ),
        "imbalance": bar_chart(
            "chart-imbalance",
            "Imbalance: mean max−min queues per consumer (1 or less is balanced)",
            [Bar(o.strategy, o.mean_spread, f"{o.mean_spread:.2f} (worst {o.max_spread})") for o in s],
        ),
        "zones": bar_chart(
            "chart-zones",
            "Zone locality: share of queue holdings outside the broker's zone",
            [Bar(o.strategy, o.cross_zone_share, f"{o.cross_zone_share:.1%}") for o in s],
        ),
        "recommended": bar_chart(
            "chart-recommended",
            "Groups for which each strategy is recommended",
            [Bar(o.strategy, o.recommended, f"{o.recommended:,}") for o in s],
        ),
    }


def _strategy_table(data: ReportData) -> str:
    head = (
        "<tr><th>strategy</th><th>events</th><th>moved</th><th>forced</th><th>minimum</th><th>× min</th>"
        "<th>mean spread</th><th>cross-zone</th><th>recommended for</th></tr>"
    )
    rows = [
        f"<tr><td>{html.escape(o.strategy)}</td><td>{o.events:,}</td><td>{o.moved:,}</td><td>{o.forced:,}</td>"
        f"<td>{o.minimum_moves:,}</td><td>{_fmt(o.move_ratio)}</td><td>{o.mean_spread:.2f}</td>"
        f"<td>{o.cross_zone_share:.1%}</td><td>{o.recommended:,}</td></tr>"
        for o in data.strategies
    ]
    return f'<table id="table-strategies">{head}{"".join(rows)}</table>'


def _gainers(data: ReportData) -> str:
    if not data.top_groups:
        return (
            '<p id="table-gainers" class="note">'
            "No group would gain by switching: each already runs its best strategy.</p>"
        )
    peak = max(g.gain for g in data.top_groups)
    head = (
        "<tr><th>group</th><th>events</th><th>runs</th><th>recommended</th><th></th><th>gain</th>"
        "<th>moves saved</th><th>cross-zone saved</th></tr>"
    )
    rows = []
    for g in data.top_groups:
        width = g.gain / peak * 120
        bar = (
            '<svg class="spark" width="124" height="12">'
            f'<rect x="0" y="1" width="{width:.1f}" height="10" fill="#59a14f"/></svg>'
        )
        rows.append(
            f"<tr><td>{html.escape(g.namespace)}/{html.escape(g.group)}</td><td>{g.events:,}</td>"
            f"<td>{html.escape(g.current)}</td><td>{html.escape(g.recommended)}</td>"
            f'<td class="bar">{bar}</td>'
            f"<td>{g.gain:,.1f}</td><td>{g.moves_saved:,}</td><td>{g.cross_zone_saved:,}</td></tr>"
        )
    return f'<table id="table-gainers">{head}{"".join(rows)}</table>'


def render(data: ReportData) -> str:
    """The whole report as one self-contained HTML document."""
    template = Template(
        resources.files("mqbalance.pipeline").joinpath("report.html").read_text(encoding="utf-8")
    )
    c = charts(data)
    notes = []
    if data.skipped_lines:
        notes.append(f"{data.skipped_lines:,} other log lines skipped.")
    if data.invalid_lines:
        notes.append(
            f"{data.invalid_lines:,} journal lines could not be read, "
            f"e.g.: {html.escape(data.invalid_example)}"
        )
    return template.substitute(
        source=html.escape(data.source),
        groups=f"{data.groups:,}",
        events=f"{data.events:,}",
        strategies=len(data.strategies),
        spread_weight=data.weights.spread,
        zone_weight=data.weights.zone,
        unassigned_weight=data.weights.unassigned,
        notes="".join(f'<p class="note">{n}</p>' for n in notes),
        chart_moves=c["moves"],
        chart_imbalance=c["imbalance"],
        chart_zones=c["zones"],
        chart_recommended=c["recommended"],
        strategy_table=_strategy_table(data),
        gainers=_gainers(data),
    )
