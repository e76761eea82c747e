"""Tenant namespaces in a member cluster: each made to exist before a gang goes in, labelled
with the Pod Security Admission level of its tenant's profile, once per launcher and level.

The labels (``pod-security.kubernetes.io/{enforce,warn,audit}`` = the tenant's level, each
``-version: latest``) make the member cluster enforce the same Pod Security Standard the
broker checked the tenant's templates against. A namespace the broker creates also carries
``fedbroker.io/origin`` and ``fedbroker.io/tenant``; the broker never deletes a namespace.

Ensuring is get, then create if 404 (409 AlreadyExists from a racing creator is fine), then
a merge patch of the Pod Security labels when an existing namespace has other values: the
broker's config is the one source of a tenant's level, so a namespace made or relabelled by
hand is brought back to it, looser or stricter. Only those six labels are touched. A
namespace being deleted (Terminating) fails the launch; it is retried with the gang's backoff.
A create of the namespace the API server refuses for good (``calls.refused``: say, 403
when the broker may not create namespaces) fails the launch as a permanent refusal.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any, cast

from kubernetes.aio.client import CoreV1Api, V1Namespace
from kubernetes.aio.client.exceptions import ApiException

from adapters.kube.objects import LABEL_ORIGIN, LABEL_TENANT, KubeLaunchError, labels_of
from adapters.kubeapi.calls import ApiCalls, describe, refused

log = logging.getLogger(__name__)

PSA_PREFIX = "pod-security.kubernetes.io/"
PSA_MODES = ("enforce", "warn", "audit")
PSA_LEVELS = ("privileged", "baseline", "restricted")
HTTP_CONFLICT = 409
MERGE_PATCH = "application/merge-patch+json"


def pod_security_labels(level: str) -> dict[str, str]:
    """The Pod Security Admission labels that enforce (and warn and audit at) ``level``."""
    if level not in PSA_LEVELS:
        raise ValueError(f"unknown Pod Security level {level!r}")
    labels: dict[str, str] = {}
    for mode in PSA_MODES:
        labels[f"{PSA_PREFIX}{mode}"] = level
        labels[f"{PSA_PREFIX}{mode}-version"] = "latest"
    return labels


def namespace_body(name: str, tenant: str, level: str, origin: str) -> dict[str, Any]:
    labels = {LABEL_ORIGIN: origin, LABEL_TENANT: tenant, **pod_security_labels(level)}
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}


def labels_to_patch(existing: Mapping[str, Any], level: str) -> dict[str, str]:
    """The Pod Security labels an existing namespace lacks or has with another value."""
    have = labels_of(existing)
    return {k: v for k, v in pod_security_labels(level).items() if have.get(k) != v}


class TenantNamespaces:
    """Makes tenant namespaces exist with their Pod Security labels; remembers which it has
    (namespace -> level) so each costs one GET per process, until ``forget``."""

    def __init__(self, core: CoreV1Api, calls: ApiCalls, origin: str) -> None:
        self.core = core
        self.calls = calls
        self.origin = origin
        self._ensured: dict[str, str] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    def ensured(self, namespace: str) -> str | None:
        """The level ``namespace`` was last ensured at by this launcher (None: not yet)."""
        return self._ensured.get(namespace)

    def forget(self, namespace: str) -> None:
        """Ensure ``namespace`` again next time (a create in it answered 404: it is gone)."""
        self._ensured.pop(namespace, None)

    async def ensure(self, namespace: str, tenant: str, level: str) -> None:
        """``namespace`` exists with ``level``'s Pod Security labels, or ``KubeLaunchError``.
        Concurrent launches of one tenant wait for one another's answer."""
        if self._ensured.get(namespace) == level:
            return
        lock = self._locks.setdefault(namespace, asyncio.Lock())
        async with lock:
            if self._ensured.get(namespace) == level:
                return
            existing = await self._read(namespace)
            if existing is None:
                existing = await self._create(namespace, tenant, level)
            if existing is not None:
                await self._relabel(namespace, existing, level)
            self._ensured[namespace] = level

    async def _read(self, namespace: str) -> dict[str, Any] | None:
        found = await self.calls.maybe(
            f"read namespace {namespace}", lambda: self.core.read_namespace(namespace)
        )
        if found is None:
            return None
        obj = cast(dict[str, Any], self.core.api_client.sanitize_for_serialization(found))
        if (obj.get("status") or {}).get("phase") == "Terminating":
            raise KubeLaunchError(f"namespace {namespace} is being deleted (Terminating)")
        return obj

    async def _create(self, namespace: str, tenant: str, level: str) -> dict[str, Any] | None:
        """Create the namespace: None when created here, the existing one when another
        creator won the race (409)."""
        body = namespace_body(namespace, tenant, level, self.origin)
        try:
            await self.calls.call(
                f"create namespace {namespace}",
                lambda: self.core.create_namespace(V1Namespace.from_dict(body)),  # type: ignore[arg-type]
            )
        except ApiException as exc:
            if exc.status != HTTP_CONFLICT:
                raise KubeLaunchError(
                    f"create namespace {namespace}: {describe(exc)}", permanent=refused(exc)
                ) from exc
            log.info("namespace %s already exists (409); checking its labels", namespace)
            existing = await self._read(namespace)
            if existing is None:
                raise KubeLaunchError(
                    f"namespace {namespace}: AlreadyExists, then not found"
                ) from exc
            return existing
        log.info("created namespace %s for tenant %s (Pod Security %s)", namespace, tenant, level)
        return None

    async def _relabel(self, namespace: str, existing: Mapping[str, Any], level: str) -> None:
        patch = labels_to_patch(existing, level)
        if not patch:
            return
        await self.calls.checked(
            f"label namespace {namespace}",
            lambda: self.core.patch_namespace(
                namespace, {"metadata": {"labels": patch}}, _content_type=MERGE_PATCH
            ),
        )
        log.warning(
            "namespace %s: Pod Security labels set to %s (were %s)",
            namespace, level, labels_of(existing).get(f"{PSA_PREFIX}enforce", "unset"),
        )  # fmt: skip
