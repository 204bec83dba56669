"""Attaching over SSH: latency next to the local socket, and the cost of 16 ranks.

A private sshd on localhost stands in for a remote node (the tests' fake node, whose
sessions have their own agent directory), so the SSH path is measured without a network:
what it adds is ssh's encryption and two extra hops through ssh and sshd.

1. Sample-to-plot latency, p50 / p99: a served script "on the node", read once through
   its local socket and once through ``AttachedRun(hosts=[node])``, in alternating
   rounds; the delay from the reading in the agent's process to the window's 30 Hz bridge
   handing it to the views (as ``agent_overhead.py`` part 2 measures it).
2. 16 agents at 10 Hz under one launcher on the node, attached over one ssh tunnel: CPU
   of the ssh client, of the sshd processes serving it, and of this viewer.

    QT_QPA_PLATFORM=offscreen .venv/bin/python benchmarks/ssh_attach.py
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import report
from agent_overhead import FLEET, SERVED, _qt_app, delays_of

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))  # the fake node of the SSH tests
from sshd import Cluster  # noqa: E402

from torchmem.session import Session  # noqa: E402
from torchmem.sources.attached import AttachedRun  # noqa: E402
from torchmem.sources.remote import RemoteSource  # noqa: E402
from torchmem.transport.discovery import list_agents  # noqa: E402
from torchmem.transport.ssh import SshHost  # noqa: E402

REMOTE = f"{sys.executable} -m torchmem"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


def latency(node, rounds: int, seconds: float) -> None:
    _qt_app()
    proc = subprocess.Popen(
        [sys.executable, str(SERVED), "--sleep", "0.02"], stdout=subprocess.DEVNULL,
        env=node.env(),
    )  # fmt: skip
    try:
        while not list_agents(node.runtime):
            time.sleep(0.05)
        (entry,) = list_agents(node.runtime)
        local: list[float] = []
        ssh: list[float] = []
        for _ in range(rounds):  # alternating, so that both see the same machine load
            session = Session()
            remote = RemoteSource(session, entry)
            remote.connect()
            local += delays_of(session, seconds)
            remote.close()
            session = Session()
            run = AttachedRun(session, proc.pid, hosts=[SshHost(node.alias, REMOTE)])
            run.connect()
            ssh += delays_of(session, seconds)
            run.close()
    finally:
        proc.kill()
        proc.wait()
    print(f"\n1. sample-to-plot latency, {rounds} alternating rounds of {seconds:g} s at 10 Hz")
    print(f"{'path':<22}{'samples':>8}{'p50 ms':>9}{'p99 ms':>9}{'max ms':>9}")
    for name, values in (("local socket", local), ("SSH tunnel (localhost)", ssh)):
        print(
            f"{name:<22}{len(values):>8}{percentile(values, 0.5) * 1e3:>9.1f}"
            f"{percentile(values, 0.99) * 1e3:>9.1f}{max(values) * 1e3:>9.1f}"
        )
    p99 = percentile(ssh, 0.99)
    report.row(
        "sample-to-plot latency p99 through SSH", f"{p99 * 1e3:.1f} ms", "<= 50 ms",
        p99 <= 0.050,
        f"{len(ssh)} samples, sshd on localhost; local socket p99 "
        f"{percentile(local, 0.99) * 1e3:.1f} ms alongside",
    )  # fmt: skip


def cpu_of(procs: list[psutil.Process]) -> float:
    total = 0.0
    for proc in procs:
        try:
            times = proc.cpu_times()
            total += times.user + times.system
        except psutil.Error:
            pass
    return total


def fleet(node, n: int, seconds: float, settle: float = 5.0) -> None:
    launcher = subprocess.Popen([sys.executable, "-c", FLEET, str(SERVED), str(n)], env=node.env())
    try:
        deadline = time.monotonic() + 240
        while len(list_agents(node.runtime)) < n and time.monotonic() < deadline:
            time.sleep(0.2)
        agents = len(list_agents(node.runtime))
        session = Session()
        run = AttachedRun(session, launcher.pid, hosts=[SshHost(node.alias, REMOTE)])
        run.connect()
        time.sleep(settle)  # past the replays: their burst is not the steady cost
        (tunnel,) = run.tunnels
        client = psutil.Process(tunnel.proc.pid)
        # The sshd processes serving the tunnel: children of the node's sshd.
        servers = psutil.Process(node.proc.pid).children(recursive=True)
        me = psutil.Process()
        before = (cpu_of([client]), cpu_of(servers), cpu_of([me]), session.samples)
        t0 = time.monotonic()
        time.sleep(seconds)
        elapsed = time.monotonic() - t0
        after = (cpu_of([client]), cpu_of(servers), cpu_of([me]), session.samples)
        run.close()
    finally:
        children = psutil.Process(launcher.pid).children(recursive=True)
        launcher.kill()
        launcher.wait()
        for child in children:
            child.kill()
    share = [100 * (a - b) / elapsed for a, b in zip(after[:3], before[:3], strict=True)]
    rate = (after[3] - before[3]) / elapsed
    print(f"\n2. {agents} agents at 10 Hz attached over one SSH tunnel, {elapsed:.0f} s")
    print(f"ssh client {share[0]:.1f}% of a core; sshd {share[1]:.1f}%; viewer {share[2]:.1f}%")
    print(f"{rate:.0f} samples/s received (ranks and their total)")
    report.row(
        f"{agents} agents over one SSH tunnel: ssh + sshd CPU",
        f"{share[0] + share[1]:.1f}% of a core", "", None, f"{elapsed:.0f} s at 10 Hz",
    )  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--agents", type=int, default=16)
    p.add_argument("--parts", default="12")
    p.add_argument(
        "--settle",
        type=float,
        default=5.0,
        help="seconds between attaching the fleet and measuring (5)",
    )
    args = p.parse_args()
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    os.environ.setdefault("TORCHMEM_RUNTIME_DIR", tempfile.mkdtemp(prefix="tm-bench-"))
    root = Path(tempfile.mkdtemp(prefix="tm-ssh-bench-"))
    root.chmod(0o700)
    cluster = Cluster(root, ("node-a",))
    os.environ["TORCHMEM_SSH_CONFIG"] = str(cluster.config)
    node = cluster.nodes["node-a"]
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores")
    try:
        if "1" in args.parts:
            latency(node, args.rounds, args.seconds)
        if "2" in args.parts:
            fleet(node, args.agents, args.seconds * 2, args.settle)
    finally:
        cluster.stop()


if __name__ == "__main__":
    main()
