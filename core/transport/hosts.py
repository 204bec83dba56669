"""The hosts of a job without typing them: hostfiles, Slurm jobs and allocations.

A multi-node job is known to its launcher by a list of hosts: an MPI-style hostfile
(``node1 slots=8`` per line, ``#`` comments), a Slurm job's node list (expanded by
``scontrol show hostnames``, run where Slurm is), or ``SLURM_JOB_NODELIST`` inside an
allocation. Each becomes the list of ``--host`` targets, in order, without repeats.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from torchmem.transport.ssh import SshError, SshHost, check_target

SLURM_NODELIST_ENV = "SLURM_JOB_NODELIST"


def parse_hostfile(text: str, source: str = "the hostfile") -> list[str]:
    """The hosts of an MPI-style hostfile (``host [slots=N] [max_slots=N]`` lines)."""
    hosts: list[str] = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        host, *options = line.split()
        for option in options:
            key, sep, value = option.partition("=")
            if not sep or key not in ("slots", "max_slots", "max-slots") or not value.isdigit():
                raise SshError(f"{source}, line {number}: {option!r} is not slots=N")
        try:
            check_target(host)
        except SshError as exc:
            raise SshError(f"{source}, line {number}: {exc}") from None
        if host not in hosts:
            hosts.append(host)
    if not hosts:
        raise SshError(f"{source} names no host")
    return hosts


def read_hostfile(path: str) -> list[str]:
    """The hosts of the hostfile at ``path``; :class:`SshError` says what is wrong."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise SshError(f"cannot read the hostfile {path}: {exc.strerror}") from None
    return parse_hostfile(text, path)


def expand_nodelist(nodelist: str) -> list[str]:
    """Slurm's compressed node list (``node[1-3,7]``) as hostnames, by ``scontrol``."""
    scontrol = shutil.which("scontrol")
    if scontrol is None:
        raise SshError(
            "scontrol is not installed here: run torchmem where Slurm is (a login node), "
            "or list the hosts in a hostfile (--hostfile)"
        )
    done = subprocess.run(
        [scontrol, "show", "hostnames", nodelist], capture_output=True, text=True, timeout=30
    )
    if done.returncode != 0:
        raise SshError(f"scontrol cannot expand {nodelist!r}: {done.stderr.strip()}")
    return parse_hostfile(done.stdout, f"scontrol show hostnames {nodelist}")


def slurm_job_hosts(job: str) -> list[str]:
    """The nodes of Slurm job ``job`` (its node list from ``squeue``)."""
    if not job.replace("_", "").isdigit():
        raise SshError(f"{job!r} is not a Slurm job id")
    squeue = shutil.which("squeue")
    if squeue is None:
        raise SshError("squeue is not installed here: run torchmem where Slurm is")
    done = subprocess.run(
        [squeue, "-h", "-j", job, "-o", "%N"], capture_output=True, text=True, timeout=30
    )
    nodelist = done.stdout.strip()
    if done.returncode != 0 or not nodelist:
        raise SshError(f"Slurm knows no running job {job}: {done.stderr.strip() or 'no nodes'}")
    return expand_nodelist(nodelist)


def allocation_hosts() -> list[str]:
    """The nodes of the Slurm allocation this command runs in."""
    nodelist = os.environ.get(SLURM_NODELIST_ENV)
    if not nodelist:
        raise SshError(f"{SLURM_NODELIST_ENV} is not set: this is not inside a Slurm allocation")
    return expand_nodelist(nodelist)


def job_hosts(
    hosts: list[str] | None = None,
    hostfile: str | None = None,
    slurm_job: str | None = None,
    slurm: bool = False,
    remote_command: str | None = None,
) -> list[SshHost]:
    """Every host named by any of the ways, in order and once each (empty: none named)."""
    names = list(hosts or [])
    if hostfile:
        names += read_hostfile(hostfile)
    if slurm_job:
        names += slurm_job_hosts(slurm_job)
    if slurm:
        names += allocation_hosts()
    unique = list(dict.fromkeys(names))
    return [SshHost(name, remote_command) for name in unique]
