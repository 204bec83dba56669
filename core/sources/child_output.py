"""The terminal of an isolated run's child, read into the Session as log records.

The child's agent forwards what its script prints through ``sys.stdout``. What does not
pass there reaches only the child's file descriptors 1 and 2: DataLoader workers and
``mp.spawn`` processes (the DDP tutorial's ranks print from there), C and C++ libraries
(gloo, NCCL, faulthandler's crash report). The child echoes nothing of its own there
(``torchmem run --no-echo``), so each line reaches the Log pane once, by one of the two
ways. Each pipe is read by a thread of its own until every process holding it is gone.
"""

from __future__ import annotations

import codecs
import os
import threading
from typing import IO

from torchmem.events import LogRecord, Stream
from torchmem.session import Session

#: The bytes of stderr kept for the run's closing message (the last line of a crash).
TAIL_BYTES = 4000


class ChildOutput:
    """Reads one of a child's pipes into ``session`` in whole lines, keeping its tail."""

    def __init__(self, pipe: IO[bytes], stream: Stream, session: Session) -> None:
        self.stream = stream
        self._fd = pipe.fileno()
        self._pipe = pipe  # kept open (and alive) until the thread has read it to its end
        self._session = session
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._partial = ""
        self._tail = bytearray()
        self._thread = threading.Thread(
            target=self._read, name=f"torchmem-child-{stream.value}", daemon=True
        )
        self._thread.start()

    def _read(self) -> None:
        try:
            while chunk := os.read(self._fd, 65536):
                self._tail += chunk
                del self._tail[:-TAIL_BYTES]
                self._lines(self._decoder.decode(chunk))
            self._lines(self._decoder.decode(b"", final=True), final=True)
        except OSError:  # closed under us by close(): the run is over
            pass
        finally:
            self._pipe.close()

    def _lines(self, text: str, final: bool = False) -> None:
        """Submit the complete lines read so far (all of it at the end)."""
        text = self._partial + text
        cut = len(text) if final else text.rfind("\n") + 1
        self._partial = text[cut:]
        if cut:
            self._session.submit(LogRecord(self._session.now(), self.stream, text[:cut]))

    def tail(self) -> str:
        """The last bytes read, decoded (for a run that ended without saying why)."""
        return bytes(self._tail).decode("utf-8", "replace")

    def join(self, timeout_s: float) -> None:
        """Wait until the pipe is read to its end: every process holding it has exited
        (a worker the script left behind can keep it open; then only ``timeout_s``)."""
        self._thread.join(timeout_s)
