"""Attach over SSH: private sshd instances on localhost stand in for the nodes of a job.

The viewer knows the nodes only by their ssh_config aliases (``TORCHMEM_SSH_CONFIG``), and
each node's agents publish in a runtime directory of their own, as on separate machines.
"""

from __future__ import annotations

import json
import socket
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil
import pytest
from conftest import SCRIPTS
from helpers import check_summary, end_process_tree
from sshd import Cluster, require_sshd
from test_agent import wait_until

from torchmem.cli.attach import attach_headless
from torchmem.transport.discovery import list_agents
from torchmem.transport.ssh import SshHost

pytestmark = pytest.mark.slow

#: How the nodes run torchmem: their PATH has no venv, as on a cluster.
REMOTE = f"{sys.executable} -m torchmem"
#: Another version's torchmem, speaking an older protocol.
OLD = f"{sys.executable} {SCRIPTS / 'old_torchmem.py'}"


@pytest.fixture(scope="module")
def cluster():
    require_sshd()
    root = Path(tempfile.mkdtemp(prefix="tm-ssh-"))
    root.chmod(0o700)
    cluster = Cluster(root, ("node-a", "node-b"))
    yield cluster
    cluster.stop()


@pytest.fixture
def nodes(cluster, runtime_dir, monkeypatch):
    """The cluster, with this test's viewer using its ssh_config."""
    monkeypatch.setenv("TORCHMEM_SSH_CONFIG", str(cluster.config))
    return cluster.nodes


def start_on(node, args):
    """A process started "on" ``node``: its agent publishes in the node's directory."""
    return subprocess.Popen(
        [sys.executable, "-m", "torchmem", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=node.env(),
    )


def ranks_on(node, count, timeout=180):
    """Wait for ``count`` ranks of a job to serve on ``node``."""

    def ranks():
        return [e for e in list_agents(node.runtime) if e.rank is not None]

    wait_until(lambda: len(ranks()) >= count, timeout, "ranks on the node")


def agent_of(node, proc, timeout=90):
    """The entry of ``proc``'s agent on ``node``, once it is up."""

    def entry():
        return next((e for e in list_agents(node.runtime) if e.pid == proc.pid), None)

    wait_until(lambda: entry() is not None, timeout, f"the agent of {proc.pid}")
    return entry()


def stop(proc):
    end_process_tree(proc)


def torchmem(*args, timeout=120):
    return subprocess.run(
        [sys.executable, "-m", "torchmem", *args], capture_output=True, text=True, timeout=timeout
    )


def our_ssh_processes():
    """ssh clients this test started (their command lines name a node alias)."""
    found = []
    for proc in psutil.process_iter(["name", "cmdline"]):
        cmd = proc.info["cmdline"] or []
        if proc.info["name"] == "ssh" and any(a in ("node-a", "node-b") for a in cmd):
            found.append(proc)
    return found


def test_ps_over_ssh_lists_the_hosts_agents_without_their_tokens(nodes):
    node = nodes["node-a"]
    proc = start_on(node, ["run", "--attachable", str(SCRIPTS / "train_forever.py")])
    try:
        entry = agent_of(node, proc)
        done = torchmem("ps", "--host", "node-a", "--remote-command", REMOTE, "--json")
        assert done.returncode == 0, done.stderr
        rows = json.loads(done.stdout)
        row = next(r for r in rows if r["pid"] == proc.pid)
        assert row["attachable"] and row["host"] == "node-a"
        assert entry.token not in done.stdout
        table = torchmem("ps", "--host", "node-a", "--remote-command", REMOTE, "--agents")
        assert str(proc.pid) in table.stdout and "train_forever" in table.stdout
    finally:
        stop(proc)


def test_attach_over_ssh_collects_through_a_private_socket_and_leaves_nothing(
    nodes, runtime_dir, tmp_path
):
    node = nodes["node-a"]
    proc = start_on(node, ["run", "--attachable", str(SCRIPTS / "train_forever.py")])
    try:
        entry = agent_of(node, proc)
        out = tmp_path / "attach.json"
        attach = subprocess.Popen(
            [sys.executable, "-m", "torchmem", "attach", "--host", "node-a", "--remote-command",
             REMOTE, "--duration", "3", "--summary", str(out), str(proc.pid)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        wait_until(lambda: list(runtime_dir.glob("ssh-*/*.sock")), 60, "the forwarded socket")
        (sock,) = runtime_dir.glob("ssh-*/*.sock")
        assert stat.S_IMODE(sock.parent.stat().st_mode) == 0o700
        assert stat.S_IMODE(sock.stat().st_mode) == 0o600
        # The token travels through the SSH session's pipe, never an argv on either side.
        for other in psutil.process_iter(["cmdline"]):
            assert entry.token not in " ".join(other.info["cmdline"] or [])
        _, err = attach.communicate(timeout=60)
        assert attach.returncode == 0, err
        assert "attached to pid" in err and "on node-a" in err
        data = check_summary(json.loads(out.read_text()))
        assert data["attached"] == "agent" and data["samples"] > 10 and data["steps"] > 0
        assert [(r["pid"], r["host"]) for r in data["ranks"]] == [(proc.pid, "node-a")]
        assert entry.token not in out.read_text() + err
        assert not list(runtime_dir.glob("ssh-*")), "the local sockets are removed"
        assert not our_ssh_processes(), "every ssh process ended"
    finally:
        stop(proc)


def test_refusals_say_what_to_do_and_leave_no_process(nodes, tmp_path):
    bad_hostfile = tmp_path / "hosts"
    bad_hostfile.write_text("node-a slots=2\n-oProxyCommand=evil slots=1\n")
    cases = [
        (["ps", "--host", "no-such-node.invalid"], "unknown host 'no-such-node.invalid'"),
        (["ps", "--host", "refusing"], "refusing refused our key"),
        (["ps", "--host", "nobody-listens"], "refused the SSH connection"),
        (["ps", "--host", "node-a"], "torchmem is not installed on node-a"),
        (["attach", "--host", "node-a", "--remote-command", REMOTE, "1"], "has no agent"),
        (
            ["attach", "--host", "node-a", "--remote-command", OLD, "1"],
            "(0.0.9) speaks protocol 1, this one 2: install the same torchmem version",
        ),
        (["attach", "--hostfile", str(bad_hostfile)], "line 2"),
        (["attach", "--hostfile", str(tmp_path / "missing")], "cannot read the hostfile"),
        (["attach", "--host", "node-a", "--host", "node-b", "42"], "give one --host"),
    ]
    for args, expected in cases:
        done = torchmem(*args)
        assert done.returncode != 0, args
        assert expected in done.stderr, (args, done.stderr)
        assert "Traceback" not in done.stderr, done.stderr
        assert "password" not in done.stdout.lower()
    assert not our_ssh_processes()


def test_a_dropped_ssh_connection_ends_the_view_as_lost_not_as_a_crash(nodes):
    from torchmem.events import RunStatus
    from torchmem.session import Session
    from torchmem.sources.attached import AttachedRun

    node = nodes["node-a"]
    proc = start_on(node, ["run", "--attachable", str(SCRIPTS / "train_forever.py")])
    try:
        agent_of(node, proc)
        session = Session()
        run = AttachedRun(session, proc.pid, hosts=[SshHost("node-a", REMOTE)])
        run.connect()
        assert run.reporting() == (1, 1)
        wait_until(lambda: session.steps.steps > 3, 30, "steps over ssh")
        (tunnel,) = run.tunnels
        tunnel.proc.kill()
        wait_until(lambda: run.ended, 30, "the view to notice the lost connection")
        finished = session.run_finished
        assert finished is not None and finished.status is RunStatus.FAILED
        assert "lost the connection" in finished.message and "SSH" in finished.message
        assert run.reporting() == (0, 1)
        assert proc.poll() is None, "the training on the node goes on"
        run.close()
        assert not our_ssh_processes()
    finally:
        stop(proc)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def two_node_job(cluster):
    """A torchrun job of 2 nodes x 2 ranks (gloo on CPU, a localhost rendezvous)."""
    port = _free_port()
    launchers = [
        start_on(node, [
            "run", "--", sys.executable, "-m", "torch.distributed.run", "--nnodes", "2",
            "--nproc_per_node", "2", "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "tmjob",
            str(SCRIPTS / "ddp_train.py"), "--sleep", "0.05",
        ])
        for node in cluster.nodes.values()
    ]  # fmt: skip
    try:
        for node in cluster.nodes.values():
            ranks_on(node, 2)
        yield launchers
    finally:
        for launcher in launchers:
            stop(launcher)


def test_every_rank_of_a_two_node_torchrun_job_in_one_summary(nodes, two_node_job, tmp_path):
    out = tmp_path / "job.json"
    hosts = [SshHost(alias, REMOTE) for alias in nodes]
    assert attach_headless(None, 3.0, str(out), quiet=True, hosts=hosts) == 0
    data = check_summary(json.loads(out.read_text()))
    ranks = sorted((r["rank"], r["world_size"]) for r in data["ranks"])
    assert ranks == [(0, 4), (1, 4), (2, 4), (3, 4)]
    assert {r["host"] for r in data["ranks"]} == {"node-a", "node-b"}
    peaks = data["peak_bytes"]
    assert {f"rank{i}/cpu_rss" for i in range(4)} | {"total/cpu_rss"} <= set(peaks)
    assert peaks["total/cpu_rss"] > max(peaks[f"rank{i}/cpu_rss"] for i in range(4))
    # Each machine's total: its two ranks, less than the job's.
    for node in ("@node-a", "@node-b"):
        assert peaks[f"{node}/cpu_rss"] < peaks["total/cpu_rss"]
    assert data["pid"] is None
    assert not our_ssh_processes()

    # A host that cannot be reached is said, and the others are attached all the same.
    from torchmem.session import Session
    from torchmem.sources.attached import AttachedRun

    session = Session()
    run = AttachedRun(session, None, hosts=[SshHost("nobody-listens"), hosts[0]])
    run.connect()
    try:
        assert {r.entry.host for r in run.remotes} == {"node-a"} and len(run.remotes) == 2
        assert any("nobody-listens refused the SSH connection" in r.text for r in session.logs)
    finally:
        run.close()
    assert not our_ssh_processes()


def test_the_window_shows_both_nodes_and_goes_on_when_one_drops(
    nodes, two_node_job, qtbot, make_window
):
    window = make_window()
    window.attach(None, hosts=[SshHost(alias, REMOTE) for alias in nodes])
    qtbot.waitUntil(lambda: window.rank_combo.count() == 8, timeout=60_000)
    items = [window.rank_combo.itemText(i) for i in range(window.rank_combo.count())]
    assert items == [
        "Every rank", "Rank 0", "Rank 1", "Rank 2", "Rank 3", "Node node-a", "Node node-b",
        "Total",
    ]  # fmt: skip
    qtbot.waitUntil(lambda: "2 of 2 nodes reporting" in window.run_label.text(), timeout=30_000)
    assert "node-a, node-b" in window.windowTitle()

    # node-b's connection dies: its ranks are marked ended, node-a's go on.
    tunnel = next(t for t in window.attached.tunnels if t.host.target == "node-b")
    tunnel.proc.kill()
    qtbot.waitUntil(lambda: "1 of 2 nodes reporting" in window.run_label.text(), timeout=30_000)
    assert window.running and window.session.run_finished is None
    banner = window.banner.text()
    assert "Lost the SSH connection to node-b" in banner and "other nodes go on" in banner
    steps = window.session.steps.steps
    qtbot.waitUntil(lambda: window.session.steps.steps > steps + 3, timeout=30_000)
    labels = {m.label for m in window.session.user_markers()}
    dropped = {
        f"rank {r.entry.rank} ended" for r in window.attached.remotes if r.entry.host == "node-b"
    }
    assert len(dropped) == 2 and dropped <= labels, labels

    # Reconnect: detached, then attached again to both nodes.
    window.banner.action_button.click()
    qtbot.waitUntil(lambda: "2 of 2 nodes reporting" in window.run_label.text(), timeout=60_000)
    assert len(window.attached.tunnels) == 2
    window.detach()
    qtbot.waitUntil(lambda: not window.running, timeout=15_000)
    assert not our_ssh_processes(), "detaching ends every ssh process"


def test_the_attach_dialog_lists_a_host_and_attaches_through_it(nodes, qtbot, settings_path):
    from PySide6.QtCore import QSettings

    from torchmem.gui.dialogs.attach_dialog import AttachDialog

    node = nodes["node-a"]
    proc = start_on(node, ["run", "--attachable", str(SCRIPTS / "train_forever.py")])
    try:
        agent_of(node, proc)
        settings = QSettings(settings_path, QSettings.IniFormat)
        dialog = AttachDialog(settings=settings)
        try:
            dialog.host_combo.setEditText("refusing")
            dialog.host_combo.lineEdit().returnPressed.emit()
            qtbot.waitUntil(lambda: "refused our key" in dialog.status.text(), timeout=30_000)
            assert not dialog.attach_button.isEnabled()

            # A new host: its torchmem is not on the PATH there; the message says what to do.
            dialog.host_combo.setEditText("node-a")
            dialog.host_combo.lineEdit().returnPressed.emit()
            qtbot.waitUntil(lambda: "--remote-command" in dialog.status.text(), timeout=30_000)
            assert "not installed on node-a" in dialog.status.text()
            dialog.command_edit.setText(REMOTE)
            dialog.command_edit.editingFinished.emit()
            qtbot.waitUntil(lambda: bool(dialog.model.rows), timeout=30_000)
            pids = [row.pid for row in dialog.model.rows]
            assert proc.pid in pids and "on node-a" in dialog.status.text()
            dialog.table.selectRow(pids.index(proc.pid))
            assert dialog.attach_button.isEnabled(), (dialog.host(), dialog._selected_row())
            dialog.accept()
            assert dialog.chosen_pid == proc.pid
            assert dialog.chosen_host == SshHost("node-a", REMOTE)
            assert settings.value("attach/recent_hosts") == ["node-a"]
            assert settings.value("attach/command/node-a") == REMOTE
        finally:
            dialog.done(0)

        again = AttachDialog(settings=settings)  # the host and its command, offered again
        try:
            assert again.host_combo.findText("node-a") == 1
            again.host_combo.setCurrentIndex(1)
            again.host_combo.activated.emit(1)
            assert again.command_edit.text() == REMOTE and again.command_edit.isEnabled()
        finally:
            again.done(0)
    finally:
        stop(proc)
