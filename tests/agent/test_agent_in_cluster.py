"""The agent without ``--kubeconfig``: the pod's own service account
(adapters.kubeapi.kubeconfig.in_cluster_client, the library's in-cluster loader).

The API server is kmock behind a TLS-terminating proxy (tests/tcp_proxy.py) whose
certificate a test CA signed, as the kubelet's ``ca.crt`` would; the pod's environment and
its service-account directory are the test's. What is checked: the client reaches the
server named by ``KUBERNETES_SERVICE_HOST``/``_PORT``, verifies it with ``ca.crt`` and
sends the token file's token; the loader's refresh hook is installed (it re-reads the
token file once the token it holds is a minute old: the library's behaviour, not timed
here); a pod without the environment or the files is one line, exit 2.
"""

from __future__ import annotations

import ssl
from pathlib import Path

import kmock
import pytest
from pki import Authority
from tcp_proxy import TcpProxy
from test_agent import k8s

from adapters.kubeapi.kubeconfig import in_cluster_client
from broker.cli.main import main
from broker.ports import KubeconfigError

__all__ = ["k8s"]  # the fixture, used by name

TOKEN = "projected-token-3f9a1c7e5b2d4f60"


def service_account(directory: Path, authority: Authority) -> Path:
    directory.mkdir()
    (directory / "token").write_text(TOKEN)
    (directory / "ca.crt").write_bytes(authority.ca_file.read_bytes())
    return directory


async def test_the_pods_service_account_reaches_its_api_server(
    k8s: kmock.KubernetesEmulator, tmp_path: Path
) -> None:
    from kubernetes.aio.client import CoreV1Api

    authority = Authority(tmp_path)
    cert, key = authority.issue("kubernetes", 2)
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(cert, key)
    proxy = TcpProxy(int(str(k8s.url).rsplit(":", 1)[1].rstrip("/")), ssl=server)
    await proxy.start()
    environ = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(proxy.port)}
    client = in_cluster_client(environ, service_account(tmp_path / "sa", authority))
    try:
        assert client.configuration.host == proxy.url
        assert client.configuration.refresh_api_key_hook is not None  # follows rotation
        nodes = await CoreV1Api(client).list_node()
        assert [n.metadata.name for n in nodes.items if n.metadata] == ["n1"]
        assert {r.headers.get("Authorization") for r in k8s} == {f"bearer {TOKEN}"}
    finally:
        await client.close()  # type: ignore[no-untyped-call]
        await proxy.close()


def test_outside_a_pod_it_is_one_line(tmp_path: Path) -> None:
    authority = Authority(tmp_path)
    with pytest.raises(KubeconfigError, match=r"^in-cluster service account: .*not set"):
        in_cluster_client({}, service_account(tmp_path / "sa", authority))
    environ = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    with pytest.raises(KubeconfigError, match=r"^in-cluster service account: .*token"):
        in_cluster_client(environ, tmp_path / "nowhere")


@pytest.mark.usefixtures("real_logging")
def test_the_agent_outside_a_pod_without_kubeconfig_exits_2(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert main(["agent", "--cluster", "edge", "--mqtt-host", "127.0.0.1"]) == 2
    err = capsys.readouterr().err
    assert "in-cluster service account: " in err and err.count("\n") == 1, err
