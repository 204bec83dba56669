"""The total of a job: the latest reading of every rank, summed per series.

A torchrun job is several processes; users want each rank and the whole. The ranks'
samples arrive at their own times, so the total is the sum of each rank's latest value,
published as ``total/<device>/<metric>`` whenever a rank reports. A job on several
machines also gets a total per machine (``@node1/<device>/<metric>``). Peaks are not
summed (the sum of peaks taken at different moments is no peak), nor system-wide figures.
"""

from __future__ import annotations

from torchmem.events import Event, Sample
from torchmem.series import COUNT_METRICS, TOTAL_SCOPE, is_sum_scope, split_key, split_scope
from torchmem.session import Session

#: Metrics whose sum over ranks means something.
SUMMED = frozenset({"allocated", "reserved", "nvml_used", "rss", "uss"})


class RankTotals:
    """Listens to a Session and submits the job's total after each rank's sample."""

    def __init__(
        self,
        session: Session,
        expected: set[str] | None = None,
        since: float | None = None,
        nodes: dict[str, str] | None = None,
    ) -> None:
        self.session = session
        #: The machine of each rank (``rank3`` -> ``@node1``), for the per-machine totals.
        self.nodes = dict(nodes or {})
        #: Ranks that must all have reported before a total means anything.
        self.expected = set(expected or ())
        #: Replayed history is left out: the ranks' pasts arrive one rank after another,
        #: so their sum at a past moment is unknown.
        self.since = session.now() if since is None else since
        self._latest: dict[str, dict[str, float]] = {}  # series -> {scope: value}
        self._unsubscribe = session.subscribe(self.on_event)

    def on_event(self, event: Event) -> None:
        """Fold a rank's sample into the totals (its own total samples are ignored)."""
        if not isinstance(event, Sample) or event.t < self.since:
            return
        changed = set()
        for key, value in event.values.items():
            scope, rest = split_scope(key)
            if not scope or is_sum_scope(scope):
                continue
            metric = split_key(rest)[1]
            if metric not in SUMMED or metric in COUNT_METRICS:
                continue
            self._latest.setdefault(rest, {})[scope] = value
            changed.add(rest)
        complete = {r for r in changed if self.expected <= self._latest[r].keys()}
        if not complete:
            return
        values = {f"{TOTAL_SCOPE}/{r}": sum(self._latest[r].values()) for r in complete}
        for rest in complete if self.nodes else ():
            by_node: dict[str, float] = {}
            for scope, value in self._latest[rest].items():
                node = self.nodes.get(scope)
                if node is not None:
                    by_node[node] = by_node.get(node, 0.0) + value
            values.update({f"{node}/{rest}": total for node, total in by_node.items()})
        self.session.submit(Sample(event.t, values))

    def forget(self, scope: str) -> None:
        """Leave out a rank that ended (its last reading no longer holds memory)."""
        self.expected.discard(scope)
        for values in self._latest.values():
            values.pop(scope, None)

    def close(self) -> None:
        """Stop listening."""
        self._unsubscribe()
