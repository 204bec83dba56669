"""The Tune panel: the largest batch size that fits, found live from a few trials.

A form (script, batch option, range, budget, headroom, rounding, steps), Start and
Cancel, a progress bar, and the search's reasoning as it happens: every trial's peak
against the batch size (log2), the fitted memory model drawn out to the budget, the
budget and headroom lines, out-of-memory trials as red crosses, throughput on the right
axis with its knee, and a table of the trials. The search itself is core
(:mod:`torchmem.tuning`); each trial is a separate process, so nothing a trial does can
take the window down.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import replace
from pathlib import Path

import pyqtgraph as pg
from PySide6.QtCore import Qt, Signal, Slot
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import (
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QProgressBar,
    QSplitter,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from torchmem.gui.forms import (
    button,
    check_box,
    combo_box,
    line_edit,
    read_only_table,
    scrolling_column,
    spin_box,
)
from torchmem.gui.panels.job_panel import JobPanel
from torchmem.gui.plots.tune_plot import FAIL_COLOR, TunePlot
from torchmem.gui.tune_worker import TuneWorker
from torchmem.probe import nvml
from torchmem.probe.runner import ScriptError, validate_script
from torchmem.tuning.budget import budget_bytes, default_budget, headroom_bytes
from torchmem.tuning.function import function_plan, function_spec, plan_function
from torchmem.tuning.model import Fit
from torchmem.tuning.noise import BatchEffect
from torchmem.tuning.predict import Prediction, can_predict
from torchmem.tuning.search import Trial, TuneError, TuneResult
from torchmem.tuning.summary import tune_summary
from torchmem.tuning.trial import (
    TrialPlan,
    substitute,
    torchrun_command,
    without_option,
)
from torchmem.units import format_bytes

#: A search usually needs about this many trials (for the progress bar until it ends).
EXPECTED_TRIALS = 7
COLUMNS = ("#", "Batch", "Why", "Peak", "Predicted", "Result", "Samples/s", "Time")


class TunePanel(JobPanel):
    """Form, progress, plot and trial table of one batch-size search at a time."""

    CANCELLING = "Cancelling: ending the running trial…"
    EXPORT = ("Export the search", "tune.json", "JSON (*.json);;CSV (*.csv);;PNG (*.png)")

    #: "Use this batch size": (script, its arguments with the batch size filled in).
    use_batch_size = Signal(str, list)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        #: Where trials are recorded as sessions, or None (the default: the recorder's own
        #: memory would count in every trial's peak; `torchmem tune --record-trials` opts in).
        self.record_dir: str | None = None
        self.trials: list[Trial] = []
        self.fit: Fit | None = None
        self.result: TuneResult | None = None
        self.plan: TrialPlan | None = None
        #: The user's script and its arguments in the last search (for a job, without the
        #: torchrun launcher); (None, ()) for a step function.
        self._script: tuple[str | None, tuple[str, ...]] = (None, ())
        #: The last search's fake-step prediction (None: not asked, or not yet).
        self.prediction: Prediction | None = None
        self.limit = 0
        self._build_form()
        self._build_plot()
        self._build_table()
        self._layout()
        self.budget_edit.editingFinished.connect(self._redraw_empty)
        self.min_spin.valueChanged.connect(self._redraw_empty)
        self.max_spin.valueChanged.connect(self._redraw_empty)
        self._redraw()

    # -- construction -------------------------------------------------------------------------
    def _build_form(self) -> None:
        self.script_edit = line_edit(
            "The training script to tune, or a step function as FILE.py:FUNCTION (or "
            "package.module:FUNCTION): each trial imports it in a fresh process and calls "
            "it with the batch size, one call a step",
            placeholder="train.py, or steps.py:train_step",
        )
        self.browse_button = button("…", "Choose the script", self._browse)
        self.args_edit = line_edit(
            "The script's other arguments (shell syntax)", placeholder="--epochs 1"
        )
        self.batch_edit = line_edit(
            "The script's batch-size option: its value is replaced in the arguments of "
            "each trial, or appended",
            "--batch-size",
        )
        self.min_spin = spin_box("Smallest batch size to try (the first trial)", 1, 1 << 20, 1)
        self.max_spin = spin_box("Largest batch size the search may recommend", 1, 1 << 20, 4096)
        self.device_combo = combo_box(
            "Whose memory the budget is on: cpu (the trial's peak RSS, as the kernel counts "
            "it) or a CUDA device (the allocator's peak reserved bytes)",
            ["cpu", *nvml.cuda_devices()],
        )
        self.device_combo.currentTextChanged.connect(self._default_budget)
        self.budget_edit = line_edit(
            "Memory a trial may use: 6 GiB, 512 MiB, … (default: half of the RAM available "
            "now on CPU, the device's free memory on CUDA). A CPU trial that crosses it is "
            "stopped and counted as out of memory."
        )
        self.headroom_edit = line_edit(
            "Kept free below the budget: 10% or a size (default 10% on CPU, max(10%, "
            "1 GiB) on CUDA). The recommendation's peak stays under budget minus headroom.",
            placeholder="default",
        )
        self.rounding_combo = combo_box(
            "Round the recommendation down",
            [("none", "none"), ("multiple of 8", "multiple8"), ("power of 2", "pow2")],
        )
        self.steps_spin = spin_box(
            "Training steps measured per trial, after one warm-up step", 1, 1000, 3
        )
        self.predict_check = check_box(
            "Predict first with a fake step",
            "Run one training step per size under FakeTensorMode before any trial: tensors "
            "without data, so a step at batch 4096 allocates nothing and takes a moment. "
            "The memory model then needs three real trials after the first, where probing "
            "takes six or seven. A value read before the first backward (.item()) is given a "
            "stand-in (1, 1.0, False) and said as a caveat; a shape that depends on values "
            "(a boolean mask) cannot be predicted: the search then probes, and says why.",
            checked=True,
        )
        self.ranks_spin = spin_box(
            "Run each trial as a torchrun job of this many processes on this machine "
            "(DistributedDataParallel): the batch size is per rank, and every rank must "
            "fit (on cpu, all of them together in the budget; on CUDA, each rank's device)",
            1,
            256,
            1,
            special="1 (the script alone)",
        )
        self.start_button = button(
            "Start", "Start the search (Ctrl+Return)", self.start, shortcut="Ctrl+Return"
        )
        self.cancel_button = button(
            "Cancel", "Stop the search and the running trial now", self.cancel
        )
        self.progress = QProgressBar()
        self.progress.setTextVisible(True)
        self.progress.setFormat("")
        self.status.setText("Pick a script and a budget, then Start.")
        self.status.setTextInteractionFlags(Qt.TextSelectableByMouse)
        self._default_budget()

    def _build_plot(self) -> None:
        self.plot = TunePlot()

    def _build_table(self) -> None:
        self.table = read_only_table(COLUMNS)
        self.table.setSelectionBehavior(QTableWidget.SelectRows)
        self.table.horizontalHeader().setStretchLastSection(False)
        self.use_button = button(
            "Use this batch size", "Put the recommended size into the run's arguments", self._use
        )
        self.copy_button = button(
            "Copy command", "Copy the command line with the recommended size", self._copy
        )
        self.export_button = button(
            "Export…", "Save the plot (PNG) and the search (JSON, CSV)", self._export_dialog
        )
        self.headline = QLabel()
        self.headline.setWordWrap(True)
        self.headline.setTextFormat(Qt.RichText)

    def _layout(self) -> None:
        form = QFormLayout()
        script_row = QHBoxLayout()
        script_row.addWidget(self.script_edit, 1)
        script_row.addWidget(self.browse_button)
        form.addRow("Script:", script_row)
        form.addRow("Arguments:", self.args_edit)
        form.addRow("Batch option:", self.batch_edit)
        size_row = QHBoxLayout()
        size_row.addWidget(self.min_spin)
        size_row.addWidget(QLabel("to"))
        size_row.addWidget(self.max_spin)
        form.addRow("Sizes:", size_row)
        form.addRow("Device:", self.device_combo)
        form.addRow("Budget:", self.budget_edit)
        form.addRow("Headroom:", self.headroom_edit)
        form.addRow("Rounding:", self.rounding_combo)
        form.addRow("Steps per trial:", self.steps_spin)
        form.addRow("Processes:", self.ranks_spin)
        form.addRow("", self.predict_check)
        buttons = QHBoxLayout()
        buttons.addWidget(self.start_button)
        buttons.addWidget(self.cancel_button)
        left = QVBoxLayout()
        left.addLayout(form)
        left.addLayout(buttons)
        left.addWidget(self.progress)
        left.addWidget(self.status)
        left.addStretch(1)
        left_widget = scrolling_column(left)
        actions = QHBoxLayout()
        actions.addWidget(self.headline, 1)
        actions.addWidget(self.use_button)
        actions.addWidget(self.copy_button)
        actions.addWidget(self.export_button)
        right = QVBoxLayout()
        right.setContentsMargins(0, 0, 0, 0)
        right.addLayout(actions)
        splitter = QSplitter(Qt.Vertical)
        splitter.addWidget(self.plot)
        splitter.addWidget(self.table)
        splitter.setSizes([300, 140])
        right.addWidget(splitter, 1)
        right_widget = QWidget()
        right_widget.setLayout(right)
        outer = QSplitter(Qt.Horizontal)
        outer.addWidget(left_widget)
        outer.addWidget(right_widget)
        outer.setStretchFactor(1, 1)
        outer.setSizes([320, 700])
        layout = QVBoxLayout(self)
        layout.setContentsMargins(2, 2, 2, 2)
        layout.addWidget(outer)

    # -- the form -------------------------------------------------------------------------------
    def set_script(self, script: str | None, args: list[str]) -> None:
        """Fill the form with the window's script (when the form has none)."""
        if script and not self.script_edit.text():
            self.script_edit.setText(script)
            self.args_edit.setText(shlex.join(without_option(args, self.batch_edit.text())))

    @Slot()
    def _browse(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Script to tune", "", "Python (*.py)")
        if path:
            self.script_edit.setText(path)

    @Slot()
    def _default_budget(self) -> None:
        try:
            self.budget_edit.setText(format_bytes(default_budget(self.device_combo.currentText())))
        except TuneError:
            self.budget_edit.clear()

    def _plan(self) -> tuple[TrialPlan, int, int]:
        """The trials' plan, the limit and the headroom from the form; TuneError (with
        what to fix) for anything invalid."""
        function = function_spec(self.script_edit.text())
        if function is None:
            try:
                script = str(validate_script(self.script_edit.text().strip()))
            except ScriptError as exc:
                raise TuneError(str(exc)) from None
        try:
            args = tuple(shlex.split(self.args_edit.text()))
        except ValueError as exc:
            raise TuneError(f"the arguments cannot be read: {exc}") from None
        option = self.batch_edit.text().strip()
        if not option and function is None:
            raise TuneError("give the script's batch-size option, e.g. --batch-size")
        if not option.startswith("-"):
            option = "--" + option
        if self.min_spin.value() > self.max_spin.value():
            raise TuneError("the smallest size is above the largest")
        device = self.device_combo.currentText()
        text = self.budget_edit.text().strip()
        if not text:
            raise TuneError("give a memory budget, e.g. 8GiB")
        budget = budget_bytes(text, device)
        room = headroom_bytes(self.headroom_edit.text().strip() or None, budget, device)
        ranks = self.ranks_spin.value()
        steps = self.steps_spin.value()
        if function is not None:
            if ranks > 1:
                raise TuneError(
                    "a step function is tuned in one process: set Processes to 1, or tune "
                    "the training script as a torchrun job"
                )
            plan = function_plan(*function, steps, device, budget)
        elif ranks > 1:
            launch = torchrun_command(ranks, script, args)
            plan = TrialPlan(launch[0], tuple(launch[1:]), option, steps, device, budget, job=True)
        else:
            plan = TrialPlan(script, args, option, steps, device, budget)
        self._script = (None, ()) if function is not None else (script, args)
        record = None if plan.job else self.record_dir  # a job's trials are not recorded
        return replace(plan, record_dir=record), budget - room, room

    # -- the search -----------------------------------------------------------------------------
    @Slot()
    def start(self) -> bool:
        """Start a search with the form's settings; False (and why, in red) if invalid."""
        if self.running:
            return False
        try:
            self.plan, self.limit, room = self._plan()
        except TuneError as exc:
            self.say(str(exc), error=True)
            return False
        self.trials, self.fit, self.result = [], None, None
        self.table.setRowCount(0)
        self._redraw()
        self.progress.setRange(0, EXPECTED_TRIALS)
        self.progress.setValue(0)
        self.progress.setFormat("trial 1 of about %m")
        what = self._function() or Path(self._script[0] or "").name
        if self.plan.job:
            what += f" (torchrun, {self.ranks_spin.value()} processes: the batch is per rank)"
        self.say(
            f"Trials of {what} must stay under "
            f"{format_bytes(self.limit)} (budget {format_bytes(self.plan.budget_bytes)} − "
            f"headroom {format_bytes(room)}). Each trial is a separate process."
        )
        predict_first = self.predict_check.isChecked() and can_predict(self.plan)
        worker = TuneWorker(
            self.plan,
            self.limit,
            self.min_spin.value(),
            self.max_spin.value(),
            self.rounding_combo.currentData(),
            predict_first,
        )
        if predict_first:
            self.progress.setFormat("predicting: a fake step per size, nothing allocated…")
        self.prediction = None
        worker.trial_done.connect(self._on_trial)
        worker.predicted.connect(self._on_predicted)
        worker.finished.connect(self._on_finished)
        self.start_job(worker, "torchmem-tune")
        self._update_buttons()
        return True

    @Slot(object)
    def _on_predicted(self, prediction: Prediction) -> None:
        self.prediction = prediction
        text = prediction.describe()
        self.say(text[0].upper() + text[1:] + ".")
        self.progress.setFormat("trial 1 of about %m")
        expected = 4 if prediction.fit is not None else EXPECTED_TRIALS
        self.progress.setRange(0, expected)

    @Slot(object, object)
    def _on_trial(self, trial: Trial, fit: Fit | None) -> None:
        self.trials.append(trial)
        self.fit = fit
        self._add_row(trial)
        n = len(self.trials)
        self.progress.setRange(0, max(self.progress.maximum(), n + 1))
        self.progress.setValue(n)
        mean = sum(t.duration_s for t in self.trials) / n
        left = max(self.progress.maximum() - n, 1) * mean
        self.progress.setFormat(f"trial {n + 1} of about %m · about {left:.0f} s left")
        self._redraw()

    @Slot(object)
    def _on_finished(self, result: TuneResult | None) -> None:
        self.job_ended()
        self.result = result
        self.progress.setRange(0, max(len(self.trials), 1))
        self.progress.setValue(len(self.trials))
        self.progress.setFormat(f"{len(self.trials)} trials")
        if result is not None:
            self.fit = result.fit
            option = "batch size" if self._function() or not self.plan else self.plan.batch_arg
            self.say(_explain(result, option))
        self._redraw()
        self._update_buttons()

    # -- what it shows --------------------------------------------------------------------------
    def _add_row(self, trial: Trial) -> None:
        row = self.table.rowCount()
        self.table.insertRow(row)
        verdict = trial.verdict(self.limit)
        cells = (
            str(row + 1),
            f"{trial.batch_size:,}",
            trial.role,
            format_bytes(trial.peak_bytes) if trial.peak_bytes is not None else "–",
            format_bytes(trial.predicted_bytes) if trial.predicted_bytes else "–",
            verdict,
            f"{trial.samples_per_s:,.0f}" if trial.samples_per_s else "–",
            f"{trial.duration_s:.1f} s",
        )
        for col, text in enumerate(cells):
            cell = QTableWidgetItem(text)
            if col in (0, 1, 3, 4, 6, 7):
                cell.setTextAlignment(Qt.AlignRight | Qt.AlignVCenter)
            if col == 5 and verdict != "fits":
                cell.setForeground(pg.mkColor(FAIL_COLOR))
            if trial.message:
                cell.setToolTip(trial.message)
            self.table.setItem(row, col, cell)
        self.table.scrollToBottom()

    def _form_budget(self) -> int | None:
        """The budget the form names, in bytes; None while it names none."""
        try:
            return budget_bytes(self.budget_edit.text().strip(), self.device_combo.currentText())
        except (TuneError, ValueError):
            return None

    @Slot()
    def _redraw_empty(self) -> None:
        """Before a search, the axes show the form's range and budget."""
        if not self.trials and not self.running:
            self._redraw()

    def _redraw(self) -> None:
        plan = self.plan
        memory = nvml.device_memory(plan.device) if plan and not plan.on_cpu else None
        self.plot.draw(
            self.trials,
            self.fit,
            self.result,
            plan.budget_bytes if plan else self._form_budget(),
            self.limit,
            memory[1] if memory else None,
            (self.min_spin.value(), self.max_spin.value()),
            planned=plan is not None,
        )
        self._update_headline()
        self._update_buttons()

    def _update_headline(self) -> None:
        result = self.result
        if result is None:
            self.headline.setText(
                f"<b>{len(self.trials)}</b> trial(s) so far" if self.trials else ""
            )
            return
        count = f"{len(result.trials)} trials, {result.ooms} out of memory"
        if result.recommended is None:
            option = self.plan.batch_arg if self.plan and not self._function() else "batch size"
            what = (
                "the script does not seem to read it"
                if result.effect is BatchEffect.NONE
                else "any size in the range fits"
            )
            self.headline.setText(
                f"<b>No recommendation</b>: memory hardly depends on {option} ({what}) · {count}"
            )
            return
        noise = (
            f" · margin {format_bytes(result.noise.margin)} for the noise of identical runs"
            if result.noise.margin > 0
            else ""
        )
        self.headline.setText(
            f"Recommended <b>{result.recommended:,}</b> · largest measured to fit "
            f"{result.max_fitting:,} · {count}{noise}"
        )

    def _update_buttons(self) -> None:
        running = self.running
        self.start_button.setEnabled(not running)
        self.cancel_button.setEnabled(running)
        done = self.result is not None and self.result.recommended is not None and not running
        self.copy_button.setEnabled(done)
        # A step function has no command line to fill in: copy the call instead.
        self.use_button.setEnabled(done and not self._function())
        self.export_button.setEnabled(bool(self.trials) and not running)
        for widget in (
            self.script_edit, self.browse_button, self.args_edit, self.batch_edit,
            self.min_spin, self.max_spin, self.device_combo, self.budget_edit,
            self.headroom_edit, self.rounding_combo, self.steps_spin, self.ranks_spin,
            self.predict_check,
        ):  # fmt: skip
            widget.setEnabled(not running)

    # -- results --------------------------------------------------------------------------------
    def recommended_args(self) -> list[str]:
        """The script's arguments with the recommended batch size (per rank, for a job)."""
        assert self.result is not None and self.plan is not None
        return substitute(self._script[1], self.plan.batch_arg, self.result.recommended)

    def _function(self) -> str | None:
        """The step function the last search tuned (``module:function``), or None."""
        return plan_function(self.plan) if self.plan is not None else None

    @Slot()
    def _use(self) -> None:
        if self.result is not None and self.plan is not None:
            self.use_batch_size.emit(self._script[0], self.recommended_args())

    @Slot()
    def _copy(self) -> None:
        if self.result is not None and self.plan is not None:
            function = self._function()
            if function:
                text = f"{function.partition(':')[2]}({self.result.recommended})"
            else:
                text = shlex.join(self.plan.command_line(self.result.recommended))
            QGuiApplication.clipboard().setText(text)
            self.say(f"Copied: {text}")

    def export(self, path: str) -> None:
        """Write the search: ``.png`` the plot, ``.csv`` the trials, else the JSON summary
        (the same as ``torchmem tune --summary``)."""
        suffix = Path(path).suffix.lower()
        try:
            if suffix == ".png":
                if not self.plot.grab().save(path):
                    raise OSError("the image could not be written")
            elif suffix == ".csv":
                rows = [t.to_json() for t in self.trials]
                header = list(rows[0]) if rows else []
                lines = [",".join(header)] + [
                    ",".join(_csv(row[k]) for k in header) for row in rows
                ]
                Path(path).write_text("\n".join(lines) + "\n")
            else:
                assert self.plan is not None
                data = tune_summary(
                    self.plan, list(self.plan.args), self.limit,
                    self.plan.budget_bytes - self.limit, self.result, self.trials,
                    sum(t.duration_s for t in self.trials), self.prediction,
                )  # fmt: skip
                Path(path).write_text(json.dumps(data, indent=2) + "\n")
        except OSError as exc:
            self.say(f"Cannot export to {path}: {exc}", error=True)
            return
        self.say(f"Exported {path}")


def _explain(result: TuneResult, option: str) -> str:
    return " ".join(f"{line[0].upper()}{line[1:]}." for line in result.explain(option))


def _csv(value: object) -> str:
    text = "" if value is None else str(value)
    return f'"{text}"' if "," in text or '"' in text else text
