"""Watching a process without an agent from outside: its RSS, and its GPU memory by NVML."""

from __future__ import annotations

import psutil

from torchmem.events import EXIT_UNKNOWN, CapacityKnown, RunFinished, RunStarted, RunStatus
from torchmem.probe.backends import backends_capacity, process_backends
from torchmem.probe.sampler import Sampler
from torchmem.session import Session
from torchmem.sources.vanished import oom_killer_hint
from torchmem.transport.client import AttachError


class ProcessWatchSource:
    """Watches a process without an agent from outside: RSS and NVML per-process memory."""

    def __init__(self, session: Session, pid: int, hz: float = 10.0) -> None:
        try:
            self.process = psutil.Process(pid)
            cmdline = self.process.cmdline()
        except psutil.NoSuchProcess:
            raise AttachError(f"no process with pid {pid}") from None
        except psutil.AccessDenied:
            raise AttachError(f"process {pid} belongs to another user") from None
        self.session = session
        self.pid = pid
        self.cmdline = cmdline
        self.backends = process_backends(pid)
        self.sampler = Sampler(self.backends, session.submit, hz, clock=session.now)
        self.has_accelerator = False
        self.ended = False

    def capacity(self) -> dict[str, int]:
        """Total memory per device, where known."""
        return backends_capacity(self.backends)

    def start(self) -> None:
        """Start sampling; the Session hears that a watch started."""
        s = self.session
        s.submit(RunStarted(s.now(), " ".join(self.cmdline[:1]), tuple(self.cmdline[1:]), "watch"))
        s.submit(CapacityKnown(s.now(), self.capacity()))
        s.note(
            f"watching process {self.pid} from outside: RSS"
            + (
                " and GPU memory as the driver reports it (CUDA context and caches included)"
                if len(self.backends) > 1
                else ""
            )
            + ". Inject the agent for steps, tensors and alerts."
        )
        self.sampler.start()

    def check(self) -> bool:
        """True while the process lives; reports its end once."""
        if self.ended:
            return False
        try:
            if self.process.is_running() and self.process.status() != psutil.STATUS_ZOMBIE:
                return True
        except psutil.Error:  # it vanished between the two questions: it ended
            pass
        self.ended = True
        self.sampler.stop()
        s = self.session
        # Only its parent can read how it exited: never "finished, code 0". Its last
        # readings may still say that the machine ran out of RAM.
        hint = oom_killer_hint(s)
        started = s.run_started
        s.submit(
            RunFinished(
                s.now(),
                RunStatus.KILLED if hint else RunStatus.ENDED,
                EXIT_UNKNOWN,
                f"process {self.pid} exited (watched from outside: its exit status is its "
                f"parent's to read){hint}",
                duration_s=s.now() - started.t if started is not None else 0.0,
            )
        )
        return False

    def close(self) -> None:
        """Stop sampling."""
        self.sampler.stop()
