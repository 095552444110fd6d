"""The HTML report: self-contained, with every chart and table, and readable when rendered."""

from __future__ import annotations

import os
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

from harness.polling import scaled
from mqbalance.pipeline import report, synthetic
from mqbalance.pipeline.replay import replay
from mqbalance.pipeline.scoring import Weights, summaries, totals

CHARTS = ("chart-moves", "chart-imbalance", "chart-zones", "chart-recommended")


class Outline(HTMLParser):
    """Elements by id, bars and markers per chart, and anything that would load from elsewhere."""

    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()
        self.bars: dict[str, int] = {}
        self.markers: dict[str, int] = {}
        self.external: list[str] = []
        self.scripts = 0
        self.table_rows: dict[str, int] = {}
        self._svg: str | None = None
        self._table: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if a.get("id"):
            self.ids.add(a["id"] or "")
        if tag == "svg" and a.get("class") == "chart":
            self._svg = a["id"]
        if tag == "table":
            self._table = a.get("id")
        if tag == "tr" and self._table:
            self.table_rows[self._table] = self.table_rows.get(self._table, 0) + 1
        if self._svg and tag == "rect" and a.get("class") == "bar":
            self.bars[self._svg] = self.bars.get(self._svg, 0) + 1
        if self._svg and tag == "line" and a.get("class") == "marker":
            self.markers[self._svg] = self.markers.get(self._svg, 0) + 1
        if tag == "script":
            self.scripts += 1
        for key in ("src", "href"):
            if a.get(key):
                self.external.append(a[key] or "")

    def handle_endtag(self, tag: str) -> None:
        if tag == "svg":
            self._svg = None
        if tag == "table":
            self._table = None


def report_data() -> report.ReportData:
    churn = synthetic.Churn(groups=12, events_per_group=15, seed=4)
    t = totals(replay(synthetic.events(churn)))
    s = summaries(t, Weights())
    return report.ReportData(
        source="synthetic <test>",
        groups=len(s),
        events=sum(g.events for g in s),
        skipped_lines=3,
        invalid_lines=1,
        invalid_example="operator.log: journal line is not JSON",
        weights=Weights(),
        strategies=report.overview(t, s),
        top_groups=report.top_groups(s),
    )


def test_the_report_has_every_chart_and_table_and_loads_nothing() -> None:
    data = report_data()
    outline = Outline()
    outline.feed(report.render(data))
    strategies = len(data.strategies)
    assert strategies == 6
    for chart in CHARTS:
        assert outline.bars.get(chart) == strategies, chart
    assert outline.markers.get("chart-moves") == strategies
    assert {"moves", "imbalance", "zones", "recommendations", "gainers"} <= outline.ids
    assert outline.table_rows["table-strategies"] == strategies + 1
    assert outline.table_rows["table-gainers"] == len(data.top_groups) + 1
    assert data.top_groups, "AVG groups should gain by switching"
    assert outline.external == []
    assert outline.scripts == 0


def test_text_is_escaped_and_notes_are_shown() -> None:
    page = report.render(report_data())
    assert "synthetic &lt;test&gt;" in page
    assert "3 other log lines skipped" in page
    assert "1 journal lines could not be read" in page


def test_no_gainers_says_so() -> None:
    data = report_data()
    page = report.render(report.ReportData(**{**data.__dict__, "top_groups": []}))
    assert "No group would gain by switching" in page


def test_the_gainers_are_the_groups_with_the_largest_gain() -> None:
    data = report_data()
    gains = [g.gain for g in data.top_groups]
    assert gains == sorted(gains, reverse=True)
    assert all(g > 0 for g in gains)


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def test_the_report_renders_in_a_headless_browser(tmp_path: Path) -> None:
    browser = chromium()
    if browser is None:
        # `make test` installs Debian's chromium (hack/install-browser.sh): in CI a missing
        # browser is a failure, not a skip.
        assert not os.environ.get("CI"), "no chromium installed: run hack/install-browser.sh"
        pytest.skip("no chromium (hack/install-browser.sh); the parse test above still checks the report")
    page = tmp_path / "report.html"
    page.write_text(report.render(report_data()), encoding="utf-8")
    png = Path(os.environ.get("MQBALANCE_REPORT_PNG", tmp_path / "report.png"))
    subprocess.run(
        [
            browser,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            # Nothing but the local file: no update checks, sync, or other calls home.
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-quic",
            f"--user-data-dir={tmp_path / 'profile'}",
            f"--screenshot={png}",
            "--window-size=1000,2200",
            page.as_uri(),
        ],
        check=True,
        capture_output=True,
        timeout=scaled(120),
    )
    data = png.read_bytes()
    assert data.startswith(b"\x89PNG")
    # A blank page compresses to almost nothing; charts and tables do not.
    assert len(data) > 50_000
