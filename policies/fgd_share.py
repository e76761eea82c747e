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

from policies.fgd import DEFAULT_WORKLOAD, FgdChooser, PodShape
from policies.scoring import NodeScoringPolicy, by_name


class FgdShareChooser(FgdChooser):
    fullest_shared_first = True


def fgd_share(workload: Sequence[tuple[PodShape, float]] = DEFAULT_WORKLOAD) -> NodeScoringPolicy:
    """``fgd`` whose shared pods go to the fullest of the GPUs FGD scores best."""
    return NodeScoringPolicy("fgd-share", FgdShareChooser(workload), by_name, best_cluster=True)
