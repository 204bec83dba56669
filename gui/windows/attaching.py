"""The window's attached runs as the user sees them: the Attach dialog, the title and the
banner once attached, nodes of a multi-node job that stop reporting, and Reconnect.

A part of the window, as :mod:`recordings` is: it acts on the window's labels, banner and
views, so it holds the window. Following the processes in a thread is
:class:`~torchmem.gui.run_controller.RunController`'s; this is what the user sees of it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from PySide6.QtCore import QObject, QTimer, Slot

if TYPE_CHECKING:
    from torchmem.gui.windows.main_window import MainWindow
    from torchmem.transport.ssh import SshHost


class Attaching(QObject):
    """Attach, detach and reconnect for one window, and what each shows."""

    def __init__(self, window: MainWindow) -> None:
        super().__init__(window)
        self.window = window
        #: The last attach over SSH (pid, hosts), for Reconnect.
        self.ssh: tuple[int | None, list[SshHost]] | None = None
        #: The nodes said lost so far in this attach (each is said once).
        self._lost_shown: set[str] = set()
        #: Reconnect asked for while still attached: attach again once detached.
        self._reconnect_pending = False
        runs = window.runs
        runs.attached_to.connect(self._on_attached)
        runs.attach_failed.connect(self._on_attach_failed)
        runs.inject_due.connect(self._attach_injected)

    # -- the user's actions ---------------------------------------------------------------
    @Slot()
    def open_dialog(self) -> None:
        """Pick a running process and attach to it."""
        from torchmem.gui.dialogs.attach_dialog import AttachDialog

        w = self.window
        dialog = AttachDialog(w, w.settings)
        accepted = dialog.exec()
        pid, host = dialog.chosen_pid, dialog.chosen_host
        dialog.deleteLater()  # destroyed by this thread's event loop, never by a gc elsewhere
        if accepted and pid is not None:
            self.attach(pid, hosts=[host] if host is not None else None)

    @Slot()
    def inject_agent(self) -> None:
        """Replace the outside watch of the attached process by an injected agent."""
        self.window.runs.inject()

    def attach(
        self,
        pid: int | None,
        entries: list | None = None,
        inject: bool = False,
        hosts: list[SshHost] | None = None,
    ) -> bool:
        """Show process ``pid`` (and its ranks) in the window, following it in a QThread.

        ``entries`` reach agents without discovery (a socket forwarded from another host);
        ``hosts`` are SSH hosts: ``pid`` on the one host, or (``pid`` None) every agent of
        every host, such as the ranks of a multi-node job.
        """
        w = self.window
        if w.running:
            w.show_error("Stop the running script (Shift+F5) or detach before attaching.")
            return False
        w.banner.hide()
        w.clear_views()
        self.ssh = (pid, list(hosts)) if hosts else None
        self._lost_shown = set()
        w.runs.start_attach(pid, w.rate_spin.value(), entries, inject, hosts)
        where = ", ".join(h.target for h in hosts or [])
        what = f"pid {pid}" if pid is not None else where
        if pid is not None and where:
            what += f" on {where}"
        w.setWindowTitle(f"{what} – torchmem")
        w.run_label.setText(f"Attaching to {what}…" + (" (over SSH)" if hosts else ""))
        w.update_actions()
        return True

    @Slot()
    def detach(self) -> None:
        """Stop following the attached process (it carries on)."""
        w = self.window
        if w.attached is not None:
            w.runs.detach()
            w.statusBar().showMessage("Detached", 5000)

    @Slot()
    def reconnect(self) -> None:
        """Attach again to what the last SSH attach reached (detaching first if needed)."""
        if self.ssh is None:
            return
        if self.window.running:
            self._reconnect_pending = True
            self.detach()
            return
        pid, hosts = self.ssh
        self.attach(pid, hosts=hosts)

    # -- what the window shows ------------------------------------------------------------
    def nodes_text(self) -> str:
        """`` · N of M nodes reporting`` while a multi-node job is followed ("" otherwise);
        a node that stopped reporting is said once, with Reconnect."""
        run = self.window.attached
        if run is None or len(run.hosts) <= 1:
            return ""
        alive, hosts = run.reporting()
        lost = set(run.lost_hosts())
        if lost - self._lost_shown:
            self._lost_shown |= lost
            self._offer_reconnect(sorted(lost), others_go_on=True)
        return f" · {alive} of {hosts} nodes reporting"

    def on_run_ended(self) -> None:
        """After the followed run ended: a pending Reconnect attaches again, and SSH nodes
        lost at the end are offered one."""
        runs = self.window.runs
        if self._reconnect_pending:
            self._reconnect_pending = False
            QTimer.singleShot(0, self.reconnect)
        elif runs.lost_hosts and self.ssh is not None:
            self._offer_reconnect(runs.lost_hosts, others_go_on=False)

    def _offer_reconnect(self, lost: list[str], others_go_on: bool) -> None:
        names = ", ".join(lost)
        text = (
            f"Lost the SSH connection to {names} (or its processes ended without a word). "
            + ("The other nodes go on; " if others_go_on else "")
            + "the traces so far are kept. Reconnect attaches again: the agents send what "
            "they kept meanwhile."
        )
        what = ", ".join(h.target for h in self.ssh[1]) if self.ssh else ""
        self.window.banner.show_message(
            text, "warning", ("Reconnect", self.reconnect, f"Attach again over SSH to {what}")
        )

    @Slot(str)
    def _on_attached(self, label: str) -> None:
        w = self.window
        run = w.attached
        if run is None:
            return
        w.setWindowTitle(f"{label} – torchmem")
        w.run_label.setText(f"● Attached to {label}")
        w.statusBar().showMessage(f"Attached to {label}", 10000)
        if not run.has_agent:
            w.banner.show_message(
                f"{label}: watched from outside, without an agent: RSS and GPU memory only "
                "(GPU figures include the CUDA context and caches). For steps, tensors and "
                "alerts: Run > Inject the agent (experimental), or add torchmem.serve() to "
                "the script, or start it with `torchmem run --attachable`.",
                "info",
            )
        w.update_actions()

    @Slot(str)
    def _on_attach_failed(self, message: str) -> None:
        self.window.show_error(f"Cannot attach: {message}")

    @Slot(int)
    def _attach_injected(self, pid: int) -> None:
        QTimer.singleShot(0, lambda: self.attach(pid, inject=True))
