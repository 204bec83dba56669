"""The totals of a job, derived from its processes' readings where they are kept.

A torchrun job is several processes; users want each rank and the whole. The ranks'
samples arrive at their own times, so a total is the sum of each rank's latest value, taken
whenever a rank reports (``total/<device>/<metric>``); a job on several machines also gets
a total per machine (``@node1/<device>/<metric>``). Peaks are not summed (the sum of peaks
taken at different moments is no peak), nor system-wide figures.

The Session folds every sample through this model as it applies it, and the recorder's
overview does the same: a total is derived from the ranks' readings wherever they are
kept, never submitted as a reading of its own (a listener that re-submitted totals made
every other listener hear a rank's sample and its total in an order it had to repair).
"""

from __future__ import annotations

from torchmem.events import JobMembers, Sample
from torchmem.series import TOTAL_SCOPE, is_sum_scope, scoped, split_key

#: Metrics whose sum over processes means something (byte counts, never a peak or a count).
SUMMED = frozenset({"allocated", "reserved", "nvml_used", "rss", "uss"})


class JobTotals:
    """Sums each series over a job's processes; inactive until told the job's members."""

    def __init__(self) -> None:
        self.members: JobMembers | None = None
        self._expected: frozenset[str] = frozenset()  # who must have reported, still running
        self._latest: dict[str, dict[str, float]] = {}  # series -> {scope: value}

    def on_members(self, members: JobMembers) -> None:
        """Start (or go on) summing, over the processes ``members`` names. Readings from
        before the first one are left out: an attached job's history is replayed one
        rank after another, so the ranks' sum at a past moment is unknown."""
        self.members = members
        self._expected = frozenset(members.expected) - frozenset(members.ended)
        for values in self._latest.values():
            for scope in members.ended:
                values.pop(scope, None)

    def fold(self, sample: Sample) -> dict[str, float]:
        """The totals that ``sample`` changes (``{"total/cpu/rss": bytes, ...}``); empty
        for a sample of a single process, of a process that ended, or before the members
        are known."""
        members = self.members
        if members is None or sample.t < members.t:
            return {}
        scope = sample.scope
        if not scope or is_sum_scope(scope) or scope in members.ended:
            return {}
        changed = set()
        for rest, value in sample.values.items():
            if split_key(rest)[1] not in SUMMED:
                continue
            self._latest.setdefault(rest, {})[scope] = value
            changed.add(rest)
        complete = [r for r in changed if self._expected <= self._latest[r].keys()]
        totals = {scoped(TOTAL_SCOPE, r): sum(self._latest[r].values()) for r in complete}
        for rest in complete if members.nodes else ():
            by_node: dict[str, float] = {}
            for scope, value in self._latest[rest].items():
                node = members.nodes.get(scope)
                if node is not None:
                    by_node[node] = by_node.get(node, 0.0) + value
            totals.update({scoped(node, rest): total for node, total in by_node.items()})
        return totals
