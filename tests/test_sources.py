"""Every source offers the same requests, and every command is known in one table."""

from __future__ import annotations

import pytest

from torchmem.agent import INLINE_REQUESTS
from torchmem.events import CommandResult, RunStatus
from torchmem.probe.backends import ProcessBackend
from torchmem.probe.commands import COMMANDS
from torchmem.session import Session
from torchmem.sources.attached import AttachedRun
from torchmem.sources.base import Source
from torchmem.sources.inprocess import InProcessSource
from torchmem.sources.isolated import IsolatedSource


@pytest.fixture
def sources():
    session = Session()
    made = [
        InProcessSource(session, [ProcessBackend()]),
        IsolatedSource(session),
        AttachedRun(session, pid=1),
    ]
    yield made
    for source in made:
        source.close()


def test_every_source_is_a_source_and_answers_a_command_with_a_list(sources):
    for source in sources:
        assert isinstance(source, Source), type(source).__name__
        results = source.command("reset_peaks")
        assert isinstance(results, list) and len(results) == 1
        assert isinstance(results[0], CommandResult)
    inproc, isolated, attached = (r.command("reset_peaks")[0] for r in sources)
    assert inproc.ok
    # Nothing to send it to: said, not raised, and the same shape as a success.
    assert not isolated.ok and "no isolated run" in isolated.message
    assert not attached.ok and "has no agent" in attached.message


def test_every_measured_command_runs_in_this_process():
    source = InProcessSource(Session(), [ProcessBackend()])
    try:
        for command in COMMANDS.values():
            if command.measured and command.name != "census":
                (result,) = source.command(command.name)
                assert "unknown command" not in result.message, command.name
        (unknown,) = source.command("bogus")
        assert not unknown.ok and "unknown command" in unknown.message
    finally:
        source.close()


def test_the_command_table_labels_every_command_and_keeps_apart_from_protocol_requests():
    assert not set(COMMANDS) & set(INLINE_REQUESTS)
    for command in COMMANDS.values():
        assert command.label and command.label[0] not in " .", command.name


def test_a_listener_that_raises_never_ends_the_script_nor_starves_the_others(caplog):
    """Step markers are submitted from the script's own thread: a bug in one of the
    Session's listeners (the leak detector, the recorder, a view) must not reach the
    training loop. The run ends as it would, every listener sees every event, and the
    run's log says once what failed."""
    from conftest import SCRIPTS

    from torchmem.events import Marker, MarkerKind, RunStatus
    from torchmem.sources.base import Script

    session = Session()
    seen: list[int] = []

    def broken_view(event):
        if isinstance(event, Marker):
            raise ValueError("a view's bug")

    session.subscribe(broken_view)
    session.subscribe(
        lambda e: seen.append(e.step) if isinstance(e, Marker) and e.kind is MarkerKind.STEP else 0
    )
    source = InProcessSource(session, [ProcessBackend()])
    try:
        result = source.run_script(Script(str(SCRIPTS / "train_steps.py"), ("5",), None, False))
    finally:
        source.close()
    assert result.status is RunStatus.FINISHED, result.message
    assert seen == [1, 2, 3, 4, 5] and session.steps.steps == 5
    assert [m.label for m in session.markers] == ["epoch 1", "epoch 2"]
    notes = [r.text for r in session.logs if "internal error" in r.text]
    assert notes == [
        "internal error in test_a_listener_that_raises_never_ends_the_script_nor_starves_the_"
        "others.<locals>.broken_view (ValueError: a view's bug); the run goes on. Please "
        "report it."
    ]
    assert sum("broken_view failed on an event" in r.getMessage() for r in caplog.records) == 1


def test_how_a_child_ended_is_read_from_its_exit_status():
    from torchmem.sources.children import describe_exit

    assert describe_exit(0) == (RunStatus.FINISHED, "the process exited with code 0")
    assert describe_exit(130)[0] is RunStatus.STOPPED
    status, message = describe_exit(1, stderr_tail="Traceback …\nValueError: bad lr\n")
    assert status is RunStatus.FAILED and message == "ValueError: bad lr"
    status, message = describe_exit(-9)
    assert status is RunStatus.FAILED and message.startswith("the process was killed by SIGKILL")
    assert "OOM killer" in message, "a SIGKILL names who may have sent it"
    hint = "; probably the kernel's OOM killer: available RAM fell to 41 MiB"
    assert describe_exit(-9, killed_hint=hint)[1].endswith(hint)
    status, message = describe_exit(-15, stop_requested=True)
    assert status is RunStatus.STOPPED and "SIGTERM" in message
    assert describe_exit(-200)[1] == "the process was killed by signal 200"
