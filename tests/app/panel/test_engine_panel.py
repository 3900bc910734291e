"""The live panel on scripted snapshots: charts fed from the history (also while hidden), axes that follow the
data, queue time and errors, the GPU rows, the pool's legend and colours, the request list, and its layout at
the default and a narrow size."""

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QColor

from app.panel.charts import axis_labels, time_ticks
from app.panel.engine_panel import CPU_THREADS, GAP, TTFT, EnginePanel
from app.panel.formatting import device_text, gpu_load_text, gpu_memory_text, ms_text
from app.panel.history import EngineHistory
from app.panel.kv_blocks import COLORS, CONVERSATION_COLORS, LEGEND, CellSwatch, conversation_color
from app.panel.request_table import COLUMNS, RequestRow, RequestTableModel
from engine import CpuUsage, FirstToken, GpuUsage, RequestSnapshot
from engine.serving.gpu_usage import NO_NVML
from tests.helpers.fake_engine import fake_stats


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def panel(qtbot, clock):
    panel = EnginePanel(EngineHistory(clock=clock))
    qtbot.addWidget(panel)
    panel.resize(300, 760)
    panel.show()
    qtbot.waitExposed(panel)
    return panel


def show_charts(qtbot, panel):
    panel.tabs.setCurrentWidget(panel.tabs.widget(1))
    qtbot.waitUntil(panel.charts.isVisible)


def points(chart, key):
    return chart.points_ago(key)


def feed(panel, clock, snapshots, step=0.25):
    for stats in snapshots:
        panel.update_stats(stats)
        clock.now += step


def test_the_charts_get_each_snapshots_values_placed_in_seconds_before_now(qtbot, panel, clock):
    show_charts(qtbot, panel)
    feed(panel, clock, [fake_stats(decode_tokens_per_s=d, prefill_tokens_per_s=p, kv_usage=u)
                        for d, p, u in [(10.0, 900.0, 0.1), (22.5, 0.0, 0.125), (31.0, 40.0, 0.5)]])
    charts = panel.charts
    assert points(charts.chart("Decode"), "decode") == [(-0.5, 10.0), (-0.25, 22.5), (0.0, 31.0)]
    assert points(charts.chart("Prefill"), "prefill") == [(-0.5, 900.0), (-0.25, 0.0), (0.0, 40.0)]
    assert points(charts.chart("KV cache in use"), "kv_usage") == [(-0.5, 10.0), (-0.25, 12.5), (0.0, 50.0)]


def test_the_per_request_chart_gets_each_first_token_once(qtbot, panel, clock):
    show_charts(qtbot, panel)
    first = FirstToken(1, 0.120, 0.004)
    second = FirstToken(2, 0.480, 0.250)
    feed(panel, clock, [fake_stats(first_tokens=(first,)), fake_stats(first_tokens=(first,)),
                        fake_stats(first_tokens=(first, second))])
    chart = panel.charts.chart("TTFT and queue time, per request")
    assert points(chart, "ttft") == [(-0.5, 120.0), (0.0, 480.0)]
    assert points(chart, "queue") == [(-0.5, 4.0), (0.0, 250.0)]
    assert chart.value_axis.max() == 500.0  # the slowest TTFT fits


def test_axis_ranges_follow_the_data(qtbot, panel, clock):
    show_charts(qtbot, panel)
    decode = panel.charts.chart("Decode")
    feed(panel, clock, [fake_stats(decode_tokens_per_s=4.0)])
    assert (decode.value_axis.min(), decode.value_axis.max()) == (0.0, 10.0)
    assert decode.value_axis.categoriesLabels() == ["0", "5", "10"]
    feed(panel, clock, [fake_stats(decode_tokens_per_s=142.7)])
    assert decode.value_axis.max() == 200.0 and decode.value_axis.categoriesLabels() == ["0", "100", "200"]
    assert (decode.time_axis.min(), decode.time_axis.max()) == (-60.0, 0.0)
    assert decode.time_axis.titleText() == "seconds ago" and decode.time_axis.categoriesLabels()[-1] == "now"
    feed(panel, clock, [fake_stats(decode_tokens_per_s=5.0)] * 4, step=100.0)  # five minutes and more
    assert (decode.time_axis.min(), decode.time_axis.max()) == (-300.0, 0.0)
    assert decode.time_axis.titleText() == "minutes ago"
    assert decode.time_axis.categoriesLabels() == ["5", "4", "3", "2", "1", "now"]
    usage = panel.charts.chart("KV cache in use")
    feed(panel, clock, [fake_stats(kv_usage=1.0)])
    assert usage.value_axis.max() == 100.0 and usage.value_axis.titleText() == "%"


def test_before_the_first_snapshot_the_charts_have_their_axes(qtbot, panel):
    show_charts(qtbot, panel)
    decode = panel.charts.chart("Decode")
    assert decode.value_axis.categoriesLabels() == ["0", "5", "10"] and decode.value_axis.titleText() == "tok/s"
    assert decode.time_axis.categoriesLabels() == ["60", "45", "30", "15", "now"]
    assert decode.accessibleDescription() == "no data yet"


def test_time_ticks_and_axis_numbers():
    assert time_ticks(60) == ("seconds ago", [(-60.0, "60"), (-45.0, "45"), (-30.0, "30"), (-15.0, "15"),
                                              (0.0, "now")])
    assert time_ticks(120) == ("minutes ago", [(-120.0, "2"), (-60.0, "1"), (0.0, "now")])
    assert [text for _, text in axis_labels(2.5)] == ["0", "1.25", "2.5"]
    assert [text for _, text in axis_labels(5000.0)] == ["0", "2500", "5000"]
    assert [text for _, text in axis_labels(10_000.0)] == ["0", "5k", "10k"]
    assert [text for _, text in axis_labels(25_000.0)] == ["0", "12.5k", "25k"]


def test_the_history_records_while_the_charts_are_hidden_and_they_catch_up_when_shown(qtbot, panel, clock):
    decode = panel.charts.chart("Decode")
    assert not panel.charts.isVisible()  # the "Now" tab is in front
    feed(panel, clock, [fake_stats(decode_tokens_per_s=float(v)) for v in (5, 6, 7)])
    assert decode.series["decode"].count() == 0  # nothing drawn off screen
    show_charts(qtbot, panel)
    assert [y for _, y in points(decode, "decode")] == [5.0, 6.0, 7.0]


def test_the_window_records_while_the_panel_is_hidden(qtbot, window):
    window.model_bar.panel_button.setChecked(False)
    assert not window.panel.isVisible()
    for rate in (11.0, 12.0, 13.0):
        window.bridge.stats_updated.emit(fake_stats(decode_tokens_per_s=rate))
    assert window.panel.history.values("decode") == [11.0, 12.0, 13.0]
    assert window.panel.labels["Decode"].text() == "–"  # the hidden panel drew nothing
    window.panel.tabs.setCurrentIndex(1)
    window.model_bar.panel_button.setChecked(True)
    qtbot.waitUntil(window.panel.charts.isVisible)
    assert [y for _, y in points(window.panel.charts.chart("Decode"), "decode")] == [11.0, 12.0, 13.0]
    window.bridge.stats_updated.emit(fake_stats(decode_tokens_per_s=14.0))
    assert window.panel.labels["Decode"].text() == "14.0 tok/s"
    assert window.panel.charts.chart("Decode").series["decode"].count() == 4


def test_queue_time_and_errors_are_shown(panel):
    requests = (RequestSnapshot("r1", True, 40, 32, 7, 0.0123, 21.5, 5, 3, ttft_s=0.061),)
    panel.update_stats(fake_stats(queue_time_p50_s=0.0031, num_errors_total=3, requests=requests))
    assert panel.labels["Queue (median)"].text() == "3 ms"
    assert panel.labels["Errors"].text() == "3 since start"
    model = panel.requests
    queue = [c.title for c in COLUMNS].index("Queue")
    assert model.index(1, queue).data() == "12 ms"
    panel.update_stats(fake_stats(queue_time_p50_s=None, num_errors_total=0))
    assert panel.labels["Queue (median)"].text() == "–" and panel.labels["Errors"].text() == "none since start"


def test_the_gap_between_tokens_is_shown_and_charted(panel):
    panel.update_stats(fake_stats(inter_token_p99_s=0.0421, inter_token_max_s=0.1204))
    assert panel.labels[GAP].text() == "42 / 120 ms"
    assert panel.history.values("token_gap") == [pytest.approx(42.1)]
    panel.update_stats(fake_stats())
    assert panel.labels[GAP].text() == "–"


def test_ttft_comes_from_every_request_and_a_stale_snapshot_does_not_undo_a_live_one(panel, clock):
    panel.update_stats(fake_stats(first_tokens=(FirstToken(1, 0.100, 0.0), FirstToken(2, 0.300, 0.0))))
    assert panel.labels[TTFT].text() == "300 / 200 ms"  # e.g. a request from outside the window
    clock.now += 0.25
    panel.record_ttft(0.050)  # a chat's first token, the moment it arrives
    assert panel.labels[TTFT].text() == "50 / 100 ms"
    panel.update_stats(fake_stats(first_tokens=(FirstToken(1, 0.100, 0.0), FirstToken(2, 0.300, 0.0))))
    assert panel.labels[TTFT].text() == "50 / 100 ms"  # a snapshot taken before that token keeps it
    clock.now += 0.25
    tokens = (FirstToken(1, 0.100, 0.0), FirstToken(2, 0.300, 0.0), FirstToken(3, 0.050, 0.0))
    panel.update_stats(fake_stats(first_tokens=tokens))
    assert panel.labels[TTFT].text() == "50 / 100 ms"


def cuda_stats(**gpu):
    usage = dict(memory_used_bytes=30 << 30, memory_total_bytes=80 << 30, memory_reserved_bytes=12 << 30,
                 utilization_percent=87)
    usage.update(gpu)
    return fake_stats(device="cuda:0", device_reason="CUDA GPU: NVIDIA H200", gpu=GpuUsage(**usage))


def test_gpu_rows_are_hidden_on_the_cpu_and_shown_with_values_on_cuda(panel):
    panel.update_stats(fake_stats(device="cpu", device_reason="torch was built without CUDA"))
    assert not panel.gpu_rows_shown() and not panel.labels["GPU memory"].isVisible()
    assert panel.labels["Device"].text() == "CPU — torch was built without CUDA"
    panel.update_stats(cuda_stats())
    assert panel.gpu_rows_shown() and panel.labels["GPU memory"].isVisible()
    assert panel.labels["Device"].text() == "cuda:0 — CUDA GPU: NVIDIA H200"
    assert panel.labels["GPU memory"].text() == "30.0 GiB of 80.0 GiB in use (12.0 GiB held by Kvasir)"
    assert panel.labels["GPU load"].text() == "87% busy"
    panel.update_stats(cuda_stats(utilization_percent=None, utilization_note=NO_NVML))
    assert panel.labels["GPU load"].text() == "not available: needs nvidia-ml-py (NVML)"
    panel.update_stats(fake_stats())  # switched to the CPU
    assert not panel.gpu_rows_shown()


def test_the_cpu_threads_row_says_how_many_and_why_and_is_hidden_on_a_gpu(panel):
    def cpu(**values):
        usage = dict(threads=2, cores=2, threads_fixed=False, others_cores=0.02, contention_seen_s_ago=None)
        return CpuUsage(**{**usage, **values})

    panel.update_stats(fake_stats(cpu=cpu()))
    label = panel.labels[CPU_THREADS]
    assert label.text() == "2 of 2" and panel._forms[CPU_THREADS].isRowVisible(label)
    panel.update_stats(fake_stats(cpu=cpu(threads=1, others_cores=1.0, contention_seen_s_ago=0.4)))
    assert label.text() == "1 of 2, others busy now"
    panel.update_stats(fake_stats(cpu=cpu(threads_fixed=True, contention_seen_s_ago=12.2, lower_priority=True,
                                          note="the engine keeps its lower priority until Kvasir restarts")))
    assert label.text() == "2 of 2 (fixed), others busy 12 s ago, lower priority"
    assert "until Kvasir restarts" in label.toolTip()
    panel.update_stats(fake_stats(cpu=cpu(contention_seen_s_ago=600.0)))
    assert label.text() == "2 of 2"  # long ago: no longer worth a word
    panel.update_stats(cuda_stats())
    assert not panel._forms[CPU_THREADS].isRowVisible(label)


def test_panel_formatting():
    assert [ms_text(s) for s in (None, 0.0004, 0.0031, 0.25, 9.9994, 12.49)] == [
        "–", "<1 ms", "3 ms", "250 ms", "9,999 ms", "12.5 s"]
    gpu = GpuUsage(1536 << 20, 24 << 30, 1 << 30, None, "")
    assert gpu_memory_text(gpu) == "1.5 GiB of 24.0 GiB in use (1.0 GiB held by Kvasir)"
    assert gpu_load_text(gpu) == "not available"
    assert device_text(fake_stats(device="cpu", device_reason="")) == "CPU"


def test_the_legend_names_every_kind_and_draws_its_pattern(qtbot, panel):
    assert panel.legend.texts == ["a chat's own (its colour)", "shared (dot)", "cached (hatched)", "free (bar only)"]
    swatches = {s.kind: s for s in panel.legend.findChildren(CellSwatch)}
    assert set(swatches) == {kind for kind, *_ in LEGEND}

    def colours(kind):
        image = swatches[kind].grab().toImage()
        return {image.pixelColor(x, y).name() for x in range(image.width() - 1) for y in range(image.height() - 1)}

    white = QColor("white").name()
    assert colours("chat") == {CONVERSATION_COLORS[0]}  # colour alone...
    assert {COLORS["shared"].name(), white} <= colours("shared")  # ...a dot...
    assert {COLORS["cached"].name(), white} <= colours("cached")  # ...hatching: they read without colour


def test_a_requests_colour_is_the_same_in_the_list_and_the_pool(panel):
    requests = (RequestSnapshot("r1", True, 40, 32, 7, 0.002, 21.5, 5, 3),
                RequestSnapshot("r2", True, 90, 0, 2, 0.001, 12.0, 8, 8),
                RequestSnapshot("api-1", False, 30, 0, 0, None, None, 0, 0))
    panel.update_stats(fake_stats(requests=requests), {"r1": (7, "Trip planning"), "r2": (8, "Bread")})
    chats = [segment for segment in panel.pool.segments if segment[2] == "chat"]
    assert [(n, c.name()) for n, c, _ in chats] == [(3, conversation_color(7)), (8, conversation_color(8))]
    assert conversation_color(7) != conversation_color(8)
    model = panel.requests
    assert [model.index(r, 0).data() for r in (0, 2, 4)] == ["Trip planning", "Bread", "api-1"]
    assert [model.request_at(r).color for r in (0, 2, 4)] == [conversation_color(7), conversation_color(8),
                                                                conversation_color(None)]
    swatch = model.index(0, 0).data(Qt.DecorationRole).toImage()
    assert swatch.pixelColor(5, 5).name() == conversation_color(7)
    assert [model.index(1, c).data() for c in range(len(COLUMNS))] == ["3", "21.5", "–", "2 ms"]
    assert [model.index(5, c).data() for c in range(len(COLUMNS))] == ["0", "queued", "–", "–"]
    assert panel.request_view.columnSpan(0, 0) == len(COLUMNS)  # a title row spans the table
    assert panel.request_view.isVisible() and not panel.no_requests.isVisible()
    panel.update_stats(fake_stats())
    assert not panel.request_view.isVisible() and panel.no_requests.isVisible()


def test_no_chat_colour_is_one_of_the_pools_own_colours():
    reserved = {COLORS[k].name() for k in COLORS} | {conversation_color(None)}
    assert not reserved & set(CONVERSATION_COLORS)
    assert len(set(CONVERSATION_COLORS)) == len(CONVERSATION_COLORS)


def rows(*ids):
    return [RequestRow(RequestSnapshot(i, True, 10, 0, 3, 0.001, 9.0, 1, 1), f"chat {i}", "#3a7bd5") for i in ids]


def test_request_table_model_passes_the_model_tester(qtmodeltester):
    model = RequestTableModel()
    model.set_rows(rows("a", "b"))
    qtmodeltester.check(model)
    assert model.rowCount() == 4 and model.columnCount() == len(COLUMNS)
    assert model.headerData(2, Qt.Horizontal) == "TTFT"


def test_the_same_requests_update_in_place_and_new_ones_reset(qtbot):
    model = RequestTableModel()
    model.set_rows(rows("a", "b"))
    with qtbot.waitSignal(model.dataChanged), qtbot.assertNotEmitted(model.modelReset):
        model.set_rows(rows("a", "b"))
    with qtbot.waitSignal(model.modelReset):
        model.set_rows(rows("a", "c"))
    assert model.index(2, 0).data() == "chat c"


@pytest.mark.parametrize("size", [(300, 760), (270, 520)])
def test_the_panel_stays_readable_at_the_default_and_a_narrow_size(qtbot, panel, clock, size):
    panel.resize(*size)
    requests = tuple(RequestSnapshot(f"r{i}", True, 40, 0, 5, 0.002, 20.0, 4, 4, ttft_s=0.2) for i in range(6))
    gpu = GpuUsage(30 << 30, 80 << 30, 12 << 30, None, NO_NVML)
    feed(panel, clock, [fake_stats(requests=requests, device="cuda:0", gpu=gpu,
                                   first_tokens=(FirstToken(1, 2.5, 0.1),))] * 8, step=10.0)
    qtbot.waitUntil(lambda: panel.tabs.widget(0).widget().width() <= size[0])
    page = panel.tabs.widget(0)
    assert page.widget().width() <= page.viewport().width()  # no text runs off the right edge: it wraps
    view = panel.request_view
    assert view.horizontalScrollBar().maximum() == 0  # every column fits the panel's width
    assert view.height() <= view.maximumHeight()  # six requests: the list scrolls instead of growing
    show_charts(qtbot, panel)
    for chart in panel.charts.charts:
        area = chart.chart().plotArea()
        qtbot.waitUntil(lambda area=area, chart=chart: chart.chart().plotArea().height() > 50)
        assert chart.chart().plotArea().width() > 150, chart.spec.title
    lefts = {round(c.chart().plotArea().left()) for c in panel.charts.charts}
    assert max(lefts) - min(lefts) <= 2  # the plots start at one x, so their times line up


def test_a_long_line_is_thinned_to_the_same_points_as_the_window_slides():
    from app.panel.charts import thinned

    history = EngineHistory(span_s=100.0)
    for i in range(400):  # four samples a second for 100 s
        history.add(fake_stats(decode_tokens_per_s=float(i)), now=i * 0.25)
    first = thinned(history, "decode", most=90)
    assert len(first) == 81 and first[-1] == history.points["decode"][-1]  # and the latest, always
    assert [v for _, v in first[:3]] == [0.0, 5.0, 10.0]  # every 5th sample by its recorded index
    history.add(fake_stats(decode_tokens_per_s=400.0), now=100.25)  # the oldest sample leaves the window
    later = thinned(history, "decode", most=90)
    assert [v for _, v in later[:2]] == [5.0, 10.0] and later[-1][1] == 400.0


def test_a_chart_says_what_it_shows_to_a_screen_reader(qtbot, panel, clock):
    show_charts(qtbot, panel)
    decode = panel.charts.chart("Decode")
    assert decode.accessibleName() == "Decode chart"
    feed(panel, clock, [fake_stats(decode_tokens_per_s=v) for v in (12.0, 48.25, 30.5)])
    assert decode.accessibleDescription() == "decode: latest 30.5 tok/s, highest 48.25"


def test_the_kv_rows_show_the_stored_format_and_the_disk_tier(panel, clock):
    from engine import DiskCacheStats

    disk = DiskCacheStats(1296, 81, 0, 61 * 1024**2, 2 * 1024**3)
    feed(panel, clock, [fake_stats(kv_cache_dtype="q8_0", kv_cache_dtype_reason="chosen in the settings",
                                   disk_cache=disk)])
    assert panel.labels["On disk"].text() == "1,296 tokens read back, 61.0 MiB of 2.0 GiB"
    assert panel.labels["Quantisation"].text().endswith("; KV q8_0")
    assert panel.labels["Quantisation"].toolTip() == "KV cache: chosen in the settings"
    feed(panel, clock, [fake_stats(disk_cache=None)])
    assert panel.labels["On disk"].text() == "off"


def test_the_memory_row_adds_up_to_the_processs_resident_memory(panel, clock):
    mib = 1024**2
    feed(panel, clock, [fake_stats(process_resident_bytes=590 * mib, model_memory_bytes=92 * mib,
                                   kv_touched_bytes=12 * mib, kv_cache_memory_bytes=2048 * mib)])
    assert panel.labels["Memory"].text() == ("590.0 MiB resident: weights 92.0 MiB, KV 12.0 MiB of 2.0 GiB, "
                                             "runtime 486.0 MiB")
    parts = panel.memory_bar.parts
    assert sum(size for _, size in parts.pieces()) == 590 * mib and panel.memory_bar.isVisible()


def test_the_drafts_row_says_what_speculation_kept_and_why(panel):
    from engine import SpeculationStats

    spec = SpeculationStats("auto", True, "auto: drafting for 1 of 1 replies", 40, 160, 124, 1.93)
    panel.update_stats(fake_stats(speculation=spec))
    label = panel.labels["Drafts"]
    assert label.text() == "124 of 160 kept (78%), 1.9x"
    assert label.toolTip() == ("Draft tokens kept of those computed, 3.1 kept a draft on average, and steps with "
                               "drafts against plain ones. Auto: drafting for 1 of 1 replies.")
    panel.update_stats(fake_stats(speculation=SpeculationStats("off", False, "off: chosen", 0, 0, 0, None)))
    assert label.text() == "off"
    panel.update_stats(fake_stats(speculation=SpeculationStats("auto", False, "measuring", 0, 0, 0, None)))
    assert label.text() == "auto, no draft yet"
    with_model = SpeculationStats("auto", False, "auto (M (int4)): measuring", 0, 0, 0, None, "M (int4)", 150 * 2**20)
    panel.update_stats(fake_stats(speculation=with_model))
    assert label.toolTip() == "Draft model M (int4): 150.0 MiB with its KV cache. auto (M (int4)): measuring"
    panel.update_stats(fake_stats())  # a remote engine says nothing about drafts
    assert label.text() == "–"
