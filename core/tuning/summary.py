"""A batch-size search as ``torchmem tune --summary`` and the Tune panel's export write it:
the summary schema's core keys, then the search's own (plan, limit, trials, fit, answer).
"""

from __future__ import annotations

from typing import Any

from torchmem.report.summary import build_summary
from torchmem.tuning.function import plan_function
from torchmem.tuning.predict import Prediction
from torchmem.tuning.search import Trial, TuneResult
from torchmem.tuning.trial import TrialPlan


def tune_summary(
    plan: TrialPlan,
    args: list[str],
    limit: int,
    room: int,
    result: TuneResult | None,
    trials: list[Trial],
    duration: float,
    prediction: Prediction | None = None,
) -> dict[str, Any]:
    """The search as ``--summary`` (and the Tune panel's export) writes it."""
    fitting = [t.peak_bytes for t in trials if t.fits(limit) and t.peak_bytes is not None]
    metric = "cpu_rss" if plan.on_cpu else plan.device
    function = plan_function(plan)
    return build_summary(
        "tune",
        None,
        steps=sum(t.steps for t in trials),
        samples=0,
        peak_bytes={metric: max(fitting)} if fitting else {},
        alerts=[],
        script=None if function else plan.script,
        function=function,
        argv=[] if function else list(args),
        **({"command": [plan.script, *args]} if plan.job else {}),
        **({"prediction": prediction.to_json()} if prediction is not None else {}),
        batch_arg=plan.batch_arg,
        device=plan.device,
        budget_bytes=plan.budget_bytes,
        headroom_bytes=room,
        limit_bytes=limit,
        steps_per_trial=plan.steps,
        recommended=result.recommended if result else None,
        max_fitting=result.max_fitting if result else None,
        predicted=result.predicted if result else None,
        effect=result.effect.value if result else None,
        noise=result.noise.to_json() if result else None,
        knee=result.knee if result else None,
        fit=result.fit.to_json() if result and result.fit else None,
        fit_allocated=result.fit_allocated.to_json() if result and result.fit_allocated else None,
        ooms=sum(t.oom for t in trials),
        trials=[t.to_json() for t in trials],
        notes=result.notes if result else [],
        duration_s=round(duration, 3),
    )
