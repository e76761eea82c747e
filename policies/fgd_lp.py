"""``fgd-cpu`` whose shared pods keep GPUs packable: ``fgd-lp``.

FGD judges a shared pod's GPU by the popular shapes that could still use what is left, one
pod ahead. Pairs of shares are a packing problem that one pod ahead does not see: a
230-milli pod beside a 650-milli one leaves 120 milli that almost nothing fills, where a 320
would have fitted, and the 230 would have made a full GPU beside a 550 and a 220.

``fgd-lp`` prices every shared size by the bin-packing linear programme of the workload's
own share mix (``policies.share_prices``: the part of a GPU one pod of the size is worth
when GPUs are packed as well as the mix allows) and charges a shared pod, on each GPU it
could take, the pattern value it loses there: what the GPU could still hold at those prices,
less the pod's price, less what the GPU could hold after it. A placement that loses less
always wins; among placements that lose the same (most often nothing) ``fgd-cpu`` decides,
with FGD's score, the GPUs it strands and BestFit among equals. Whole-GPU and CPU-only pods
place exactly as in ``fgd-cpu``.

The prices come from the same shape distribution FGD is handed; nothing is fitted to a
trace. Pure and deterministic: the same pods in the same order give the same placements.
"""

from __future__ import annotations

from collections.abc import Sequence

from broker.model import MILLI_PER_GPU
from policies.fgd import DEFAULT_WORKLOAD, PodShape
from policies.fgd_cpu import FgdCpuChooser
from policies.scoring import NodeScoringPolicy, by_name
from policies.share_prices import ShareLoss, lp_prices

# Points off a placement's score per milli of pattern value it loses. FGD's score and the
# stranding term move a node's score by a few hundred points at most, so a placement that
# loses a milli more never wins on their terms: the loss is compared first.
_POINTS_PER_LOST_MILLI = 1_000.0


def share_mix(workload: Sequence[tuple[PodShape, float]]) -> dict[int, float]:
    """How often each shared size (milli of one GPU) comes in the workload."""
    mix: dict[int, float] = {}
    for shape, popularity in workload:
        if shape.gpus == 1 and 0 < shape.per_gpu_milli < MILLI_PER_GPU:
            mix[shape.per_gpu_milli] = mix.get(shape.per_gpu_milli, 0.0) + popularity
    return mix


class FgdLpChooser(FgdCpuChooser):
    def __init__(self, workload: Sequence[tuple[PodShape, float]]) -> None:
        super().__init__(workload)
        self.loss = ShareLoss(lp_prices(share_mix(self.frag.workload)))

    def gpu_cost(self, free: int, size: int) -> float:
        return _POINTS_PER_LOST_MILLI * self.loss.milli(free, size)


def fgd_lp(workload: Sequence[tuple[PodShape, float]] = DEFAULT_WORKLOAD) -> NodeScoringPolicy:
    """``fgd-cpu`` whose shared pods lose the least pattern value of the workload's share
    mix, priced by its bin-packing linear programme."""
    return NodeScoringPolicy("fgd-lp", FgdLpChooser(workload), by_name, best_cluster=True)
