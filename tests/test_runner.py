"""Running scripts in-process: output, exit codes, errors, stops, and a clean interpreter."""

from __future__ import annotations

import os
import sys
import threading

import pytest

from torchmem.events import LogRecord, Marker, MarkerKind, RunFinished, RunStatus, Stream
from torchmem.probe.runner import EXIT_STOPPED, ScriptError, ScriptRunner, validate_script
from torchmem.session import Session


def run(path, args=(), **kwargs):
    events = []
    runner = ScriptRunner(path, list(args), events.append, **kwargs)
    result = runner.run()
    return result, events, runner


def logs(events, stream=None):
    return "".join(
        e.text
        for e in events
        if isinstance(e, LogRecord) and (stream is None or e.stream is stream)
    )


def test_script_output_and_argv_are_captured(script_path, capsys):
    result, events, _ = run(script_path("ok_print.py"), ["--lr", "0.1"])
    assert result.status is RunStatus.FINISHED and result.exit_code == 0
    assert "hello from the script ['--lr', '0.1']" in logs(events, Stream.STDOUT)
    assert "to stderr" in logs(events, Stream.STDERR)
    echoed = capsys.readouterr()
    assert "hello from the script" in echoed.out, "output is still echoed to the terminal"


def test_interpreter_state_is_restored(script_path):
    argv, path, out, cwd = list(sys.argv), list(sys.path), sys.stdout, os.getcwd()
    run(script_path("raises_at_import.py"))
    assert sys.argv == argv and sys.path == path and sys.stdout is out and os.getcwd() == cwd


def test_sys_exit_code_is_reported(script_path):
    result, _, _ = run(script_path("exit3.py"))
    assert result.status is RunStatus.FAILED
    assert result.exit_code == 3
    assert "sys.exit(3)" in result.message


def test_exception_traceback_starts_at_the_script(script_path):
    result, _, _ = run(script_path("raises_at_import.py"))
    assert result.status is RunStatus.FAILED and result.exit_code == 1
    assert "RuntimeError: boom at import" in result.traceback
    assert "raises_at_import.py" in result.traceback
    assert "runpy" not in result.traceback and "runner.py" not in result.traceback
    assert result.message == "raised RuntimeError: boom at import"


def test_out_of_memory_is_recognised_and_explained(script_path):
    result, _, _ = run(script_path("oom.py"))
    assert result.status is RunStatus.OOM
    assert "smaller batch size" in result.message
    assert "expandable_segments" in result.message


def test_signal_in_a_thread_says_to_use_torchmem_run(script_path):
    result = {}
    thread = threading.Thread(target=lambda: result.update(r=run(script_path("uses_signal.py"))[0]))
    thread.start()
    thread.join(60)
    finished = result["r"]
    assert finished.status is RunStatus.FAILED
    assert "main thread" in finished.message and "torchmem run" in finished.message


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("does_not_exist.py", "No such script"),
        ("with_sibling", "is a folder, not a script"),
        ("notes.txt", "Is it a Python script at all?"),
        ("syntax_error.py", "Syntax error in syntax_error.py, line 2"),
    ],
)
def test_bad_scripts_get_a_clear_message(script_path, name, expected):
    with pytest.raises(ScriptError, match=expected.replace("?", r"\?")):
        validate_script(script_path(name))
    result, _events, _ = run(script_path(name))
    assert result.status is RunStatus.FAILED and result.exit_code == 2
    assert expected in result.message


def test_binary_file_is_refused(tmp_path):
    blob = tmp_path / "model.pt"
    blob.write_bytes(b"PK\x03\x04\x00\x00binary")
    with pytest.raises(ScriptError, match="binary file"):
        validate_script(blob)


def test_script_folder_is_on_sys_path_and_cwd_is_unchanged(script_path, tmp_path):
    result, events, _ = run(script_path("with_sibling/main_script.py"))
    assert result.exit_code == 0, result.traceback
    assert f"sibling says 42 cwd {os.getcwd()}" in logs(events)
    _, events, _ = run(script_path("with_sibling/main_script.py"), cwd=str(tmp_path))
    assert f"cwd {tmp_path}" in logs(events)


def test_optimizer_steps_and_marks_become_markers(script_path):
    result, events, runner = run(script_path("train_steps.py"), ["12"])
    assert result.exit_code == 0, result.traceback
    steps = [e for e in events if isinstance(e, Marker) and e.kind is MarkerKind.STEP]
    epochs = [e for e in events if isinstance(e, Marker) and e.kind is MarkerKind.EPOCH]
    assert [s.step for s in steps] == list(range(1, 13))
    assert [e.label for e in epochs] == ["epoch 1", "epoch 2", "epoch 3"]
    assert [e.step for e in epochs] == [0, 4, 8]
    assert runner.steps == 12


def test_hand_written_updates_count_backward_calls(script_path):
    _, _, runner = run(script_path("hand_update.py"))
    assert runner.steps == 7


def test_two_optimizers_count_one_step_per_iteration(script_path):
    _, _, runner = run(script_path("gan_two_optimizers.py"))
    assert runner.steps == 5


def test_hooks_are_removed_after_the_run(script_path):
    import torch

    backward = torch.autograd.backward
    run(script_path("train_steps.py"), ["2"])
    assert torch.autograd.backward is backward
    from torch.optim.optimizer import _global_optimizer_post_hooks

    assert not _global_optimizer_post_hooks


def _run_in_thread(runner):
    box = {}
    thread = threading.Thread(target=lambda: box.update(r=runner.run()), name="test-script")
    thread.start()
    return thread, box


def _wait_for(events, predicate, timeout=60):
    ready = threading.Event()

    def check(event):
        events.append(event)
        if predicate(event):
            ready.set()

    return check, ready


def test_stop_lands_at_the_next_step(script_path):
    events = []
    check, ready = _wait_for(events, lambda e: isinstance(e, Marker) and e.step >= 3)
    runner = ScriptRunner(script_path("train_forever.py"), [], check)
    thread, box = _run_in_thread(runner)
    assert ready.wait(60), "the script never reached step 3"
    runner.request_stop(grace_s=30)
    thread.join(30)
    assert not thread.is_alive()
    result: RunFinished = box["r"]
    assert result.status is RunStatus.STOPPED and result.exit_code == EXIT_STOPPED
    assert "stopped by the user at step" in result.message


def test_stop_of_a_script_that_never_steps_falls_back(script_path):
    events = []
    check, ready = _wait_for(events, lambda e: isinstance(e, LogRecord) and "spinning" in e.text)
    runner = ScriptRunner(script_path("never_steps.py"), [], check)
    thread, box = _run_in_thread(runner)
    assert ready.wait(60)
    runner.request_stop(grace_s=0.2)
    thread.join(30)
    assert not thread.is_alive(), "the fallback stop did not end the script"
    assert box["r"].status is RunStatus.STOPPED


def test_dataloader_with_worker_processes_runs_in_a_thread(script_path):
    session = Session()
    runner = ScriptRunner(script_path("dataloader_workers.py"), [], session.submit, session.now)
    thread, box = _run_in_thread(runner)
    thread.join(120)
    result = box["r"]
    assert result.exit_code == 0, result.traceback + result.message
    assert "batches 4" in "".join(r.text for r in session.logs)
    assert runner.steps == 4


def test_a_forked_child_prints_while_another_thread_holds_the_log_lock(tmp_path):
    """A DataLoader worker forked while the Session's lock is held must still print."""
    script = tmp_path / "fork_print.py"
    script.write_text(
        "import os, sys, threading\n"
        "held, release = threading.Event(), threading.Event()\n"
        "def hold():\n"
        "    with LOCK:\n"
        "        held.set(); release.wait(30)\n"
        "t = threading.Thread(target=hold); t.start(); held.wait(30)\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    print('worker says hi', flush=True)\n"
        "    os._exit(0)\n"
        "import time\n"
        "for _ in range(400):\n"  # 20 s, then a hung child is killed: the test fails, not hangs
        "    done, status = os.waitpid(pid, os.WNOHANG)\n"
        "    if done: break\n"
        "    time.sleep(0.05)\n"
        "else:\n"
        "    os.kill(pid, 9); os.waitpid(pid, 0); status = 1 << 8\n"
        "release.set(); t.join()\n"
        "print('child exit', os.waitstatus_to_exitcode(status))\n"
    )
    lock = threading.Lock()
    events = []

    def emit(event):
        with lock:  # as Session.submit does
            events.append(event)

    runner = ScriptRunner(script, [], emit)
    box = {}
    thread = threading.Thread(target=lambda: box.update(r=runner.run()), daemon=True)
    try:
        import builtins

        builtins.LOCK = lock
        thread.start()
        thread.join(60)
    finally:
        del builtins.LOCK
    assert not thread.is_alive(), "the forked child hung on the log's lock"
    assert box["r"].exit_code == 0, box["r"].traceback
    assert "child exit 0" in logs(events)
    assert "worker says hi\n" in logs(events), "a forked child's line reaches the run's log"


def test_dataloader_workers_prints_reach_the_log_in_whole_lines(tmp_path):
    """Two forked workers printing at once: every line arrives, none mixed with another
    (print writes its newline apart from its text), and the terminal gets them too."""
    script = tmp_path / "noisy_loader.py"
    script.write_text(
        "import torch\n"
        "from torch.utils.data import DataLoader, Dataset\n"
        "class Noisy(Dataset):\n"
        "    def __len__(self): return 200\n"
        "    def __getitem__(self, i):\n"
        "        print(f'item {i:03d} ' + 'x' * 60)\n"
        "        return torch.zeros(2)\n"
        "for _ in DataLoader(Noisy(), batch_size=10, num_workers=2): pass\n"
        "print('main done')\n"
    )
    events: list = []
    runner = ScriptRunner(script, [], events.append)
    assert runner.run().exit_code == 0
    lines = logs(events).splitlines()
    expected = [f"item {i:03d} " + "x" * 60 for i in range(200)]
    assert sorted(line for line in lines if line.startswith("item")) == expected
    assert "main done" in lines


def test_one_classifier_says_out_of_memory_for_every_backend():
    import torch

    from torchmem.probe.runner import classify_exception

    for exc in (
        torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
        MemoryError(),
        RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 8 GB"),
        RuntimeError("MPS backend out of memory (MPS allocated: 1.2 GB)"),
    ):
        status, code, message = classify_exception(exc)
        assert status is RunStatus.OOM and code == 1, exc
        assert "smaller batch size" in message
    status, _, message = classify_exception(KeyError("x"))
    assert status is RunStatus.FAILED and message == "raised KeyError: 'x'"


def test_each_run_in_this_process_starts_from_its_own_baseline(script_path):
    """The window runs scripts in its own process: what a run freed goes back to the
    system at its end (glibc kept it: a second run started 1.6 GiB higher), the C heap
    is read afresh, and the kernel's peak RSS is the run's own."""
    import gc

    import psutil

    from torchmem.probe.backends import ProcessBackend
    from torchmem.sources.base import Script
    from torchmem.sources.inprocess import InProcessSource

    MiB = 1 << 20
    me = psutil.Process()
    source = InProcessSource(Session(), [ProcessBackend()])

    def run(name: str) -> RunFinished:
        done: list[RunFinished] = []
        worker = threading.Thread(  # as the window does: not the main thread's arena
            target=lambda: done.append(source.run_script(Script(script_path(name), ())))
        )
        worker.start()
        worker.join()
        gc.collect()
        return done[0]

    assert run("ok_print.py").status is RunStatus.FINISHED  # torch and the sampler loaded
    baseline = me.memory_info().rss
    for _ in range(2):  # glibc's choice of arena varies: twice, each from the baseline
        assert run("heap_churn.py").status is RunStatus.FINISHED, source.session.logs
        latest = source.session.latest()
        # Its peak is its own (VmHWM restarted at its start), with the tensors it held.
        assert latest["cpu/rss"][1] >= baseline + 80 * MiB
        assert "cpu/heap_free" in latest, "the heap is read in every run"
        left = me.memory_info().rss - baseline
        assert left < 60 * MiB, f"the run left {left / MiB:.0f} MiB"
