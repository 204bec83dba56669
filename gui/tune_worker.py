"""The Tune panel's worker: one batch-size search off the GUI thread.

The search (:mod:`torchmem.tuning`) blocks for as long as its trials run, each a separate
process; this worker runs it in a thread of its own and reports each trial, the fake-step
prediction and the end as signals, so the panel draws the search as it happens.
"""

from __future__ import annotations

from PySide6.QtCore import Signal

from torchmem.gui.workers import Worker
from torchmem.tuning.predict import predict
from torchmem.tuning.search import TuneCancelled, TuneError, TuneResult
from torchmem.tuning.trial import TrialPlan, plan_search


class TuneWorker(Worker):
    """Runs one search in its own thread; every trial is reported as it ends."""

    #: A trial ended: (Trial, the fit after it or None).
    trial_done = Signal(object, object)
    #: The fake steps ended (a Prediction, with its model or why there is none).
    predicted = Signal(object)
    cancelled = (TuneCancelled,)
    cancelled_text = "cancelled: no trial is left running"
    known = (TuneError,)
    failed_text = "tuning failed"

    def __init__(
        self,
        plan: TrialPlan,
        limit: int,
        minimum: int,
        maximum: int,
        rounding: str,
        predict_first: bool = False,
    ) -> None:
        super().__init__()
        self.plan = plan
        self.limit, self.minimum, self.maximum, self.rounding = limit, minimum, maximum, rounding
        self.predict_first = predict_first

    def work(self) -> TuneResult:
        """Predict (when asked), then search: a TuneResult (``finished`` carries None when
        it failed or was cancelled)."""
        prediction = None
        if self.predict_first:
            prediction = predict(
                self.plan, self.minimum, self.maximum, self.limit, self.cancel_event
            )
            self.predicted.emit(prediction)
        search = plan_search(
            self.plan,
            self.limit,
            self.minimum,
            self.maximum,
            self.rounding,  # type: ignore[arg-type]
            on_trial=lambda trial, fit: self.trial_done.emit(trial, fit),
            cancel=self.cancel_event,
            prediction=prediction,
        )
        return search.run()
