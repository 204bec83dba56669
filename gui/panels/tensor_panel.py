"""The Tensors panel: what holds the memory, storage by storage, with real names."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from PySide6.QtCore import QModelIndex, Qt, Signal, Slot
from PySide6.QtWidgets import (
    QCheckBox,
    QDialog,
    QDialogButtonBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QPushButton,
    QToolButton,
    QTreeView,
    QVBoxLayout,
    QWidget,
)

from torchmem.events import CensusTaken
from torchmem.gui.bridge import SessionBridge
from torchmem.gui.panels.tensor_model import TensorModel
from torchmem.gui.view_state import ViewState
from torchmem.series import SeriesName, process_device_label, scope_label
from torchmem.session import Session
from torchmem.tensors.model import KIND_LABELS, CensusDiff, StorageInfo, TensorInfo
from torchmem.tensors.referrers import referrers_of
from torchmem.units import format_bytes

NO_CENSUS = "No census yet: press Refresh while a script runs."
GAP_LABEL = "not held by a Python tensor (allocator rounding, autograd buffers, C++ caches)"


class TensorPanel(QWidget):
    """Census tree with a filter, totals per device, and changes since the last census."""

    #: The user asked for a new census (Refresh).
    refresh_requested = Signal()
    #: The user switched automatic censuses at step boundaries on or off.
    auto_toggled = Signal(bool)

    def __init__(self, session: Session, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        #: Asks the process that owns the tensors what keeps one alive, off the GUI thread
        #: (the window's ``RunController.ask_referrers``): returns a request id, and the
        #: answer comes to :meth:`referrers_found`. None: looked up here, at once.
        self.ask_referrers: Callable[[TensorInfo, str], int] | None = None
        #: Open details dialogs waiting for an answer, by request id.
        self._waiting: dict[int, TensorDetails] = {}
        self.session = session
        self.model = TensorModel(self)
        self._shown: CensusTaken | None = None
        #: The process of a job whose censuses are shown (``rank1``); None: the newest
        #: census of any (a single process has only its own).
        self.scope: str | None = None

        self.refresh_button = QPushButton("Refresh")
        self.refresh_button.setToolTip("Take a census of every live tensor now (Ctrl+Shift+C)")
        self.refresh_button.clicked.connect(self.refresh_requested)
        self.auto_check = QCheckBox("At step boundaries")
        self.auto_check.setChecked(True)
        self.auto_check.setToolTip(
            "Take a census automatically at step boundaries, as often as a 1% overhead "
            "budget allows (measured from the step time and the census's own duration)"
        )
        self.auto_check.toggled.connect(self.auto_toggled)
        self.filter_edit = QLineEdit()
        self.filter_edit.setPlaceholderText("Filter: name, dtype, device, shape, kind (all words)")
        self.filter_edit.setClearButtonEnabled(True)
        self.filter_edit.textChanged.connect(self.model.set_filter_text)
        # How many storages the filter lets through: an empty table under a header that
        # says "4.15 MiB in 11" must say why.
        self.match_label = QLabel()
        self.match_label.setToolTip("Storages that match every word of the filter")
        self.filter_edit.textChanged.connect(self._update_matches)
        self.model.modelReset.connect(self._update_matches)
        top = QHBoxLayout()
        top.addWidget(self.refresh_button)
        top.addWidget(self.auto_check)
        top.addWidget(self.filter_edit, 1)
        top.addWidget(self.match_label)

        # One line of totals above the table, the full breakdown on demand: the table
        # needs the height (at the default size the header once left it 3.5 rows).
        self.headline = QLabel(NO_CENSUS)
        self.headline.setTextInteractionFlags(Qt.TextSelectableByMouse)
        self.details_button = QToolButton()
        self.details_button.setText("Details")
        self.details_button.setCheckable(True)
        self.details_button.setToolTip(
            "Show the totals per device and kind, and what changed since the last census"
        )
        self.details_button.toggled.connect(self._show_details)
        head = QHBoxLayout()
        head.addWidget(self.headline, 1)
        head.addWidget(self.details_button)
        self.totals = QLabel("")
        self.totals.setWordWrap(True)
        self.totals.setTextInteractionFlags(Qt.TextSelectableByMouse)
        self.changes = QLabel("")
        self.changes.setWordWrap(True)
        self._show_details(False)

        self.view = QTreeView()
        self.view.setModel(self.model)
        self.view.setSortingEnabled(True)
        self.view.sortByColumn(2, Qt.DescendingOrder)
        self.view.setUniformRowHeights(True)
        self.view.setAlternatingRowColors(True)
        self.view.header().setSectionResizeMode(0, QHeaderView.Interactive)
        self.view.header().resizeSection(0, 380)
        self.view.header().resizeSection(1, 230)
        self.view.doubleClicked.connect(self.show_details)

        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addLayout(top)
        layout.addLayout(head)
        layout.addWidget(self.totals)
        layout.addWidget(self.changes)
        layout.addWidget(self.view, 1)

    @Slot()
    def _update_matches(self) -> None:
        census = self.model.census
        if not self.filter_edit.text().strip() or census is None:
            self.match_label.setText("")
            return
        shown, total = self.model.matching(), len(census.storages)
        text = f"{shown:,} of {total:,} storages match"
        self.match_label.setText(text if shown else f"<span style='color:#c0392b'>{text}</span>")

    def clear(self) -> None:
        """Forget the shown census and the filter (a new run or attach: a filter typed for
        the last one would hide the new one's rows)."""
        self.filter_edit.clear()
        self._shown = None
        self.model.set_census(None)
        self.headline.setText(NO_CENSUS)
        self.headline.setToolTip("")
        self.totals.setText("")
        self.changes.setText("")

    @Slot(bool)
    def _show_details(self, shown: bool) -> None:
        self.totals.setVisible(shown)
        self.changes.setVisible(shown)

    @Slot()
    def bind(self, bridge: SessionBridge) -> None:
        """Show each new census as it arrives."""
        bridge.when((CensusTaken,), self.refresh)

    def bind_view_state(self, state: ViewState) -> None:
        """Show the censuses of the process the window's view state chose."""
        state.scope_changed.connect(self.set_scope)
        self.set_scope(state.scope)

    @Slot(object)
    def set_scope(self, scope: str | None) -> None:
        """Show the censuses of one process of a job (the toolbar's rank filter)."""
        if scope is not None and not self.session.holds_tensors(scope):  # a sum: every process
            scope = None
        if scope == self.scope:
            return
        self.scope = scope
        if scope is not None and self.session.censuses(scope)[0] is None:
            self.clear()
            self.headline.setText(f"No census of {scope_label(scope)} yet.")
            return
        self.refresh()

    def refresh(self) -> None:
        """Show the Session's latest census (of the chosen process) if it is not shown yet."""
        latest, previous = self.session.censuses(self.scope)
        if latest is None or latest is self._shown:
            return
        self._shown = latest
        census = latest.census
        diff = census.diff(previous.census if previous else None)
        new_keys = {s.key for s in diff.new} if previous else set()
        self.model.set_census(census, new_keys)
        self.totals.setText(self._totals_text(latest))
        when = f"step {latest.step:,}" if latest.step else f"{latest.t:.1f} s"
        self.headline.setText(self._headline(latest, when, diff if previous else None))
        self.headline.setToolTip(self.totals.text())
        text = (
            f"Census at {when} ({'automatic' if latest.trigger == 'step' else 'refresh'}, "
            f"took {census.duration_s * 1000:.0f} ms)"
        )
        if previous is not None:
            grown = sum(d for _, d in diff.grown)
            text += (
                f" · since the last one: +{len(diff.new):,} storages "
                f"({format_bytes(diff.new_bytes)}), −{len(diff.freed):,} "
                f"({format_bytes(diff.freed_bytes)})"
                + (f", {len(diff.grown)} grown (+{format_bytes(grown)})" if diff.grown else "")
                + "; new rows are highlighted"
            )
        if census.skipped:
            reasons = sorted({s.reason for s in census.skipped})
            text += f" · {len(census.skipped)} skipped: " + "; ".join(reasons[:3])
        self.changes.setText(text)

    @staticmethod
    def _headline(taken: CensusTaken, when: str, diff: CensusDiff | None) -> str:
        """One line: bytes and tensors per device, named share, when, what changed."""
        census = taken.census
        count = sum(len(s.tensors) for s in census.storages.values())
        if not count:
            return f"Census at {when}: no live tensors found"
        parts = []
        for device in census.devices():
            n = sum(len(s.tensors) for s in census.storages.values() if s.device == device)
            nbytes = format_bytes(census.total_bytes(device))
            parts.append(f"<b>{process_device_label(taken.scope, device)}</b> {nbytes} in {n:,}")
        text = " · ".join(parts) + f" · {100 * census.named_share():.0f}% named · at {when}"
        if diff is not None and (diff.new or diff.freed):
            text += f" · +{len(diff.new):,} / −{len(diff.freed):,} storages"
        return text

    def _totals_text(self, taken: CensusTaken) -> str:
        census = taken.census
        if not any(s.tensors for s in census.storages.values()):
            return "The census found no live tensors."
        latest = self.session.latest()
        lines = []
        for device in census.devices() or ["cpu"]:
            unique, naive = census.total_bytes(device), census.naive_bytes(device)
            n = sum(len(s.tensors) for s in census.storages.values() if s.device == device)
            line = (
                f"<b>{process_device_label(taken.scope, device)}</b>: {format_bytes(unique)} "
                f"in {n:,} tensors "
                f"(unique storage bytes) · naive sum {format_bytes(naive)}"
            )
            key = SeriesName(taken.scope, device, "allocated").key
            allocated = latest.get(key, (math.nan, 0))[0]
            if device != "cpu" and not math.isnan(allocated):
                line += f" · {format_bytes(allocated - unique)} {GAP_LABEL}"
            kinds = census.bytes_by_kind(device)
            parts = [f"{KIND_LABELS[k]} {format_bytes(v)}" for k, v in kinds.items() if v]
            lines.append(line + "<br>&nbsp;&nbsp;" + ", ".join(parts))
        share = census.named_share()
        lines.append(f"{100 * share:.1f}% of the bytes carry a real name")
        return "<br>".join(lines)

    @Slot(QModelIndex)
    def show_details(self, index: QModelIndex) -> None:
        """A dialog with the tensor's details and what keeps it alive."""
        info = self.model.info_at(index)
        if info is not None:
            self.open_details(info)

    def open_details(self, info: StorageInfo | TensorInfo) -> TensorDetails:
        """Show the details of ``info`` at once; what keeps it alive follows when the
        process that owns it answers (an agent may take seconds)."""
        storage = self.model.census.storages.get(
            info.key if isinstance(info, StorageInfo) else info.storage_key
        )
        tensor = info.tensors[0] if isinstance(info, StorageInfo) and info.tensors else info
        if not isinstance(tensor, TensorInfo):
            answer: dict[str, Any] | str | None = NOT_A_TENSOR
        elif self.ask_referrers is None:
            answer = local_referrers(tensor)
        else:
            answer = None
        dialog = TensorDetails(info, storage, self, answer)
        if answer is None and self.ask_referrers is not None:
            request = self.ask_referrers(tensor, self._shown.scope if self._shown else "")
            self._waiting[request] = dialog
            dialog.destroyed.connect(lambda: self._waiting.pop(request, None))
        dialog.show()
        return dialog

    @Slot(int, object)
    def referrers_found(self, request: int, answer: object) -> None:
        """An answer to :attr:`ask_referrers`: shown in the dialog that asked, if open."""
        dialog = self._waiting.pop(request, None)
        if dialog is not None and isinstance(answer, (dict, str)):
            dialog.set_referrers(answer)


class TensorDetails(QDialog):
    """Details of one storage or tensor, with its referrer chain and grad_fn."""

    def __init__(
        self,
        info: StorageInfo | TensorInfo,
        storage: StorageInfo | None,
        parent: QWidget | None = None,
        referrers: dict[str, Any] | str | None = None,
    ) -> None:
        super().__init__(parent)
        self.setAttribute(Qt.WA_DeleteOnClose)  # modeless: freed when closed, by Qt
        self.setWindowTitle(f"Tensor: {info.name}")
        self.resize(640, 420)
        self.info, self.storage = info, storage
        text = QPlainTextEdit()
        text.setReadOnly(True)
        text.setPlainText(details_text(info, storage, referrers))
        buttons = QDialogButtonBox(QDialogButtonBox.Close)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addWidget(text)
        layout.addWidget(buttons)
        self.text = text

    def set_referrers(self, answer: dict[str, Any] | str) -> None:
        """Show what keeps the tensor alive, as its process answered."""
        self.text.setPlainText(details_text(self.info, self.storage, answer))


#: What a storage's details say where no tensor views it (nothing to look up).
NOT_A_TENSOR = ""


def local_referrers(tensor: TensorInfo) -> dict[str, Any] | str:
    """What keeps ``tensor`` alive, looked up in this process (a panel without a run)."""
    try:
        return referrers_of(tensor)
    except Exception as exc:
        return f"cannot look it up ({exc})"


def details_text(
    info: StorageInfo | TensorInfo,
    storage: StorageInfo | None,
    referrers: dict[str, Any] | str | None = None,
) -> str:
    """The details shown for a storage or a tensor (plain text).

    ``referrers`` is what the process that owns the tensor answered (:meth:`Source.
    referrers`), the reason it could not, or None while the question is on its way.
    """
    tensor = info.tensors[0] if isinstance(info, StorageInfo) and info.tensors else info
    lines = [f"Name: {info.name}"]
    if isinstance(tensor, TensorInfo):
        if len(tensor.names) > 1:
            lines.append("Also known as: " + ", ".join(tensor.names[1:]))
        lines += [
            f"Kind: {KIND_LABELS[tensor.kind]}",
            f"Shape: {list(tensor.shape)}   stride: {list(tensor.stride)}   "
            f"storage offset: {tensor.storage_offset}",
            f"Dtype: {tensor.dtype} ({tensor.element_size} B per element)   "
            f"elements: {tensor.numel:,}",
            f"Device: {tensor.device}{'   pinned' if tensor.pinned else ''}",
            f"Bytes it spans: {format_bytes(tensor.span_bytes)}   "
            f"contiguous: {tensor.is_contiguous}   view: {tensor.is_view}",
            f"requires_grad: {tensor.requires_grad}   is_leaf: {tensor.is_leaf}   "
            f"grad_fn: {tensor.grad_fn or '-'}",
        ]
    if storage is not None:
        lines.append(
            f"Storage: {format_bytes(storage.nbytes)} on {storage.device} at "
            f"0x{storage.key[1]:x}, viewed by {len(storage.tensors)} tensor(s): "
            + ", ".join(t.name for t in storage.tensors[:8])
        )
    answer = referrers
    if not isinstance(tensor, TensorInfo) or answer == NOT_A_TENSOR:
        return "\n".join(lines)
    if answer is None:
        lines.append("\nWhat keeps it alive: asking the process…")
        return "\n".join(lines)
    if isinstance(answer, str):  # a lost connection, a process that ended
        lines.append(f"\nWhat keeps it alive: {answer}.")
        return "\n".join(lines)
    if not answer.get("alive"):
        lines.append(
            "\nWhat keeps it alive: it has been freed since the census "
            "(or lives only inside the autograd graph)."
        )
    else:
        lines.append("\nWhat keeps it alive (nearest first):")
        chain = [str(hop) for hop in answer.get("chain", [])]
        lines += [f"  ← {hop}" for hop in chain] or ["  (nothing found in Python objects)"]
    return "\n".join(lines)
