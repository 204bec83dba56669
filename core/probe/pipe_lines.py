"""A pipe read in a thread of its own and handed on in whole lines.

Output that does not pass through a script's ``sys.stdout`` comes back to the run's log
through a pipe: a forked DataLoader worker's prints in this process's runs
(:mod:`torchmem.probe.runner`), and everything an isolated run's child writes to its
terminal (:mod:`torchmem.sources.isolated`). Whole lines only, so that two writers' text
never mixes within a line; the rest when the pipe ends.
"""

from __future__ import annotations

import codecs
import os
import threading
from collections.abc import Callable
from typing import IO

#: Bytes kept of what was read, for a run that ended without saying why.
TAIL_BYTES = 4000


def whole_lines(text: str, final: bool = False) -> tuple[str, str]:
    """``text`` cut after its last newline: the whole lines, and the rest to keep for
    later (nothing kept when ``final``)."""
    cut = len(text) if final else text.rfind("\n") + 1
    return text[:cut], text[cut:]


class PipeLines:
    """Reads ``pipe`` until every process holding it has closed it, calling ``on_text``
    with the whole lines read so far (and the rest at the end)."""

    def __init__(self, pipe: IO[bytes] | int, on_text: Callable[[str], None], name: str) -> None:
        self._pipe = pipe  # kept open (and alive) until the thread has read it to its end
        self._fd = pipe if isinstance(pipe, int) else pipe.fileno()
        self._on_text = on_text
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._partial = ""
        self._tail = bytearray()
        self._thread = threading.Thread(target=self._read, name=name, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            while chunk := os.read(self._fd, 65536):
                self._tail += chunk
                del self._tail[:-TAIL_BYTES]
                self._lines(self._decoder.decode(chunk))
            self._lines(self._decoder.decode(b"", final=True), final=True)
        except OSError:  # closed under us: the run is over
            pass
        finally:
            if isinstance(self._pipe, int):
                os.close(self._pipe)
            else:
                self._pipe.close()

    def _lines(self, text: str, final: bool = False) -> None:
        lines, self._partial = whole_lines(self._partial + text, final)
        if lines:
            self._on_text(lines)

    def tail(self) -> str:
        """The last bytes read, decoded."""
        return bytes(self._tail).decode("utf-8", "replace")

    def join(self, timeout_s: float) -> None:
        """Wait until the pipe is read to its end: every process holding it has exited
        (one the script left behind can keep it open; then only ``timeout_s``)."""
        self._thread.join(timeout_s)
