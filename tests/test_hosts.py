"""Naming the hosts of a job: hostfiles, Slurm, and the refusals of bad names."""

from __future__ import annotations

import pytest

from torchmem.transport.hosts import allocation_hosts, job_hosts, parse_hostfile
from torchmem.transport.ssh import SshError, SshHost, explain_ssh_failure


def test_an_mpi_hostfile_gives_each_host_once_in_order():
    text = "# the job\nnode1 slots=8\nnode2 slots=8 max_slots=8\n\nuser@node3  # login\nnode1\n"
    assert parse_hostfile(text) == ["node1", "node2", "user@node3"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("node1 slots=x\n", "line 1: 'slots=x' is not slots=N"),
        ("node1\n-oProxyCommand=evil\n", "line 2: '-oProxyCommand=evil' is not a host name"),
        ("node1;rm slots=1\n", "is not a host name"),
        ("# nothing\n\n", "names no host"),
    ],
)
def test_a_bad_hostfile_names_its_line(text, expected):
    with pytest.raises(SshError, match=expected):
        parse_hostfile(text)


def test_hosts_from_every_way_are_merged_without_repeats(tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("node2 slots=4\nnode3 slots=4\n")
    hosts = job_hosts(["node1", "node2"], str(hostfile), remote_command="/venv/bin/torchmem")
    assert [h.target for h in hosts] == ["node1", "node2", "node3"]
    assert all(h.remote_command == "/venv/bin/torchmem" for h in hosts)
    assert SshHost("user@node1").name == "node1"


def test_outside_a_slurm_allocation_the_message_says_so(monkeypatch):
    monkeypatch.delenv("SLURM_JOB_NODELIST", raising=False)
    with pytest.raises(SshError, match="not inside a Slurm allocation"):
        allocation_hosts()


def test_ssh_failures_are_explained_with_what_to_do():
    changed = "@ WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED! @\nHost key verification failed."
    assert "ssh-keygen -R node1" in explain_ssh_failure("node1", changed)
    denied = "user@node1: Permission denied (publickey)."
    assert "ssh-copy-id node1" in explain_ssh_failure("node1", denied)
    assert "never asks for a password" in explain_ssh_failure("node1", denied)
    timeout = "ssh: connect to host node1 port 22: Connection timed out"
    assert "timed out" in explain_ssh_failure("node1", timeout)
