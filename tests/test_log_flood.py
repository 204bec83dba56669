"""A script that floods its output: few log events, every line kept in order, and a Log
pane that stays responsive by skipping what it would drop anyway (and says so)."""

from __future__ import annotations

import threading
import time

from torchmem.events import LogRecord, Marker, RunFinished, Stream
from torchmem.gui.panels.log_pane import MAX_LINES, LogPane
from torchmem.probe.log_batch import BATCH_S, LogBatcher
from torchmem.probe.runner import ScriptRunner


def test_a_flood_of_writes_becomes_few_events_with_every_character_in_order():
    events: list[LogRecord] = []
    batcher = LogBatcher(events.append, time.monotonic)
    for i in range(20_000):
        batcher.write(Stream.STDOUT, f"line {i}")
        batcher.write(Stream.STDOUT, "\n")
    batcher.close()
    assert len(events) < 200  # one per 50 ms or 64 KiB, not one per write
    assert "".join(e.text for e in events) == "".join(f"line {i}\n" for i in range(20_000))


def logs_text(events: list) -> str:
    return "".join(e.text for e in events if isinstance(e, LogRecord))


class _Terminal:
    """A terminal that counts the writes it gets (each one a system call, which lets the
    GUI thread take the GIL from the script)."""

    def __init__(self, log: list[tuple[str, str]], name: str) -> None:
        self.log, self.name, self.writes = log, name, 0

    def write(self, text: str) -> int:
        self.writes += 1
        self.log.append((self.name, text))
        return len(text)

    def flush(self) -> None:
        pass


def test_a_flood_reaches_the_terminal_whole_in_order_and_in_few_writes(tmp_path, monkeypatch):
    script = tmp_path / "flood.py"
    script.write_text(
        "import sys\n"
        "for i in range(20000):\n"
        "    print(f'line {i}', flush=True)\n"
        "    if i % 5000 == 0:\n"
        "        print(f'warning {i}', file=sys.stderr)\n"
    )
    seen: list[tuple[str, str]] = []
    out, err = _Terminal(seen, "out"), _Terminal(seen, "err")
    monkeypatch.setattr("sys.stdout", out)
    monkeypatch.setattr("sys.stderr", err)
    events: list = []
    assert ScriptRunner(script, emit=events.append).run().exit_code == 0
    expected = []
    for i in range(20000):
        expected.append(("out", f"line {i}\n"))
        if i % 5000 == 0:
            expected.append(("err", f"warning {i}\n"))
    joined: list[tuple[str, str]] = []
    for name, text in seen:  # join consecutive writes of one stream
        if joined and joined[-1][0] == name:
            joined[-1] = (name, joined[-1][1] + text)
        else:
            joined.append((name, text))
    want: list[tuple[str, str]] = []
    for name, text in expected:
        if want and want[-1][0] == name:
            want[-1] = (name, want[-1][1] + text)
        else:
            want.append((name, text))
    assert joined == want  # every character, stdout and stderr interleaved as written
    assert out.writes < 200, f"{out.writes} terminal writes for 20,000 flushed lines"
    assert logs_text(events) == "".join(text for _, text in expected)


def test_batches_go_out_from_one_thread_that_ends_with_the_run(tmp_path):
    """A script that prints every step: the batches are sent by one thread for the whole
    run (a thread per batch, started and joined at every step, cost 260 µs a step)."""
    import threading

    script = tmp_path / "prints_every_step.py"
    script.write_text(
        "import threading, time\n"
        "seen = []  # the Thread objects themselves: an ident is reused once one ends\n"
        "for i in range(400):\n"
        "    print(f'step {i}')\n"
        "    time.sleep(0.001)\n"
        "    for t in threading.enumerate():\n"
        "        if t.name == 'torchmem-log-batch' and not any(t is s for s in seen):\n"
        "            seen.append(t)\n"
        "print('senders', len(seen))\n"
    )
    events: list = []
    assert ScriptRunner(script, emit=events.append).run().exit_code == 0
    text = logs_text(events)
    assert "senders 1\n" in text
    assert text.count("step ") == 400 and len(events) < 120  # batched: ~20 a second
    assert not [t for t in threading.enumerate() if t.name == "torchmem-log-batch"]


def test_a_quiet_line_goes_out_at_once_and_streams_keep_their_order():
    events: list[LogRecord] = []
    batcher = LogBatcher(events.append, time.monotonic)
    batcher.write(Stream.STDOUT, "first\n")
    assert [e.text for e in events] == ["first\n"]  # nothing waits after a quiet spell
    batcher.write(Stream.STDOUT, "a\n")
    batcher.write(Stream.STDERR, "b\n")
    batcher.write(Stream.STDOUT, "c\n")
    batcher.close()
    assert [(e.stream, e.text) for e in events[1:]] == [
        (Stream.STDOUT, "a\n"), (Stream.STDERR, "b\n"), (Stream.STDOUT, "c\n"),
    ]  # fmt: skip


def test_a_quiet_prints_text_and_newline_go_out_together_and_a_prompt_on_its_own():
    """print() writes its text, then its newline: a quiet script's line went out in two
    halves, and in an isolated run a worker's line could land between them."""
    events: list[LogRecord] = []
    sent = threading.Event()
    batcher = LogBatcher(lambda e: (events.append(e), sent.set()), time.monotonic)
    try:
        batcher.write(Stream.STDOUT, "loss 0.25")
        batcher.write(Stream.STDOUT, "\n")
        assert [e.text for e in events] == ["loss 0.25\n"]
        time.sleep(BATCH_S)  # a quiet spell: the next text would go out at once
        sent.clear()
        batcher.write(Stream.STDOUT, "name? ")  # input()'s prompt: no newline will follow
        assert sent.wait(10) and events[-1].text == "name? "
    finally:
        batcher.close()


def test_a_scripts_lines_come_before_the_step_that_follows_them(tmp_path):
    script = tmp_path / "prints_then_steps.py"
    script.write_text(
        "import torch\n"
        "w = torch.zeros(2, requires_grad=True)\n"
        "for i in range(3):\n"
        "    print(f'before step {i + 1}')\n"
        "    (w * 2).sum().backward()\n"
    )
    events: list = []
    result = ScriptRunner(script, emit=events.append, capture_output=True).run()
    assert result.exit_code == 0
    order = [
        e.text.strip() if isinstance(e, LogRecord) else f"step {e.step}"
        for e in events
        if (isinstance(e, LogRecord) and e.text.strip()) or isinstance(e, Marker)
    ]
    assert order == [
        "before step 1", "step 1", "before step 2", "step 2", "before step 3", "step 3",
    ]  # fmt: skip
    assert isinstance(events[-1], RunFinished)


def test_the_log_pane_skips_what_it_would_drop_and_says_so(qtbot):
    pane = LogPane()
    qtbot.addWidget(pane)
    pane._session = None
    flood = [LogRecord(0, Stream.STDOUT, "".join(f"{i + j}\n" for j in range(1000)))
             for i in range(0, 60_000, 1000)]  # fmt: skip
    pane.on_events(flood)
    pane.flush()
    text = pane.toPlainText()
    assert pane.document().blockCount() <= MAX_LINES + 2
    assert "40,002 lines not shown here" in text and text.rstrip().endswith("59999")
    calm = LogPane()
    qtbot.addWidget(calm)
    calm._session = None
    calm.on_events([LogRecord(0, Stream.STDOUT, "epoch 1 done\n")])
    assert "epoch 1 done" in calm.toPlainText()  # calm output shows at once


def test_a_progress_bar_redraws_its_line_as_in_a_terminal(qtbot):
    """tqdm redraws its bar with carriage returns for a whole run: the pane shows the
    latest bar on one line, and the document does not grow with every redraw."""
    pane = LogPane()
    qtbot.addWidget(pane)
    pane.append_records([LogRecord(0.0, Stream.STDOUT, "epoch 1\n")])
    for i in range(2000):
        pane.append_records([LogRecord(0.1, Stream.STDERR, f"\r{i / 20:5.1f}%|{'#' * (i // 100)}")])
    pane.append_records([LogRecord(0.2, Stream.STDERR, "\r100.0%|done\r\n")])
    pane.append_records([LogRecord(0.3, Stream.STDOUT, "epoch 2\n")])
    assert pane.toPlainText() == "epoch 1\n100.0%|done\nepoch 2\n"
    assert pane.document().characterCount() < 100


def test_a_line_without_end_is_broken_so_the_line_cap_still_bounds_the_pane(qtbot):
    from torchmem.gui.panels.log_pane import MAX_LINE_CHARS

    pane = LogPane()
    qtbot.addWidget(pane)
    chunk = "...............|"  # print(chunk, end=""), 16 characters
    writes = 3 * MAX_LINE_CHARS // len(chunk)
    for _ in range(writes):
        pane.append_records([LogRecord(0.0, Stream.STDOUT, chunk)])
    lines = pane.toPlainText().split("\n")
    assert len(lines) == 3 and all(len(line) == MAX_LINE_CHARS for line in lines)
    assert "".join(lines) == chunk * writes
