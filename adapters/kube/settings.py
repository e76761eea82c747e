"""How one Kubernetes member's launcher is set up: every knob the launchers of that member
share, in one frozen dataclass the composition fills from the member's config."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from tenacity.wait import wait_base

from adapters.kube.objects import Flavor, GangObjects, Mode


@dataclass(frozen=True, slots=True)
class LaunchSettings:
    """A member's launch settings.

    ``namespace_pattern``: each tenant's namespace (``{tenant}`` replaced); ``mode``: pin
    (the broker's nodes) or delegate (the member's gang scheduler, PodGroups of ``flavor``);
    ``origin``: the label value that marks our objects; GPU resource names as the member
    calls them; ``attempts``/``request_timeout``/``retry_wait``: each API call's bounded
    retries (``retry_wait`` None: tenacity's exponential default); ``poll_seconds``: how
    often a starting gang is looked at, ``run_poll_seconds`` a running workload;
    ``resync_seconds``/``watch_inactivity_seconds``: the list+watch of our pods."""

    namespace_pattern: str
    mode: Mode = "pin"
    flavor: Flavor = "coscheduling"
    origin: str = "fedbroker"
    cluster: str = ""
    gpu_resource: str = "nvidia.com/gpu"
    shared_gpu_resource: str | None = None
    scheduler_name: str | None = None
    volcano_queues: Mapping[str, str] = field(default_factory=dict)
    default_image: str = "busybox:stable"
    attempts: int = 5
    request_timeout: float = 30.0
    retry_wait: wait_base | None = None
    poll_seconds: float = 1.0
    run_poll_seconds: float = 5.0
    resync_seconds: float = 300.0
    watch_inactivity_seconds: float = 90.0

    def objects(self) -> GangObjects:
        """The builder and recogniser of this member's objects."""
        return GangObjects(
            self.namespace_pattern, self.mode, self.flavor, self.origin, cluster=self.cluster,
            gpu_resource=self.gpu_resource, shared_gpu_resource=self.shared_gpu_resource,
            scheduler_name=self.scheduler_name, default_image=self.default_image,
            volcano_queues=self.volcano_queues,
        )  # fmt: skip


__all__ = ["LaunchSettings"]
