"""The federation's pod mix, learnt from the jobs the scheduler decides: FGD's workload.

The fgd family places against a distribution of pod shapes (Weng et al.'s *target
workload*): a node counts as fragmented for the shapes that are likely to come, and
``fgd-lp`` prices shared sizes by how that mix packs. The simulator hands them the trace's
distribution. The service learns it: the shapes of the last ``window`` pods of the jobs the
scheduler decides, each job counted once however many cycles it waits. Until ``least`` pods
have been seen the policies keep their built-in default. The mix is re-read every ``every``
new pods, and published (``version`` moves) only when it has moved by more than ``drift``
in total variation, so a steady workload keeps one policy instance and its memos. A
restarted broker learns the mix again, from the jobs still waiting first.
"""

from __future__ import annotations

from collections import Counter, OrderedDict, deque

from broker.model import Job
from policies.fgd import PodShape, popular_of_counts

Workload = tuple[tuple[PodShape, float], ...]


def distance(a: Workload, b: Workload) -> float:
    """Total variation between two shape distributions: half the sum of the differences."""
    pa, pb = dict(a), dict(b)
    return 0.5 * sum(abs(pa.get(s, 0.0) - pb.get(s, 0.0)) for s in pa.keys() | pb.keys())


class PodMix:
    def __init__(
        self, window: int = 10_000, least: int = 200, every: int = 100, drift: float = 0.1
    ) -> None:
        # The window as runs of alike pods (a gang's pod set is one run), oldest first.
        self._runs: deque[tuple[PodShape, int]] = deque()
        self._counts: Counter[PodShape] = Counter()
        self._pods = 0
        # Jobs already counted (tenant, name), as many as the window could hold.
        self._seen: OrderedDict[tuple[str, str], None] = OrderedDict()
        self._window, self._least, self._every, self._drift = window, least, every, drift
        self._fresh = 0
        self._published: Workload = ()
        self.workload: Workload | None = None
        self.version = 0

    def observe(self, job: Job) -> None:
        """Count ``job``'s pods once; re-read the mix every ``every`` new pods."""
        key = (job.tenant, job.name)
        if key in self._seen:
            return
        self._seen[key] = None
        if len(self._seen) > self._window:
            self._seen.popitem(last=False)
        for pod_set in job.pod_sets:
            self._add(PodShape.of(pod_set.resources, job.gpu_types), pod_set.count)
        if self._fresh >= self._every and self._pods >= self._least:
            self._fresh = 0
            # Compared whole: the popular shapes alone jump when one crosses their cut.
            now = tuple((shape, n / self._pods) for shape, n in self._counts.items())
            if self.workload is None or distance(now, self._published) > self._drift:
                self._published = now
                self.workload = popular_of_counts(self._counts)
                self.version += 1

    def _add(self, shape: PodShape, count: int) -> None:
        self._runs.append((shape, count))
        self._counts[shape] += count
        self._pods += count
        self._fresh += count
        while self._pods > self._window:  # the oldest pods leave the window
            old, n = self._runs.popleft()
            gone = min(n, self._pods - self._window)
            self._counts[old] -= gone
            if not self._counts[old]:
                del self._counts[old]
            self._pods -= gone
            if gone < n:
                self._runs.appendleft((old, n - gone))
