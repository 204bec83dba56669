"""The Tensors panel and the breakdown chart, as a user drives them."""

from __future__ import annotations

import threading

import pytest
import torch
from PySide6.QtCore import QModelIndex, QSettings, Qt
from PySide6.QtWidgets import QApplication, QTreeView

from torchmem.events import CensusTaken
from torchmem.gui.panels.tensor_model import CHUNK, TensorModel
from torchmem.gui.panels.tensor_panel import TensorDetails, details_text, local_referrers
from torchmem.gui.windows.main_window import MainWindow
from torchmem.probe.backends import ProcessBackend
from torchmem.resources import demo_script
from torchmem.session import Session
from torchmem.sources.inprocess import InProcessSource
from torchmem.tensors.walk import take_census

RUN_TIMEOUT_MS = 120_000


@pytest.fixture
def window(qtbot, tmp_path):
    source = InProcessSource(Session(), [ProcessBackend()])
    w = MainWindow(source, QSettings(str(tmp_path / "s.ini"), QSettings.IniFormat))
    qtbot.addWidget(w)
    w.show()
    yield w
    w.close()


def small_census():
    held = {
        "weights": torch.zeros(100, 10),
        "flat": None,
        "ids": torch.arange(50, dtype=torch.int64),
        "mask": torch.zeros(7, dtype=torch.bool),
    }
    held["flat"] = held["weights"].view(-1)
    return take_census([("", held)]), held


def test_model_passes_qtmodeltester(qtmodeltester):
    census, held = small_census()
    model = TensorModel()
    model.set_census(census)
    qtmodeltester.check(model, force_py=True)
    model.set_filter_text("weights")
    qtmodeltester.check(model, force_py=True)
    del held


def test_filter_and_sort_in_the_model():
    census, held = small_census()
    model = TensorModel()
    model.set_census(census)
    model.set_filter_text("int64")
    names = [model.index(r, 0).data() for r in range(model.rowCount())]
    assert names == ["ids"]
    model.set_filter_text("weights float32")
    assert [model.index(r, 0).data() for r in range(model.rowCount())] == ["weights"]
    parent = model.index(0, 0)
    children = sorted(model.index(r, 0, parent).data() for r in range(model.rowCount(parent)))
    assert children == ["flat (view)", "weights"]
    model.set_filter_text("")
    model.sort(2, Qt.AscendingOrder)
    sizes = [model.index(r, 0).data(Qt.UserRole) for r in range(model.rowCount())]
    assert sizes == sorted(sizes)
    model.sort(2, Qt.DescendingOrder)
    sizes = [model.index(r, 0).data(Qt.UserRole) for r in range(model.rowCount())]
    assert sizes == sorted(sizes, reverse=True)
    model.sort(0, Qt.AscendingOrder)
    first = [model.index(r, 0).data().lower() for r in range(model.rowCount())]
    assert first == sorted(first)
    del held


def test_names_sort_naturally():
    held = {f"model.{i}.weight": torch.zeros(i + 1) for i in (13, 8, 2, 100)}
    census = take_census([("", held)])
    model = TensorModel()
    model.set_census(census)
    model.sort(0, Qt.AscendingOrder)
    model.set_filter_text("model.")  # tensors an earlier test left alive are not ours
    names = [model.index(r, 0).data() for r in range(model.rowCount())]
    assert names == ["model.2.weight", "model.8.weight", "model.13.weight", "model.100.weight"]
    model.sort(0, Qt.DescendingOrder)
    assert model.index(0, 0).data() == "model.100.weight"
    del held


def test_a_large_census_is_sorted_and_filtered_whole_and_shown_a_chunk_at_a_time(qtbot):
    """20,000 storages: sorting and filtering see every one, and a view is handed rows as
    it scrolls (laying out every row of a big census froze the window for seconds)."""
    many = [torch.zeros(i % 17 + 1) for i in range(20_000)]
    census = take_census([("", {"many": many})], referrers=False)
    model = TensorModel()
    model.set_census(census)
    view = QTreeView()
    qtbot.addWidget(view)
    view.setUniformRowHeights(True)
    view.setModel(model)
    view.resize(600, 400)
    view.show()
    assert model.matching() >= 20_000
    model.sort(2, Qt.AscendingOrder)
    assert model.index(0, 0).data(Qt.UserRole) == 4  # the smallest of all 20,000: 1 float
    shown = model.rowCount()
    assert CHUNK <= shown < model.matching()
    view.scrollToBottom()
    qtbot.waitUntil(lambda: model.rowCount() > shown, timeout=5_000)
    while model.canFetchMore(QModelIndex()):
        model.fetchMore(QModelIndex())
    assert model.rowCount() == model.matching()
    # The largest of all (17 floats, or a tensor an earlier test left alive in this process).
    largest = max(s.nbytes for s in census.storages.values())
    assert model.index(model.rowCount() - 1, 0).data(Qt.UserRole) == largest >= 17 * 4
    model.set_filter_text("many[19999]")  # the last one made: far beyond the first chunk
    assert [model.index(r, 0).data() for r in range(model.rowCount())] == ["many[19999]"]
    del many


def test_refresh_lists_the_demo_with_real_names(qtbot, window, capsys):
    window.load_script(
        str(demo_script()), ["--epochs", "1", "--steps", "400", "--batch-size", "16"], run=True
    )
    qtbot.waitUntil(lambda: window.session.steps.steps >= 5, timeout=RUN_TIMEOUT_MS)
    window.tensors.refresh_button.click()
    qtbot.waitUntil(
        lambda: window.tensors.model.census is not None and window.tensors._shown.trigger == "user",
        timeout=30_000,
    )
    census = window.tensors.model.census
    share = census.named_share()
    with capsys.disabled():
        print(
            f"\n[census] demo mid-training: {100 * share:.2f}% of tensor bytes named, "
            f"{sum(1 for _ in census.tensors())} tensors, {census.duration_s * 1000:.0f} ms"
        )
    assert share >= 0.95
    names = {t.name for t in census.tensors()}
    assert "model.0.weight" in names
    assert "Adam.state[model.0.weight].exp_avg" in names
    assert "cpu:" in window.tensors.totals.text() or "cpu</b>" in window.tensors.totals.text()
    assert "naive sum" in window.tensors.totals.text()
    # The command's own result follows the census: it may land a redraw later.
    qtbot.waitUntil(lambda: "Census:" in window.statusBar().currentMessage(), timeout=5_000)
    assert "% named" in window.tensors.headline.text()
    window.tensors_dock.raise_()
    qtbot.waitUntil(lambda: window.tensors.view.isVisible(), timeout=5_000)
    rows_shown = window.tensors.view.viewport().height() / window.tensors.view.sizeHintForRow(0)
    assert rows_shown >= 8, f"the table shows {rows_shown:.1f} rows at the default size"
    window.stop()
    qtbot.waitUntil(lambda: not window.running, timeout=RUN_TIMEOUT_MS)
    totals = window.breakdown.stacked_totals()
    assert totals, "the breakdown chart shows the censuses"
    # After the run, Refresh keeps the run's last census (its tensors are gone now).
    shown = window.tensors._shown
    window.tensors.refresh_button.click()
    assert window.tensors._shown is shown and window.session.censuses()[0] is shown
    assert "last census" in window.statusBar().currentMessage()
    assert window.breakdown.stacked_totals() == totals


def test_second_refresh_highlights_new_storages_and_details_show_the_holder(
    qtbot, window, script_path
):
    window.load_script(script_path("train_forever.py"), [], run=True)
    qtbot.waitUntil(lambda: window.session.steps.steps >= 3, timeout=RUN_TIMEOUT_MS)
    window.act_census.trigger()
    qtbot.waitUntil(
        lambda: window.tensors._shown is not None and window.tensors._shown.trigger == "user",
        timeout=30_000,
    )
    first = window.tensors._shown
    window.act_census.trigger()
    qtbot.waitUntil(
        lambda: window.tensors._shown is not first and window.tensors._shown.trigger == "user",
        timeout=30_000,
    )
    assert "since the last one" in window.tensors.changes.text()
    model = window.tensors.model
    rows = {model.storage(r).name: r for r in range(model.rowCount())}
    row = rows["model.weight"]
    assert model.data(model.index(row, 1)) == "parameters"
    storage = model.storage(row)
    text = details_text(storage, storage, local_referrers(storage.tensors[0]))
    assert "Name: model.weight" in text and "Shape: [4, 16]" in text
    assert "What keeps it alive (nearest first)" in text
    window.stop()
    qtbot.waitUntil(lambda: not window.running, timeout=RUN_TIMEOUT_MS)


def test_turning_automatic_censuses_off_is_remembered(qtbot, window):
    window.tensors.auto_check.setChecked(False)
    assert window.source.census_schedule.enabled is False
    assert window.settings.value("census/auto") in (False, "false")


def test_double_click_opens_details_with_the_holder(qtbot, window):
    census, held = small_census()
    window.session.submit(CensusTaken(1.0, 3, census))
    window.bridge.flush()
    window.tensors.filter_edit.setText("weights")
    model = window.tensors.model
    window.tensors.view.doubleClicked.emit(model.index(0, 0, QModelIndex()))
    dialogs = window.tensors.findChildren(TensorDetails)
    assert len(dialogs) == 1
    text = dialogs[0].text
    qtbot.waitUntil(lambda: "value of key 'weights' in a dict" in text.toPlainText())
    assert "Name: weights" in text.toPlainText() and "Shape: [100, 10]" in text.toPlainText()
    assert "viewed by 2 tensor(s)" in text.toPlainText()
    dialogs[0].close()
    del held


def test_the_holder_is_asked_off_the_gui_thread_and_shown_when_it_comes(qtbot, window, monkeypatch):
    # An attached agent may take seconds to answer: the dialog must open at once, the
    # window stay responsive, and the answer fill the dialog when it comes.
    census, held = small_census()
    window.session.submit(CensusTaken(1.0, 3, census))
    window.bridge.flush()
    window.tensors.filter_edit.setText("weights")
    target = window.runs.target
    lookup = target.referrers
    release = threading.Event()
    asked_in: list[int] = []

    def slow(tensor, scope=""):
        asked_in.append(threading.get_ident())
        release.wait(10)
        return lookup(tensor, scope)

    monkeypatch.setattr(target, "referrers", slow)
    model = window.tensors.model
    dialog = window.tensors.open_details(model.info_at(model.index(0, 0, QModelIndex())))
    assert "What keeps it alive: asking the process…" in dialog.text.toPlainText()
    qtbot.waitUntil(lambda: bool(asked_in))
    assert asked_in[0] != threading.get_ident(), "asked in the GUI thread"
    release.set()
    qtbot.waitUntil(lambda: "value of key 'weights' in a dict" in dialog.text.toPlainText())
    # A process that cannot answer is said in the dialog, not raised.
    monkeypatch.setattr(
        target, "referrers", lambda t, scope="": (_ for _ in ()).throw(OSError("gone"))
    )
    second = window.tensors.open_details(model.info_at(model.index(0, 0, QModelIndex())))
    qtbot.waitUntil(lambda: "cannot ask the process (gone)" in second.text.toPlainText())
    dialog.close()
    second.close()
    del held


def test_a_leak_raises_an_alert_marked_on_the_traces_and_leads_to_its_culprits(qtbot, window):
    corpus = __import__("pathlib").Path(__file__).parent / "leak_corpus"
    window.load_script(str(corpus / "leak_features_list.py"), [], run=True)
    qtbot.waitUntil(lambda: window.alerts.active_count >= 1, timeout=RUN_TIMEOUT_MS)
    assert window.alerts_dock.windowTitle() == "Alerts (1)"
    assert "⚠ leak" in window.statusBar().currentMessage() or "leak" in window.log.toPlainText()
    assert "leak:cpu/rss" in window.plot.marks.alerts
    qtbot.waitUntil(lambda: "features" in window.alerts.selected().message, timeout=RUN_TIMEOUT_MS)
    qtbot.waitUntil(lambda: not window.running, timeout=RUN_TIMEOUT_MS)
    alert = window.alerts.selected()
    assert "detach()" in alert.suggestion
    assert window.alerts.jump_button.isEnabled()
    window.alerts.jump_button.click()
    assert window.tensors.filter_edit.text() == "features"
    window.alerts.mute_button.click()
    assert window.alerts.active_count == 0
    assert window.alerts_dock.windowTitle() == "Alerts"


def test_leak_settings_are_applied_and_remembered(qtbot, window):
    from torchmem.gui.dialogs.leak_settings import LeakSettingsDialog, load_leak_settings

    dialog = LeakSettingsDialog(window.source.leak_settings, window.settings, window)
    dialog.mib.setValue(4.0)
    dialog.warmup.setValue(12)
    window.source.configure_leaks(dialog.result_settings())
    assert window.source.leak_settings.abs_per_step == 4 << 20
    again = load_leak_settings(window.settings)
    assert again.warmup_steps == 12 and again.abs_per_step == 4 << 20


def rank_census(t, step, name, sizes):
    """A census of one process of a job, as its source submits it: ``name`` is the
    Session's name of its device (``rank0/cpu``: the scope field ``rank0``, the device
    ``cpu``), a storage of each size (bytes) at addresses that tell them apart."""
    from torchmem.tensors.model import Census, StorageInfo, TensorInfo

    scope, _, device = name.rpartition("/")
    storages = {}
    for i, nbytes in enumerate(sizes):
        key, n = (device, 4096 * (i + 1)), nbytes // 4
        info = TensorInfo(
            f"w{i}", "parameter", (n,), (1,), 0, "float32", device, n, 4, nbytes, False,
            True, True, True, "", False, key,
        )  # fmt: skip
        storages[key] = StorageInfo(key, nbytes, [info])
    return CensusTaken(t, step, Census(storages, [], 0.01, step), scope=scope)


def test_the_breakdown_of_one_rank_follows_its_own_censuses(qtbot, window):
    """Attached to a job, the censuses of the ranks come in turn: rank 0's chart kept
    dropping to 0 B at every census of rank 1."""
    for step, (device, nbytes) in enumerate(
        [("rank0/cpu", 1024), ("rank1/cpu", 4096), ("rank0/cpu", 2048), ("rank1/cpu", 8192)]
    ):
        window.session.submit(rank_census(float(step), step, device, [nbytes]))
    window.bridge.flush()
    window.breakdown.refresh(force=True)
    combo = window.breakdown.device_combo
    combo.setCurrentIndex([combo.itemData(i) for i in range(combo.count())].index(("rank0", "cpu")))
    assert combo.currentText() == "rank 0 · cpu"  # not the series' "rank0/cpu"
    window.breakdown.refresh(force=True)
    assert window.breakdown.stacked_totals() == [1.0, 2.0]  # KiB: rank 0's two censuses
    assert "rank 0 · cpu: <b>2.00&nbsp;KiB</b>" in window.breakdown.legend.text()


def test_the_breakdown_lists_a_jobs_devices_in_rank_order(qtbot, window):
    """Rank 10's devices came before rank 2's (a plain sort of "rank10/cpu", "rank2/cpu")."""
    for step, device in enumerate(["rank10/cpu", "rank2/cuda:0", "rank2/cpu", "rank1/cpu"]):
        window.session.submit(rank_census(float(step), step, device, [1024]))
    window.bridge.flush()
    window.breakdown.refresh(force=True)
    combo = window.breakdown.device_combo
    assert [combo.itemText(i) for i in range(combo.count())] == [
        "rank 1 · cpu", "rank 2 · cpu", "rank 2 · cuda:0", "rank 10 · cpu",
    ]  # fmt: skip


def test_what_changed_in_a_job_is_what_changed_in_that_rank(qtbot, window):
    """A rank's census is compared with that rank's previous one, not with the other
    rank's that came in between (every storage read as new, every other one as freed)."""
    window.session.submit(rank_census(1.0, 1, "rank0/cpu", [1024, 2048]))
    window.session.submit(rank_census(2.0, 1, "rank1/cpu", [4096]))
    window.session.submit(rank_census(3.0, 2, "rank0/cpu", [1024, 2048, 512]))
    window.bridge.flush()
    window.tensors.refresh()
    assert "+1 / −0 storages" in window.tensors.headline.text()
    new = [r for r in range(window.tensors.model.rowCount()) if window.tensors.model.is_new(r)]
    assert [window.tensors.model.storage(r).nbytes for r in new] == [512]


def test_the_tensors_breakdown_and_readings_follow_the_rank_chosen_in_the_toolbar(qtbot, window):
    """A job's ranks take censuses in turn: with a rank chosen, the panel keeps to it."""
    from torchmem.events import Sample

    for t, scope in enumerate(("rank0", "rank1", "rank2")):
        window.session.submit(Sample(float(t), {f"{scope}/cpu/rss": 1e8}))
    window.session.submit(rank_census(1.0, 1, "rank0/cpu", [1024]))
    window.session.submit(rank_census(2.0, 1, "rank1/cpu", [4096, 512]))
    window.bridge.flush()
    assert "rank 1 · cpu" in window.tensors.headline.text()  # every rank: the newest
    combo = window.rank_combo
    qtbot.waitUntil(lambda: combo.findData("rank0") >= 0, timeout=5_000)
    combo.setCurrentIndex(combo.findData("rank1"))
    assert window.breakdown.device == ("rank1", "cpu")
    readings = window.readings
    shown = [k for k, r in readings._rows.items() if not readings.isRowHidden(r)]
    assert shown == ["rank1/cpu/rss"], "the readings follow the chosen rank too"
    combo.setCurrentIndex(combo.findData("rank0"))
    assert window.tensors.scope == "rank0"
    assert window.breakdown.device == ("rank0", "cpu")
    assert "rank 0 · cpu" in window.tensors.headline.text()
    assert window.tensors.model.matching() == 1
    window.session.submit(rank_census(3.0, 2, "rank1/cpu", [4096]))
    window.bridge.flush()
    assert "rank 0 · cpu" in window.tensors.headline.text(), "rank 1's census does not replace it"
    combo.setCurrentIndex(combo.findData("rank2"))
    assert window.tensors.headline.text() == "No census of rank 2 yet."
    assert window.tensors.model.matching() == 0
    combo.setCurrentIndex(0)  # every rank
    assert window.tensors.scope is None and "rank 1 · cpu" in window.tensors.headline.text()


def test_a_filter_says_how_many_match_and_a_new_run_starts_unfiltered(qtbot, window):
    census, held = small_census()
    window.session.submit(CensusTaken(1.0, 1, census))
    window.bridge.flush()
    window.tensors.refresh()
    panel = window.tensors
    total = len(census.storages)
    panel.filter_edit.setText("int64")
    assert panel.match_label.text() == f"1 of {total} storages match"
    panel.filter_edit.setText("no_such_tensor")
    assert (
        panel.model.rowCount() == 0 and f"0 of {total} storages match" in panel.match_label.text()
    )
    window.clear_views()  # what a new run or an attach does first
    assert panel.filter_edit.text() == "" and panel.match_label.text() == ""
    window.session.submit(CensusTaken(2.0, 1, census))
    window.bridge.flush()
    panel.refresh()
    assert panel.model.rowCount() == total, "the next run's rows are all shown"
    del held


def test_each_ranks_alert_says_its_rank_and_is_muted_alone(qtbot, window):
    """Two ranks of a job leak the same way: one alert each, said with its rank in the
    list, its details, the status bar and the log; muting one leaves the other."""
    from torchmem.events import Alert, AlertKind, AlertState, Severity

    def leak(t, scope):
        return Alert(
            t, "leak:cpu/rss", AlertKind.LEAK, Severity.WARNING, AlertState.ACTIVE,
            "cpu/rss", 3, 3, "process RSS grew by 3.00 MiB/step", "detach it",
            per_step=3 << 20, raised_step=3, scope=scope,
        )  # fmt: skip

    window.session.submit(leak(1.0, "rank0"))
    window.session.submit(leak(2.0, "rank1"))
    window.bridge.flush()
    rows = [
        window.alerts.tree.topLevelItem(i) for i in range(window.alerts.tree.topLevelItemCount())
    ]
    assert [row.text(4) for row in rows] == [
        "rank 1: process RSS grew by 3.00 MiB/step",
        "rank 0: process RSS grew by 3.00 MiB/step",
    ]  # newest raised first
    assert "rank 1: process RSS grew" in window.statusBar().currentMessage()
    window.log.flush()
    assert "⚠ leak: rank 0: process RSS grew" in window.log.toPlainText()
    assert set(window.plot.marks.alerts) == {"rank0/leak:cpu/rss", "rank1/leak:cpu/rss"}
    window.alerts.tree.setCurrentItem(rows[0])
    window.alerts.mute_button.click()
    assert [a.scope for a in window.session.alert_list()] == ["rank0"]
    window.session.submit(leak(3.0, "rank1"))  # rank 1's next update stays muted
    window.bridge.flush()
    assert window.alerts.active_count == 1
    (kept,) = window.session.alert_list()
    assert kept.to_json()["series"] == "rank0/cpu/rss"
    assert kept.to_json()["message"].startswith("rank 0: ")


def test_the_breakdown_chart_keeps_its_height_in_a_small_window(qtbot, window):
    """At the window's default size on a 1400x900 screen (933x600), the chart was a sliver
    under its legend of four kinds: the Readings beside it took the dock column."""
    from torchmem.gui.plots.breakdown_plot import PLOT_MIN_HEIGHT

    window.resize(933, 600)
    step_census = rank_census(1.0, 1, "cpu", [505 * 1024, 1800, 1010 * 1024])
    window.session.submit(step_census)
    window.bridge.flush()
    window.breakdown.refresh(force=True)
    QApplication.processEvents()
    plot = window.breakdown.plot
    assert window.breakdown.legend.isVisible() and plot.isVisible()
    assert plot.height() >= PLOT_MIN_HEIGHT, plot.height()
    assert window.readings_dock.isVisible()  # the Readings still share the column
