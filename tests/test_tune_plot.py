"""The Tune plot drawn from a search's result: what a user reads off it."""

from __future__ import annotations

import dataclasses
import random

from torchmem.gui.plots.tune_plot import TunePlot
from torchmem.tuning.search import BatchSearch, Trial

MiB = 1 << 20


def searched(noise: float) -> BatchSearch:
    rng = random.Random(3)

    def run(b: int, role: str, predicted: float | None) -> Trial:
        peak = (600 * MiB + 48 * 1024 * b) * (1 + rng.uniform(-noise, noise))
        rate = 1000 * b / (b + 16) * rng.uniform(0.6, 1.0)  # a busy machine's samples/s
        return Trial(b, int(peak), ok=True, oom=False, samples_per_s=rate)

    return BatchSearch(run, 900 * MiB, 1, 4096).run()


def test_repeats_of_a_size_are_one_throughput_point_and_one_line_has_one_label(qtbot):
    plot = TunePlot()
    qtbot.addWidget(plot)
    result = searched(noise=0.03)
    sizes = {t.batch_size for t in result.trials}
    assert len(sizes) < len(result.trials), "the search repeated a size"
    plot.draw(result.trials, result.fit, result, 1000 * MiB, 900 * MiB, None, (1, 4096), True)
    xs, _ = plot.rate_curve.getData()
    assert len(xs) == len(sizes), "one samples/s point per size, not one per run"
    # The answer is the model's prediction: one line, labelled once.
    same = dataclasses.replace(result, predicted=result.recommended)
    plot.draw(same.trials, same.fit, same, 1000 * MiB, 900 * MiB, None, (1, 4096), True)
    assert plot.pick_line.label.format == "recommended = predicted"
    assert plot.predicted_line.label.format == ""
    differ = dataclasses.replace(result, predicted=result.recommended + 100)
    plot.draw(differ.trials, differ.fit, differ, 1000 * MiB, 900 * MiB, None, (1, 4096), True)
    assert plot.pick_line.label.format == "recommended"
    assert plot.predicted_line.label.format == "predicted"
