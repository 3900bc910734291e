"""The panel's charts: tokens/s, KV use and each request's TTFT and queue time over the last minutes.

They draw :class:`EngineHistory` only while on screen (when shown again they catch up from it), so a hidden
chart costs nothing and loses nothing.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from PySide6.QtCharts import QCategoryAxis, QChart, QChartView, QLegend, QLineSeries, QScatterSeries, QXYSeries
from PySide6.QtCore import QEvent, QMargins, QPointF, Qt
from PySide6.QtGui import QColor, QFont, QFontMetricsF, QPainter, QPalette, QPen
from PySide6.QtWidgets import QVBoxLayout, QWidget

from ..theme import SERIES
from .history import MIN_SPAN_S, RATE_SERIES, EngineHistory


@dataclass(frozen=True, slots=True)
class Line:
    """One series of a chart: the history's key, its legend name, its colour, and for points their shape, so
    that two series of one chart tell apart without colour."""

    key: str
    name: str
    color: str
    square: bool = False


@dataclass(frozen=True, slots=True)
class ChartSpec:
    """A chart: its title, the value axis' unit and range rule, and its series (points if ``scatter``)."""

    title: str
    unit: str
    lines: tuple[Line, ...]
    floor: float  # the value axis reaches at least this high, so a quiet engine is not drawn as noise
    cap: float | None = None
    scatter: bool = False


CHARTS = (
    ChartSpec("Decode", RATE_SERIES["decode"].unit, (Line("decode", "decode", SERIES["decode"]),), floor=10.0),
    ChartSpec(RATE_SERIES["token_gap"].name, RATE_SERIES["token_gap"].unit,
              (Line("token_gap", "p99", SERIES["token_gap"]),), floor=50.0),
    ChartSpec("Prefill", RATE_SERIES["prefill"].unit, (Line("prefill", "prefill", SERIES["prefill"]),), floor=100.0),
    ChartSpec("KV cache in use", RATE_SERIES["kv_usage"].unit, (Line("kv_usage", "in use", SERIES["kv_usage"]),),
              floor=10.0, cap=100.0),
    ChartSpec("TTFT and queue time, per request", "ms",
              (Line("ttft", "TTFT", SERIES["ttft"]), Line("queue", "queue", SERIES["queue"], square=True)),
              floor=100.0, scatter=True),
)



def time_ticks(span_s: float) -> tuple[str, list[tuple[float, str]]]:
    """The time axis' title and its labels at their positions (seconds before now, as negative values)."""
    if span_s <= MIN_SPAN_S:
        step, unit, title = 15, 1, "seconds ago"
    else:
        step, unit, title = (60 if span_s <= 300 else 120), 60, "minutes ago"
    ticks = [(-float(t), f"{t // unit}") for t in range(int(span_s), 0, -step)]
    return title, ticks + [(0.0, "now")]


# A plot is a few hundred pixels wide: more points cost time and show nothing more. Not a divisor of the
# 1,200 samples of a full history, so its thinning step stays put as the sample count wobbles around that.
MAX_LINE_POINTS = 250
WIDEST_LABEL = "12.5k"  # value labels are at most this wide: the left margin makes up the rest


def thinned(history: EngineHistory, key: str, most: int = MAX_LINE_POINTS) -> list[tuple[float, float]]:
    """At most about ``most`` of a series' points, for a line: every k-th by the order they were recorded (so
    the same ones stay as the window slides and the line does not shimmer), and always the latest."""
    points = history.points[key]
    step = -(-len(points) // most) if points else 1
    if step <= 1:
        return list(points)
    first = history.appended[key] - len(points)  # the recorded index of points[0]
    kept = list(itertools.islice(points, (-first) % step, None, step))
    if not kept or kept[-1] is not points[-1]:
        kept.append(points[-1])
    return kept


def axis_labels(top: float) -> list[tuple[float, str]]:
    """The value axis' labels at 0, half and ``top``, in thousands ("k") all of them once ``top`` reaches
    10,000: "0 / 500 / 1000", "0 / 5k / 10k"."""
    values = (0.0, top / 2, top)
    if top >= 10_000:
        return [(v, f"{v / 1000:g}k" if v else "0") for v in values]
    return [(v, f"{v:g}") for v in values]


def _margins(extra_left: int) -> QMargins:
    """The chart's margins: on the right, room for "now" under the edge."""
    return QMargins(2 + extra_left, 2, 16, 2)


def _set_ticks(axis: QCategoryAxis, ticks: list[tuple[float, str]], low: float, high: float) -> None:
    """Replace ``axis``' labels with ``ticks`` (value, label) and show ``low`` to ``high``."""
    for label in axis.categoriesLabels():
        axis.remove(label)
    axis.setStartValue(low)
    for value, label in ticks:
        axis.append(label, value)
    axis.setRange(low, high)


class TimeChart(QChartView):
    """One :class:`ChartSpec` drawn from the history: a value axis with its unit, a time axis ending now."""

    def __init__(self, spec: ChartSpec, parent=None) -> None:
        super().__init__(parent)
        self.spec = spec
        self.setRenderHint(QPainter.Antialiasing)
        self.setMinimumHeight(150 if len(spec.lines) > 1 else 130)  # a legend takes a line
        chart = QChart()
        chart.setTitle(spec.title)
        chart.setMargins(_margins(0))
        self.setAccessibleName(f"{spec.title} chart")
        chart.layout().setContentsMargins(0, 0, 0, 0)
        chart.setBackgroundRoundness(0)
        chart.setBackgroundVisible(False)
        self.setChart(chart)
        self.value_axis = QCategoryAxis()  # labels of our own, so their width is known (see _pad_left)
        self.value_axis.setLabelsPosition(QCategoryAxis.AxisLabelsPosition.AxisLabelsPositionOnValue)
        self.value_axis.setTitleText(spec.unit)
        self._ceiling: float | None = None
        self.time_axis = QCategoryAxis()
        self.time_axis.setLabelsPosition(QCategoryAxis.AxisLabelsPosition.AxisLabelsPositionOnValue)
        chart.addAxis(self.value_axis, Qt.AlignLeft)
        chart.addAxis(self.time_axis, Qt.AlignBottom)
        self.series: dict[str, QXYSeries] = {}
        for line in spec.lines:
            self.series[line.key] = self._add_series(chart, line)
        chart.legend().setVisible(len(spec.lines) > 1)
        chart.legend().setAlignment(Qt.AlignTop)
        chart.legend().setMarkerShape(QLegend.MarkerShapeFromSeries)  # a circle and a square, as plotted
        self._time_span: float | None = None
        self._style()
        self._set_ceiling(spec.floor)  # axes before the first snapshot, so an empty chart still reads
        self._set_time_span(MIN_SPAN_S)
        self.setAccessibleDescription("no data yet")

    def _add_series(self, chart: QChart, line: Line) -> QXYSeries:
        series = QScatterSeries() if self.spec.scatter else QLineSeries()
        series.setName(line.name)
        color = QColor(line.color)
        if self.spec.scatter:
            shape = QScatterSeries.MarkerShapeRectangle if line.square else QScatterSeries.MarkerShapeCircle
            series.setMarkerShape(shape)
            series.setMarkerSize(7.0)
            series.setColor(color)
            series.setBorderColor(color)
        else:
            series.setPen(QPen(color, 1.8))
        chart.addSeries(series)
        series.attachAxis(self.value_axis)
        series.attachAxis(self.time_axis)
        return series

    def redraw(self, history: EngineHistory) -> None:
        """Show the history up to its latest snapshot ("now"): points in seconds before it, axes fitted to them."""
        now = history.latest or 0.0
        for key, series in self.series.items():
            points = history.points[key] if self.spec.scatter else thinned(history, key)
            series.replace([QPointF(t - now, v) for t, v in points])
        self._set_ceiling(history.ceiling(self.series, self.spec.floor, self.spec.cap))
        self._set_time_span(history.span())
        self.setAccessibleDescription(self._in_words(history))

    def _in_words(self, history: EngineHistory) -> str:
        """What the chart shows, for a screen reader: each series' latest and highest value."""
        parts = []
        for line in self.spec.lines:
            values = history.values(line.key)
            if values:
                parts.append(f"{line.name}: latest {values[-1]:,.4g} {self.spec.unit}, "
                             f"highest {max(values):,.4g}")
        return "; ".join(parts) or "no data yet"

    def _set_ceiling(self, top: float) -> None:
        if top == self._ceiling:
            return
        self._ceiling = top
        labels = axis_labels(top)
        _set_ticks(self.value_axis, labels, 0.0, top)
        self._pad_left(labels)

    def _pad_left(self, labels: list[tuple[float, str]]) -> None:
        """A left margin that makes up for narrower value labels, so that every chart's plot starts at one x."""
        metrics = QFontMetricsF(self.value_axis.labelsFont())
        widest = max(metrics.horizontalAdvance(text) for _, text in labels)
        self.chart().setMargins(_margins(round(metrics.horizontalAdvance(WIDEST_LABEL) - widest)))

    def _set_time_span(self, span: float) -> None:
        if span == self._time_span:
            return
        self._time_span = span
        title, ticks = time_ticks(span)
        self.time_axis.setTitleText(title)
        _set_ticks(self.time_axis, ticks, -span, 0.0)

    def points_ago(self, key: str) -> list[tuple[float, float]]:
        """The drawn points of series ``key`` as (seconds before the latest snapshot, value)."""
        return [(p.x(), p.y()) for p in self.series[key].points()]

    def changeEvent(self, event) -> None:
        if event.type() in (QEvent.PaletteChange, QEvent.ApplicationPaletteChange):
            self._style()
        super().changeEvent(event)

    def _style(self) -> None:
        """Text and grid in the palette's colours, so the charts read in the dark theme too."""
        palette = self.palette()
        text, grid = palette.color(QPalette.WindowText), palette.color(QPalette.Mid)
        small = QFont(self.font())
        small.setPointSizeF(max(6.5, small.pointSizeF() * 0.8))
        chart = self.chart()
        chart.setTitleBrush(text)
        chart.legend().setLabelColor(text)
        chart.legend().setFont(small)
        for axis in (self.value_axis, self.time_axis):
            axis.setLabelsColor(text)
            axis.setTitleBrush(text)
            axis.setLabelsFont(small)
            axis.setTitleFont(small)
            axis.setGridLineColor(grid)
            axis.setLinePenColor(grid)
        self.setBackgroundBrush(palette.color(QPalette.Window))


class EngineCharts(QWidget):
    """Every chart of :data:`CHARTS`, one under the other."""

    def __init__(self, history: EngineHistory, parent=None) -> None:
        super().__init__(parent)
        self.history = history
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        self.charts = [TimeChart(spec) for spec in CHARTS]
        for chart in self.charts:
            layout.addWidget(chart, 4 + len(chart.spec.lines))  # a legend takes a line of its own

    def refresh(self) -> None:
        """Draw the history now if the charts are on screen; otherwise they catch up when shown."""
        if self.isVisible():
            for chart in self.charts:
                chart.redraw(self.history)

    def showEvent(self, event) -> None:
        super().showEvent(event)
        self.refresh()

    def chart(self, title: str) -> TimeChart:
        return next(c for c in self.charts if c.spec.title == title)
