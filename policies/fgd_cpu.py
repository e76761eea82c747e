"""FGD that keeps CPU for the GPUs it leaves free: ``fgd-cpu``.

FGD measures fragmentation against the next pod only: a node whose free GPUs the popular
shapes can still use scores well even when its free CPU will not feed all of them. Filled
pod by pod, such nodes end with whole GPUs that no pod can take for want of CPU, and CPU-only
pods, which FGD scores the same on every node, add to it.

``fgd-cpu`` adds the change in *stranded* GPU milli to FGD's score. A node strands the free
GPU milli its free CPU cannot feed at the workload's own CPU per GPU milli (every pod's CPU,
CPU-only pods included, over every pod's GPU request):

    stranded = max(0, free GPU milli - free CPU / (CPU per GPU milli))

and a placement that strands more scores lower by 100 x sigmoid'(0) / 1000 = 0.025 per
milli, the weight FGD's own score gives one milli of fragmentation near zero change, so
stranded and fragmented capacity count alike. Placements that strand nothing keep FGD's
integer score and its BestFit tie-break. No constant is fitted to a trace.

Pure and deterministic: the same pods in the same order give the same placements.
"""

from __future__ import annotations

from collections.abc import Sequence

from broker.model import NodeState, Resources
from policies.fgd import DEFAULT_WORKLOAD, FgdChooser, PodShape
from policies.scoring import NodeScoringPolicy, by_name

# d/dx of 100 x sigmoid(x / 1000) at x = 0: FGD's score change per milli of fragmentation.
_PER_MILLI = 100 / 4 / 1000


def cpu_per_gpu_milli(workload: Sequence[tuple[PodShape, float]]) -> float | None:
    """The workload's CPU milli per GPU milli; None when it asks for no GPU."""
    cpu = sum(p * shape.cpu_milli for shape, p in workload)
    gpu = sum(p * shape.gpus * shape.per_gpu_milli for shape, p in workload)
    return cpu / gpu if gpu > 0 else None


def stranded(cpu_free: int, gpu_free_milli: int, ratio: float) -> float:
    """GPU milli that ``cpu_free`` cannot feed at ``ratio`` CPU milli per GPU milli."""
    return max(0.0, gpu_free_milli - cpu_free / ratio)


class FgdCpuChooser(FgdChooser):
    def __init__(self, workload: Sequence[tuple[PodShape, float]]) -> None:
        super().__init__(workload)
        self.ratio = cpu_per_gpu_milli(workload)

    def penalty(self, state: NodeState, res: Resources) -> float:
        if self.ratio is None:
            return 0.0
        cpu, free = state.cpu_free, state.free_milli
        more = stranded(cpu - res.cpu_milli, free - res.gpu_request_milli, self.ratio)
        return _PER_MILLI * (more - stranded(cpu, free, self.ratio))


def fgd_cpu(workload: Sequence[tuple[PodShape, float]] = DEFAULT_WORKLOAD) -> NodeScoringPolicy:
    """``fgd`` that also counts the GPUs a placement leaves without CPU to feed them."""
    return NodeScoringPolicy("fgd-cpu", FgdCpuChooser(workload), by_name, best_cluster=True)
