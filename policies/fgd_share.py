"""FGD with sharing-aware GPU choice: ``fgd-share``.

FGD scores every GPU a shared pod could go to and keeps the best score; among GPUs with the
same integer score the paper (and ``fgd``) takes the lowest index. Here the tie goes to the
fullest GPU (least free milli) first, so fractional pods stack on GPUs that are already
shared and whole GPUs stay free for whole-GPU pods; the lowest index breaks what is left.
Nodes are scored and tie-broken exactly as ``fgd`` does.

Pure and deterministic: the same pods in the same order give the same placements.
"""

from __future__ import annotations

from collections.abc import Sequence

from broker.model import NodeState, Resources
from policies.fgd import DEFAULT_WORKLOAD, FgdChooser, PodShape, _sigmoid_score
from policies.scoring import NodeScoringPolicy, by_name


class FgdShareChooser(FgdChooser):
    def score(self, state: NodeState, res: Resources) -> tuple[int, tuple[int, ...]] | None:
        if not res.gpu_milli:
            return super().score(state, res)
        if state.gpus_for(res) is None:  # also filters CPU and memory
            return None
        gpu_type = state.node.gpu_type
        before = self.frag.of(gpu_type, state.cpu_free, tuple(sorted(state.gpu_free)))
        cpu_after = state.cpu_free - res.cpu_milli
        frees = list(state.gpu_free)
        best: tuple[tuple[int, int], int] | None = None
        for i, free in enumerate(state.gpu_free):
            if free < res.gpu_milli:
                continue
            frees[i] = free - res.gpu_milli
            after = self.frag.of(gpu_type, cpu_after, tuple(sorted(frees)))
            frees[i] = free
            rank = (_sigmoid_score(before - after), -free)
            if best is None or rank > best[0]:
                best = (rank, i)
        return None if best is None else (best[0][0], (best[1],))


def fgd_share(workload: Sequence[tuple[PodShape, float]] = DEFAULT_WORKLOAD) -> NodeScoringPolicy:
    """``fgd`` whose shared pods go to the fullest of the GPUs FGD scores best."""
    return NodeScoringPolicy("fgd-share", FgdShareChooser(workload), by_name, best_cluster=True)
