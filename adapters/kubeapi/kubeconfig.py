"""One Kubernetes API client per kubeconfig context, with secrets kept out of messages.

Every error raised here is a ``broker.ports.KubeconfigError`` whose message has been
scrubbed of the kubeconfig's credentials (tokens, passwords, client keys), so it can be
logged or shown.

``in_cluster_client``: no kubeconfig, the pod's own service account (the API server's
Service from the environment, the CA and the projected token the kubelet mounts). The
library's in-cluster loader re-reads the token file when a token it read is a minute old,
before a request, so the kubelet's rotation of the projected token is followed without a
restart.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from kubernetes.aio.client import ApiClient, Configuration
from kubernetes.aio.config import incluster_config, kube_config

from broker.ports import KubeconfigError

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
_REDACTED = "<redacted>"
_MIN_SECRET = 4


def _leaves(value: Any) -> Iterable[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _leaves(v)
    elif isinstance(value, list):
        for v in value:
            yield from _leaves(v)


class Secrets:
    """Every string under the kubeconfig's ``users`` entries: what must never be shown."""

    def __init__(self, values: Iterable[str] = ()) -> None:
        self._values = sorted({v for v in values if len(v) >= _MIN_SECRET}, key=len, reverse=True)

    @staticmethod
    def of(doc: Any) -> Secrets:
        users = doc.get("users") if isinstance(doc, dict) else None
        secrets: list[str] = []
        for user in users or ():
            if isinstance(user, dict):
                secrets.extend(_leaves(user.get("user")))
        return Secrets(secrets)

    def scrub(self, text: str) -> str:
        for value in self._values:
            text = text.replace(value, _REDACTED)
        return text


INLINE = "(inline)"  # how an inline kubeconfig is named in messages


def read_kubeconfig(source: Path | str | dict[str, Any]) -> tuple[dict[str, Any], Secrets]:
    """A kubeconfig from a file (``Path``) or inline (YAML text or an already parsed
    mapping), with the secrets it holds."""
    label = source if isinstance(source, Path) else INLINE
    if isinstance(source, Path):
        try:
            text = source.read_text(encoding="utf-8")
        except OSError as exc:
            reason = exc.strerror or type(exc).__name__
            raise KubeconfigError(f"kubeconfig {source}: {reason}") from None
    if isinstance(source, dict):
        doc: Any = source
    else:
        try:
            doc = yaml.safe_load(text if isinstance(source, Path) else source)
        except yaml.YAMLError:
            raise KubeconfigError(f"kubeconfig {label}: not valid YAML") from None
    if not isinstance(doc, dict):
        raise KubeconfigError(f"kubeconfig {label}: not a kubeconfig mapping")
    return doc, Secrets.of(doc)


def context_names(doc: dict[str, Any]) -> list[str]:
    contexts = doc.get("contexts") or []
    return [str(c["name"]) for c in contexts if isinstance(c, dict) and "name" in c]


async def load_clients(
    source: Path | str | dict[str, Any], contexts: Sequence[str] = ()
) -> tuple[dict[str, ApiClient], Secrets]:
    """An ApiClient per context (all contexts of the kubeconfig when none are named), from
    a file or an inline kubeconfig (relative certificate paths of an inline one are taken
    from the working directory).

    The caller owns the clients and must ``await client.close()`` each.
    """
    doc, secrets = read_kubeconfig(source)
    path = source if isinstance(source, Path) else INLINE
    base = source.parent.resolve() if isinstance(source, Path) else Path.cwd()
    known = context_names(doc)
    wanted = list(contexts) or known
    if not wanted:
        raise KubeconfigError(f"kubeconfig {path}: no contexts")
    for name in wanted:
        if name not in known:
            raise KubeconfigError(f"kubeconfig {path}: no context {name!r}")
    clients: dict[str, ApiClient] = {}
    try:
        for name in wanted:
            try:
                loader = kube_config.KubeConfigLoader(  # type: ignore[no-untyped-call]
                    config_dict=doc,
                    active_context=name,
                    config_base_path=str(base),
                )
                configuration = Configuration()
                await loader.load_and_set(configuration)  # type: ignore[no-untyped-call]
            except Exception as exc:  # the library raises many kinds; all are user errors
                message = secrets.scrub(str(exc).splitlines()[0] if str(exc) else "")
                raise KubeconfigError(
                    f"kubeconfig {path}: context {name!r}: {type(exc).__name__}: {message}"
                ) from None
            clients[name] = ApiClient(configuration=configuration)
    except BaseException:
        for client in clients.values():
            await client.close()  # type: ignore[no-untyped-call]
        raise
    return clients, secrets


def in_cluster_client(
    environ: Mapping[str, str] = os.environ, directory: Path = SERVICE_ACCOUNT_DIR
) -> ApiClient:
    """An ApiClient as the pod's service account: ``KUBERNETES_SERVICE_HOST``/``_PORT``
    from ``environ``, ``token`` and ``ca.crt`` from ``directory``; the token is re-read as
    it rotates (see the module's docstring). The caller owns the client."""
    loader = incluster_config.InClusterConfigLoader(  # type: ignore[no-untyped-call]
        token_filename=str(directory / "token"),
        cert_filename=str(directory / "ca.crt"),
        try_refresh_token=True,
        environ=environ,
    )
    configuration = Configuration()
    try:
        loader.load_and_set(configuration)  # type: ignore[no-untyped-call]
    except Exception as exc:  # the loader's messages name files and variables, no token
        message = str(exc).splitlines()[0] if str(exc) else ""
        raise KubeconfigError(
            f"in-cluster service account: {type(exc).__name__}: {message}"
        ) from None
    return ApiClient(configuration=configuration)
