"""The CUDA checks, in one script for a machine with an NVIDIA GPU (well under 5 minutes).

    .venv/bin/python scripts/gpu_check.py [--out DIR]

Prints a table of checks and writes it to DIR/gpu_check.md and DIR/gpu_check.json; exits
non-zero if any fails.
Record the result in docs/gpu.md. Without a GPU it says so and exits 0.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
rows: list[tuple[str, bool, str]] = []


def check(name: str, ok: bool, detail: str = "") -> None:
    rows.append((name, bool(ok), detail))
    print(f"{'PASS' if ok else 'FAIL'}  {name}  {detail}", flush=True)


def broke(name: str, exc: BaseException, *outputs: str) -> None:
    """A failed check whose reading itself failed: the exception and the tails of the
    output that explain it."""
    check(name, False, " ".join([f"{type(exc).__name__}: {exc}", *outputs]))


def python(code: str, timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def check_context(out_dir: Path) -> None:
    """The backend stays silent (no context) until the script initialises CUDA."""
    r = python("""
        import time
        import torch
        from torchmem.probe.backends import discover_backends
        from torchmem.probe.sampler import Sampler
        s = Sampler(discover_backends(), lambda x: None)
        before = s.read()
        print(torch.cuda.is_initialized(), sorted(k for k in before if k.startswith('cuda')))
        x = torch.empty(256 << 20, dtype=torch.uint8, device='cuda')
        time.sleep(0.6)  # NVML is read at most every 0.5 s
        after = s.read()
        print(after['cuda:0/allocated'], after['cuda:0/reserved'], after.get('cuda:0/nvml_used'))
    """)
    lines = r.stdout.split("\n")
    check(
        "no CUDA context created by sampling",
        r.returncode == 0 and lines[0].startswith("False []"),
        lines[0] + r.stderr[-300:],
    )
    if r.returncode == 0:
        alloc, reserved, nvml = lines[1].split()
        check("allocated counts a 256 MiB tensor", float(alloc) >= 256 << 20, f"allocated {alloc}")
        check(
            "NVML process memory >= reserved",
            nvml != "None" and float(nvml) >= float(reserved),
            f"nvml {nvml}, reserved {reserved}",
        )


def check_commands(out_dir: Path) -> None:
    """Commands: empty_cache releases, reset peaks resets."""
    r = python("""
        import torch
        from torchmem.session import Session
        from torchmem.sources.inprocess import InProcessSource
        src = InProcessSource(Session())
        x = torch.empty(1 << 30, dtype=torch.uint8, device='cuda'); del x
        print(src.command('empty_cache')[0].message)
        print(src.command('reset_peaks')[0].message)
    """)
    check(
        "empty_cache reports the released GiB", "reserved -1.00 GiB" in r.stdout, r.stdout.strip()
    )
    check("reset peaks names the old peak", "peak allocated 1.00 GiB" in r.stdout, r.stderr[-300:])


def check_demo(out_dir: Path) -> None:
    """Headless demo on the GPU, and a real OOM."""
    with tempfile.TemporaryDirectory() as tmp:
        summary = Path(tmp) / "s.json"
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "torchmem",
                "run",
                "--summary",
                str(summary),
                str(ROOT / "resources/examples/demo_train.py"),
                "--device",
                "cuda",
                "--epochs",
                "2",
                "--steps",
                "50",
                "--batch-size",
                "256",
            ],
            capture_output=True,
            text=True,
            timeout=180,
        )
        data = json.loads(summary.read_text()) if summary.exists() else {}
        check(
            "demo on cuda: summary has a cuda:0 peak",
            r.returncode == 0 and data.get("peak_bytes", {}).get("cuda:0", 0) > 0,
            json.dumps(data.get("peak_bytes")) + r.stderr[-300:],
        )
        oom = Path(tmp) / "oom.py"
        oom.write_text("import torch\nx = torch.empty(1 << 50, dtype=torch.uint8, device='cuda')\n")
        r = subprocess.run(
            [sys.executable, "-m", "torchmem", "run", "--summary", str(summary), str(oom)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        data = json.loads(summary.read_text())
        check(
            "a real CUDA OOM is reported as such",
            data["status"] == "out of memory" and r.returncode == 1,
            data["message"][:120],
        )


def tune_demo(summary: Path) -> tuple[subprocess.CompletedProcess, dict]:
    """``torchmem tune`` of the demo on cuda:0 with a 3 GiB budget; the run and its
    summary ({} when none was written)."""
    r = subprocess.run(
        [sys.executable, "-m", "torchmem", "tune", "--device", "cuda:0", "--budget",
         "3GiB", "--max", "16384", "--steps", "2", "--summary", str(summary),
         str(ROOT / "resources/examples/demo_train.py"), "--device", "cuda",
         "--epochs", "1"],
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    return r, json.loads(summary.read_text()) if summary.exists() else {}


def check_tune_cli(out_dir: Path) -> None:
    """Batch-size tuning on CUDA: the budget on peak reserved, real trials of the demo."""
    with tempfile.TemporaryDirectory() as tmp:
        tuned = Path(tmp) / "tune.json"
        r, data = tune_demo(tuned)
        trials = data.get("trials", [])
        check(
            "torchmem tune on cuda:0 (3 GiB budget on reserved)",
            r.returncode == 0 and data.get("recommended") and trials
            and all(t["peak_reserved_bytes"] for t in trials if t["ok"]),
            f"recommended {data.get('recommended')} in {len(trials)} trials, "
            f"{data.get('ooms')} OOM; fit {data.get('fit')}; " + r.stderr[-200:],
        )  # fmt: skip
        if tuned.exists():
            (out_dir / "gpu_tune.json").parent.mkdir(parents=True, exist_ok=True)
            (out_dir / "gpu_tune.json").write_text(tuned.read_text())


def check_agent(out_dir: Path) -> None:
    """The agent on CUDA: attach, the cuda series arrive, allocation history + snapshot."""
    with tempfile.TemporaryDirectory() as tmp:
        served = Path(tmp) / "served_cuda.py"
        served.write_text(
            "import time, torch, torchmem\ntorchmem.serve()\n"
            "x = torch.ones(64 << 20, device='cuda')\nprint('ready', flush=True)\n"
            "for _ in range(600):\n    y = x * 2\n    time.sleep(0.05)\n"
        )
        env = {
            **os.environ,
            "TORCHMEM_RUNTIME_DIR": str(Path(tmp) / "rt"),
            "TORCHMEM_SNAPSHOT_DIR": str(Path(tmp) / "snaps"),
        }
        child = subprocess.Popen(
            [sys.executable, str(served)], env=env, stdout=subprocess.PIPE, text=True
        )
        try:
            child.stdout.readline()
            os.environ["TORCHMEM_RUNTIME_DIR"] = env["TORCHMEM_RUNTIME_DIR"]
            from torchmem.session import Session
            from torchmem.sources.remote import RemoteSource
            from torchmem.transport.discovery import find_agent

            session = Session()
            remote = RemoteSource(session, find_agent(child.pid))
            remote.connect()
            time.sleep(1.5)
            keys = session.keys()
            check(
                "attached agent streams cuda:0 allocated",
                "cuda:0/allocated" in keys and remote.has_accelerator,
                ", ".join(keys),
            )
            started = remote.request("history_start")
            time.sleep(0.5)  # ten steps of the script, each allocating y
            snap = remote.request("snapshot")
            remote.request("history_stop")
            path = Path(snap.get("output") or "/nonexistent")
            size = path.stat().st_size if path.exists() else 0
            traces = 0
            if size:
                import pickle

                with path.open("rb") as f:
                    traces = sum(len(t) for t in pickle.load(f).get("device_traces", []))
            check(
                "allocation history + memory_viz snapshot over the agent",
                started["ok"] and snap["ok"] and size > 0 and traces > 0,
                f"{started['message'][:60]}; {path} ({size} bytes, {traces} trace events)",
            )
            remote.close()
        except Exception as exc:
            broke("agent on CUDA", exc)
        finally:
            child.kill()
            child.wait()


def check_lab(out_dir: Path) -> None:
    """The memory lab on CUDA: exact peaks, and pinned against pageable copies."""
    r = python(
        """
        import json
        from torchmem.lab.measure import Job
        from torchmem.lab.runner import run_lab
        ops = ("add", "add_", "matmul", "to_pageable", "to_pinned")
        jobs = [Job(op, 4096, device="cuda:0") for op in ops]
        print(json.dumps([row.to_json() for row in run_lab(jobs)]))
    """,
        timeout=180,
    )

    def rate(row: dict, scale: float, unit: str) -> str:
        if row.get("error") or row.get("rate") is None:
            return f"{row['op']}: {row.get('error') or 'no rate'}"
        return f"{row['op']} {row['rate'] / scale:.1f} {unit}"

    try:
        lab = {row["op"]: row for row in json.loads(r.stdout.strip().splitlines()[-1])}
        n2 = 4 * 4096 * 4096
        check(
            "lab on cuda:0: add owns 4n², add_ 0, matmul 4n²",
            lab["add"]["result_bytes"] == n2
            and lab["add_"]["result_bytes"] == 0
            and lab["matmul"]["result_bytes"] == n2
            and (lab["add"]["peak_extra_bytes"] or 0) >= n2,
            f"{rate(lab['matmul'], 1e12, 'TFLOP/s')}; "
            + ", ".join(f"{k}: result {v['result_bytes']}, peak +{v['peak_extra_bytes']}"
                        for k, v in lab.items()),
        )  # fmt: skip
        pinned, pageable = lab["to_pinned"], lab["to_pageable"]
        check(
            "lab on cuda:0: host-to-device copies measured",
            not pinned["error"] and not pageable["error"] and (pinned["median_s"] or 0) > 0,
            f"{rate(pinned, 1e9, 'GB/s')}, {rate(pageable, 1e9, 'GB/s')}",
        )
    except Exception as exc:
        broke("lab on cuda:0", exc, r.stdout[-400:], r.stderr[-300:])


def check_tune_api(out_dir: Path) -> None:
    """torchmem.tune on a step function, trials in fresh processes, budget on reserved."""
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "gpu_steps.py").write_text(
            textwrap.dedent("""
            import torch
            model = torch.nn.Sequential(torch.nn.Linear(4096, 4096), torch.nn.ReLU(),
                                        torch.nn.Linear(4096, 10)).cuda()
            opt = torch.optim.Adam(model.parameters())
            def step(batch_size):
                x = torch.randn(batch_size, 4096, device="cuda")
                loss = model(x).sum()
                opt.zero_grad(); loss.backward(); opt.step()
        """)
        )
        r = python(
            f"""
            import sys; sys.path.insert(0, {tmp!r})
            import torchmem, gpu_steps
            result = torchmem.tune(gpu_steps.step, budget="8GiB", device="cuda:0",
                                   max_batch=1 << 20, verbose=False)
            fit = [t for t in result.trials if t.batch_size == result.max_fitting][0]
            print(result.recommended, len(result.trials), result.ooms, fit.peak_reserved_bytes,
                  result.limit_bytes)
        """,
            timeout=240,
        )
        try:
            rec, trials, ooms, peak, limit = map(int, r.stdout.split()[-5:])
            check(
                "torchmem.tune(step) on cuda:0: verified under the limit",
                peak <= limit and trials <= 10,
                f"recommended {rec} in {trials} trials, {ooms} OOM, peak reserved {peak >> 20} "
                f"MiB of {limit >> 20} MiB",
            )
        except Exception as exc:
            broke("torchmem.tune on cuda:0", exc, r.stderr[-300:])


def check_snapshot(out_dir: Path) -> None:
    """A real snapshot of a small training run, read headless by torchmem snapshot info."""
    with tempfile.TemporaryDirectory() as tmp:
        snap = Path(tmp, "train.pickle")
        r = python(
            f"""
            import torch
            torch.cuda.memory._record_memory_history(max_entries=100000)
            model = torch.nn.Sequential(torch.nn.Linear(2048, 8192), torch.nn.ReLU(),
                                        torch.nn.Linear(8192, 2048)).cuda()
            opt = torch.optim.Adam(model.parameters())
            torch.cuda.reset_peak_memory_stats()
            for _ in range(5):
                loss = model(torch.randn(512, 2048, device="cuda")).sum()
                opt.zero_grad(); loss.backward(); opt.step()
            torch.cuda.memory._dump_snapshot({str(snap)!r})
            print(torch.cuda.max_memory_allocated())
        """,
            timeout=120,
        )
        info = subprocess.run(
            [sys.executable, "-m", "torchmem", "snapshot", "info", "--json", str(snap)],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        try:
            peak_torch = int(r.stdout.split()[-1])
            data = json.loads(info.stdout)
            kinds = {g["category"] for g in data["top_stacks"]}
            check(
                "snapshot of a real run: torchmem's peak within the allocator's, kinds named",
                0 < data["peak_active_bytes"] <= peak_torch and len(data["top_stacks"]) > 0,
                f"peak {data['peak_active_bytes'] >> 20} MiB (torch max allocated "
                f"{peak_torch >> 20} MiB), {data['events']} events, kinds {sorted(kinds)}",
            )
        except Exception as exc:
            broke("snapshot of a real run", exc, r.stderr[-200:], info.stderr[-200:])


def check_snapshot_names(out_dir: Path) -> None:
    """A snapshot saved by torchmem after a census: its allocations carry tensor names (the
    census's Unix time against the trace's time_us: never run on a GPU before).
    """
    with tempfile.TemporaryDirectory() as tmp:
        r = python(
            f"""
            import os
            os.environ["TORCHMEM_SNAPSHOT_DIR"] = {tmp!r}
            import torch
            from torchmem.events import CensusTaken
            from torchmem.session import Session
            from torchmem.sources.inprocess import InProcessSource
            from torchmem.tensors.walk import take_census
            session = Session()
            source = InProcessSource(session)
            torch.zeros(1, device="cuda")
            assert source.command("history_start")[0].ok
            model = torch.nn.Linear(4096, 4096).cuda()
            opt = torch.optim.Adam(model.parameters())
            for _ in range(3):
                model(torch.randn(256, 4096, device="cuda")).sum().backward()
                opt.step(); opt.zero_grad(set_to_none=False)
            census = take_census([("", {{"model": model, "opt": opt}})], step=3)
            session.submit(CensusTaken(session.now(), 3, census, "user"))
            (snap,) = source.command("snapshot")
            print(snap.ok, snap.output)
        """,
            timeout=120,
        )
        try:
            path = r.stdout.split()[-1]
            info = subprocess.run(
                [sys.executable, "-m", "torchmem", "snapshot", "info", "--json", path],
                capture_output=True, text=True, timeout=120,
            )  # fmt: skip
            data = json.loads(info.stdout)
            names = sorted({n for g in data["top_stacks"] for n in g["tensors"]})
            check(
                "a torchmem snapshot names its allocations from the census",
                data["named_allocations"] > 0 and any("model.weight" in n for n in names),
                f"{data['named_allocations']} allocations named; {names[:4]}",
            )
        except Exception as exc:
            broke("snapshot names", exc, r.stderr[-300:])


def check_sync(out_dir: Path) -> None:
    """Sampling never synchronises the device. A full read while ~1 s of matmuls is queued must
    return in milliseconds and leave that work queued; CUDA events around a loop time it with
    and without the sampler at 100 Hz in a thread (a read that synchronised while holding the
    GIL would starve the launches).
    """
    r = python("""
        import time, warnings
        import torch
        from torchmem.probe.backends import discover_backends
        from torchmem.probe.sampler import Sampler
        x = torch.randn(8192, 8192, device="cuda")
        sampler = Sampler(discover_backends(), lambda sample: None, hz=100)
        sampler.read()  # the first read opens NVML and finds the devices

        def gpu_ms(k):
            a = torch.cuda.Event(enable_timing=True)
            b = torch.cuda.Event(enable_timing=True)
            a.record()
            for _ in range(k):
                x @ x
            b.record()
            b.synchronize()
            return a.elapsed_time(b)

        gpu_ms(3)
        per = gpu_ms(20) / 20
        queued = int(1000 / per) + 1
        for _ in range(queued):
            x @ x
        torch.cuda.set_sync_debug_mode("warn")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            t = time.perf_counter()
            sampler.read(full=True)
            read_ms = 1000 * (time.perf_counter() - t)
        torch.cuda.set_sync_debug_mode(0)
        pending = not torch.cuda.current_stream().query()
        torch.cuda.synchronize()
        syncs = [str(w.message)[:80] for w in caught if "synchroniz" in str(w.message)]
        print("read", f"{read_ms:.2f}", pending, len(syncs), queued, f"{per:.3f}")
        k = max(50, int(300 / per))
        plain, sampled = [], []
        for _ in range(3):
            plain.append(gpu_ms(k))
            sampler.start()
            sampled.append(gpu_ms(k))
            sampler.stop()
        print("loop", f"{sorted(plain)[1]:.1f}", f"{sorted(sampled)[1]:.1f}", k)
    """)
    try:
        read = next(line.split() for line in r.stdout.splitlines() if line.startswith("read"))
        loop = next(line.split() for line in r.stdout.splitlines() if line.startswith("loop"))
        read_ms, pending, syncs = float(read[1]), read[2] == "True", int(read[3])
        check(
            "a sampler read does not synchronise the device",
            pending and read_ms < 50 and syncs == 0,
            f"read {read_ms:.2f} ms with {read[4]} matmuls ({float(read[5]):.2f} ms each) "
            f"queued, still queued after it: {pending}; sync warnings: {syncs}",
        )
        plain_ms, sampled_ms = float(loop[1]), float(loop[2])
        check(
            "GPU time of a loop with the sampler at 100 Hz <= 1.02x without",
            sampled_ms <= 1.02 * plain_ms,
            f"{loop[3]} matmuls: {plain_ms:.1f} ms without, {sampled_ms:.1f} ms with "
            f"({sampled_ms / plain_ms:.3f}x, CUDA events, median of 3)",
        )
    except (StopIteration, ValueError, IndexError, ZeroDivisionError):
        check("sampling without synchronising", False, r.stdout[-200:] + r.stderr[-300:])


def check_census(out_dir: Path) -> None:
    """A census's CUDA bytes against the caching allocator's own count."""
    r = python("""
        import torch
        from torchmem.tensors.walk import take_census
        model = torch.nn.Sequential(
            torch.nn.Linear(4096, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1000)
        ).cuda()
        opt = torch.optim.Adam(model.parameters())
        for _ in range(2):
            model(torch.randn(512, 4096, device="cuda")).sum().backward()
            opt.step()
            opt.zero_grad(set_to_none=False)
        kept = torch.randn(1000, 1000, device="cuda")
        view = kept[10:]
        if hasattr(torch._C, "_cuda_clearCublasWorkspaces"):
            torch._C._cuda_clearCublasWorkspaces()  # not tensors: the census cannot see them
        torch.cuda.synchronize()
        census = take_census([("", {"model": model, "opt": opt, "kept": kept, "view": view})])
        total = sum(s.nbytes for s in census.storages.values() if s.device == "cuda:0")
        named = sum(s.nbytes for s in census.storages.values()
                    if s.device == "cuda:0" and s.named)
        print(total, named, torch.cuda.memory_allocated(0))
    """)
    try:
        total, named, allocated = map(int, r.stdout.split()[-3:])
        check(
            "census CUDA bytes match memory_allocated",
            total <= allocated and allocated - total <= max(2 << 20, allocated // 100),
            f"census {total:,} B ({named:,} named), memory_allocated {allocated:,} B, "
            f"unseen {allocated - total:,} B",
        )
    except ValueError:
        check("census against memory_allocated", False, r.stdout[-200:] + r.stderr[-300:])


def check_loader(out_dir: Path) -> None:
    """A CUDA training loop fed by two forked DataLoader workers, under torchmem run: the
    run finishes (the automatic census walks CUDA tensors at step boundaries, and the
    workers fork from a process where CUDA is in use), with a cuda:0 peak and the workers'
    own memory in the recording."""
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp, "loader_train.py")
        script.write_text(
            textwrap.dedent("""
            import torch
            from torch.utils.data import DataLoader, TensorDataset

            data = TensorDataset(torch.randn(4096, 512), torch.randint(0, 10, (4096,)))
            loader = DataLoader(data, batch_size=128, num_workers=2, pin_memory=True)
            model = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.ReLU(),
                                        torch.nn.Linear(2048, 10)).cuda()
            opt = torch.optim.AdamW(model.parameters())
            for epoch in range(2):
                for x, y in loader:
                    x, y = x.cuda(non_blocking=True), y.cuda(non_blocking=True)
                    loss = torch.nn.functional.cross_entropy(model(x), y)
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
            print("done", loss.item())
        """)
        )
        summary, session = Path(tmp, "s.json"), Path(tmp, "loader.tmsession")
        r = subprocess.run(
            [sys.executable, "-m", "torchmem", "run", "--summary", str(summary),
             "--record", str(session), str(script)],
            capture_output=True, text=True, timeout=180,
        )  # fmt: skip
        try:
            data = json.loads(summary.read_text())
            from torchmem.record.store import SessionFile

            with SessionFile(session) as f:
                keys = set(f.series_keys())
            check(
                "DataLoader workers on a CUDA run: finished, cuda:0 peak, workers' memory",
                r.returncode == 0
                and data["status"] == "finished"
                and data["peak_bytes"].get("cuda:0", 0) > 0
                and "cpu/children" in keys,
                f"{data['status']}, {data.get('steps')} steps, peaks "
                f"{json.dumps(data['peak_bytes'])}; series {sorted(keys)[:6]}... "
                + r.stderr[-200:],
            )
        except Exception as exc:
            broke("DataLoader workers on CUDA", exc, r.stderr[-400:])


def check_allocator(out_dir: Path) -> None:
    """Allocator settings: the demo recorded with and without expandable segments, then compared;
    each run reports the settings it ran with.
    """
    with tempfile.TemporaryDirectory() as tmp:
        demo = [str(ROOT / "resources/examples/demo_train.py"), "--device", "cuda",
                "--epochs", "1", "--steps", "30", "--batch-size", "256"]  # fmt: skip
        runs = []
        for name, conf in (("default", None), ("expandable", "expandable_segments:True")):
            env = {k: v for k, v in os.environ.items() if "ALLOC_CONF" not in k}
            if conf:
                env["PYTORCH_CUDA_ALLOC_CONF"] = conf
            path = Path(tmp) / f"{name}.tmsession"
            subprocess.run(
                [sys.executable, "-m", "torchmem", "run", "--quiet", "--record", str(path),
                 *demo],
                capture_output=True, text=True, timeout=120, env=env,
            )  # fmt: skip
            runs.append(path)
        r = subprocess.run(
            [sys.executable, "-m", "torchmem", "compare", "--json", *map(str, runs)],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        try:
            rows_ = json.loads(r.stdout)
            rows_ = rows_["runs"] if isinstance(rows_, dict) else rows_
            default, expandable = rows_
            peaks = [
                max((v for k, v in row["peak_bytes"].items() if k.startswith("cuda:0")), default=0)
                for row in rows_
            ]
            check(
                "allocator settings: runs recorded and compared with their settings",
                default["status"] == expandable["status"] == "finished"
                and not default["allocator"]
                and "expandable_segments:True" in json.dumps(expandable["allocator"])
                and all(peaks),
                f"cuda:0 peaks {peaks[0] / 2**20:.0f} MiB (default) and "
                f"{peaks[1] / 2**20:.0f} MiB (expandable); {expandable['allocator']}",
            )
        except (ValueError, KeyError, TypeError) as exc:
            broke("allocator settings", exc, r.stdout[-200:], r.stderr[-300:])


def check_tune_repeats(out_dir: Path) -> None:
    """Tuning on CUDA, three times: the noise of identical runs' peak reserved bytes (0 if
    the allocator is as deterministic as expected: no margin, 4 trials), and three answers
    within 10% of each other."""
    answers, noises, counts = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(3):
            tuned = Path(tmp) / f"tune{i}.json"
            _, data = tune_demo(tuned)
            answers.append(data.get("recommended"))
            noises.append((data.get("noise") or {}).get("spread_bytes"))
            counts.append(len(data.get("trials", [])))
            if tuned.exists():
                (out_dir / f"gpu_tune_repeat{i}.json").write_text(tuned.read_text())
    found = [a for a in answers if a]
    check(
        "torchmem tune on cuda:0, three times: answers within 10%",
        len(found) == 3 and max(found) <= 1.1 * min(found),
        f"recommended {answers}, spread of identical runs' reserved bytes {noises}, "
        f"trials {counts}",
    )


CHECKS = {
    name.removeprefix("check_"): fn
    for name, fn in list(globals().items())
    if name.startswith("check_") and callable(fn)
}


def write_results(out_dir: Path, device: str, torch_version: str) -> None:
    """Write the table and the JSON so far: a run cut short still leaves its results."""
    table = "| check | result | detail |\n|---|---|---|\n" + "\n".join(
        f"| {n} | {'pass' if ok else 'FAIL'} | {d.replace('|', '/').strip()[:200]} |"
        for n, ok, d in rows
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "gpu_check.md").write_text(table + "\n")
    (out_dir / "gpu_check.json").write_text(
        json.dumps(
            {
                "device": device,
                "torch": torch_version,
                "date": time.strftime("%Y-%m-%d %H:%M:%S"),
                "checks": [{"check": n, "ok": ok, "detail": d} for n, ok, d in rows],
                "seconds": timings,
            },
            indent=1,
        )
    )


timings: dict[str, float] = {}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    p.add_argument(
        "--only", nargs="+", choices=list(CHECKS), metavar="NAME",
        help="run these checks only (a rerun of those that failed): " + ", ".join(CHECKS),
    )  # fmt: skip
    args = p.parse_args()
    out_dir = Path(args.out)
    import torch

    if not torch.cuda.is_available():
        print("no CUDA device: nothing to check")
        return 0
    device = torch.cuda.get_device_name(0)
    check("device", True, f"{device}, torch {torch.__version__}")
    for name, fn in CHECKS.items():
        if args.only and name not in args.only:
            continue
        started = time.perf_counter()
        try:
            fn(out_dir)
        except Exception as exc:  # a check that broke (a timeout, say) must not end the others
            broke(name, exc, "(the check itself failed)")
        timings[name] = round(time.perf_counter() - started, 1)
        print(f"-- {name}: {timings[name]} s", flush=True)
        write_results(out_dir, device, torch.__version__)
    print((out_dir / "gpu_check.md").read_text())
    return 0 if all(ok for _, ok, _ in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
