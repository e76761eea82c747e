"""Pull mode's parts for one member, built as the broker builds them for a ``kube`` member
(``broker.service.members``): one ``KubeLauncher`` and one ``KubePods`` from the launch
config's settings, the manifest's workload kinds, and the executor that drives them."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from adapters.kube.launch import KubeLauncher
from adapters.kube.pods import KubePods
from adapters.kube.settings import LaunchSettings
from adapters.mqtt.publisher import Publisher
from broker.agent.commands import CommandExecutor
from broker.agent.config import AgentLaunchConfig
from broker.manifest.workloads import INTEGRATIONS

if TYPE_CHECKING:
    from kubernetes.aio.client import ApiClient
    from tenacity.wait import wait_base


def launch_settings(
    cluster: str, config: AgentLaunchConfig, retry_wait: wait_base | None = None
) -> LaunchSettings:
    return LaunchSettings(
        config.namespace_pattern, config.launch_mode, config.pod_group,
        cluster=cluster, gpu_resource=config.gpu_resources[0],
        shared_gpu_resource=config.shared_gpu_resource,
        scheduler_name=config.scheduler_name, volcano_queues=config.volcano_queues,
        poll_seconds=config.pod_poll_seconds, request_timeout=config.request_timeout_seconds,
        run_poll_seconds=config.pod_poll_seconds, resync_seconds=config.pod_resync_seconds,
        watch_inactivity_seconds=config.watch_inactivity_seconds, retry_wait=retry_wait,
    )  # fmt: skip


def executor_factory(
    cluster: str,
    api: ApiClient,
    config: AgentLaunchConfig,
    key: bytes,
    *,
    retry_wait: wait_base | None = None,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> Callable[[Publisher], CommandExecutor]:
    """What ``Agent(commands=...)`` takes: the executor of ``cluster``'s commands on the
    agent's publisher, launching through ``api`` as ``config`` says."""

    def build(publisher: Publisher) -> CommandExecutor:
        settings = launch_settings(cluster, config, retry_wait)
        executor: CommandExecutor  # built below, from the launcher that asks it for specs
        launcher = KubeLauncher(
            api, settings, kinds=INTEGRATIONS,
            spec_for=lambda p: executor.spec_for(p),  # noqa: PLW0108
            sleep=sleep,
        )  # fmt: skip
        pods = KubePods(
            api, launcher.objects, kinds=INTEGRATIONS,
            request_timeout=config.request_timeout_seconds, retry_wait=retry_wait,
        )  # fmt: skip
        executor = CommandExecutor(cluster, publisher, key, launcher, pods, config.policy())
        return executor

    return build


__all__ = ["executor_factory", "launch_settings"]
