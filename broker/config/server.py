"""How the broker process runs: its store, its API listener, limits and TLS, the scheduler's
timings, leader election among replicas, the MQTT broker it publishes events to, and where
the audit trail goes."""

from __future__ import annotations

import socket
from pathlib import Path
from urllib.parse import urlsplit

from pydantic import Field, field_serializer, field_validator, model_validator

from broker.config.section import Section, TokenRef
from broker.manifest import FieldError
from broker.manifest.fields import MAX_PODS
from broker.store import sqlite_path, sqlite_url

DEFAULT_STORE_URL = sqlite_url("data/fedbroker.db")  # relative to the working directory


class StoreConfig(Section):
    # repr=False: a PostgreSQL URL may carry a password.
    url: str = Field(default=DEFAULT_STORE_URL, repr=False)

    @field_validator("url")
    @classmethod
    def _known_scheme(cls, url: str) -> str:
        # The URL itself is not repeated: it may hold a password.
        if not url.startswith(("sqlite://", "postgresql://", "postgres://")):
            raise ValueError("must start with sqlite:// or postgresql://")
        return url

    @field_serializer("url")
    def _dumped_redacted(self, url: str) -> str:
        return self.redacted_url  # dumps are for showing, like SecretStr's "**********"

    @property
    def sqlite_path(self) -> Path | None:
        """The database file of a SQLite URL (``sqlite://rel/path``, ``sqlite:///abs/path``:
        the store's convention, see broker.store.sqlite_path)."""
        return Path(sqlite_path(self.url)) if self.is_sqlite else None

    @property
    def is_sqlite(self) -> bool:
        return self.url.startswith("sqlite://")

    @property
    def redacted_url(self) -> str:
        """The URL fit for logs: any password replaced by ``***``."""
        parts = urlsplit(self.url)
        if parts.password is None:
            return self.url
        netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
        return parts._replace(netloc=netloc).geturl()


class RateLimit(Section):
    requests_per_second: float = Field(default=100.0, gt=0, le=1_000_000)
    burst: int = Field(default=200, ge=1, le=1_000_000)


def _existing_file(path: str) -> str:
    """A file that exists now (relative to the working directory); the path is not secret."""
    if not Path(path).is_file():
        raise ValueError(f"no such file: {path}")
    return path


class TlsConfig(Section):
    """HTTPS on the API (TLS 1.2+, broker.http.tls): the server's certificate chain and key
    (PEM, unencrypted key), re-read when the files change; with ``clientCAFile``, mutual
    TLS (clients must present a certificate signed by it). ``caFile``: the CA the replicas'
    certificates are verified with when a follower forwards a write to the leader (default:
    ``clientCAFile``, else the system's trust store)."""

    cert_file: str = Field(min_length=1, max_length=4096)
    key_file: str = Field(min_length=1, max_length=4096)
    client_ca_file: str | None = Field(
        default=None, alias="clientCAFile", min_length=1, max_length=4096
    )
    ca_file: str | None = Field(default=None, min_length=1, max_length=4096)
    reload_seconds: float = Field(default=5.0, gt=0, le=3600)  # how often mtimes are checked

    @field_validator("cert_file", "key_file", "client_ca_file", "ca_file")
    @classmethod
    def _files_exist(cls, path: str | None) -> str | None:
        return None if path is None else _existing_file(path)


class PlanLimits(Section):
    """Dry runs, ``POST /v1/plan`` and explain's per-cluster rows (broker/service/planner.py):
    one at a time in a worker thread, each on a time budget, a few admitted per tenant and
    a few waiting in all; beyond, 429 with Retry-After."""

    # A dry run must answer for any job that may be submitted (MAX_PODS); lower it to
    # refuse larger dry runs with a 400.
    max_pods: int = Field(default=MAX_PODS, ge=1, le=MAX_PODS)
    budget_seconds: float = Field(default=5.0, gt=0, le=60)
    per_tenant: int = Field(default=2, ge=1, le=64)  # waiting or running, per caller's tenant
    max_waiting: int = Field(default=8, ge=0, le=1024)  # behind the running one, all tenants


class ApiConfig(Section):
    host: str = Field(default="127.0.0.1", min_length=1, max_length=253)
    port: int = Field(default=8080, ge=0, le=65_535)  # 0: any free port (tests)
    # A manifest is a few KB; 256 KiB leaves room for large pod templates.
    body_limit_bytes: int = Field(default=256 << 10, ge=1024, le=64 << 20)
    rate_limit_per_tenant: RateLimit = RateLimit()
    # Requests without a valid token, per source address (a scan, a guessing client).
    rate_limit_unauthenticated: RateLimit = RateLimit.model_validate(
        {"requestsPerSecond": 5.0, "burst": 20}
    )
    tls: TlsConfig | None = None
    # The bytes of one log answer (GET /v1/jobs/{name}/logs); past it, a last line says so.
    log_limit_bytes: int = Field(default=10 << 20, ge=1024, le=1 << 30)
    plans: PlanLimits = PlanLimits()


class RetentionConfig(Section):
    """How long finished (Succeeded, Failed, Cancelled) jobs stay in the store and lists;
    the leader purges older ones every ``purgeEverySeconds``. Active jobs are never purged."""

    finished_jobs_seconds: float = Field(default=7 * 86_400, gt=0, le=10 * 365 * 86_400)
    purge_every_seconds: float = Field(default=300.0, gt=0, le=86_400)
    # How long a finished (Succeeded, Failed) job's pods stay in its member for `fedbroker
    # pods/logs` before the broker deletes them; 0: at the next garbage collection.
    finished_pods_seconds: float = Field(default=600.0, ge=0, le=7 * 86_400)


class AuditConfig(Section):
    """The audit trail (broker.http.audit): one JSON line per write and per denied request,
    appended to ``file``; without one, on stderr (apart from the process's log lines)."""

    file: str | None = Field(default=None, min_length=1, max_length=4096)

    @field_validator("file")
    @classmethod
    def _directory_exists(cls, path: str | None) -> str | None:
        if path is not None and not Path(path).parent.is_dir():
            raise ValueError(f"no such directory: {Path(path).parent}")
        return path


class SchedulerConfig(Section):
    cycle_seconds: float = Field(default=1.0, gt=0, le=60)
    max_jobs_per_cycle: int = Field(default=1000, ge=1, le=100_000)
    # A cycle runs on the event loop: past this it stops deciding (the rest wait for the
    # next cycle), so the API never waits longer behind it.
    max_cycle_seconds: float = Field(default=0.5, gt=0, le=60)
    # Kueue's requeue defaults: 60 s, doubling, capped at one hour, no limit unless set.
    backoff_base_seconds: float = Field(default=60.0, gt=0, le=86_400)
    backoff_cap_seconds: float = Field(default=3600.0, gt=0, le=7 * 86_400)
    backoff_limit: int | None = Field(default=None, ge=0, le=1000)
    # A member's permanent refusals of a job's launch (400/403/404/409/422 on a create)
    # before the job fails with the member's message; the ones before back off as above.
    launch_refusal_limit: int = Field(default=3, ge=1, le=100)
    # How long a waiting gang lets smaller jobs backfill before its capacity is held for it.
    starvation_seconds: float = Field(default=300.0, ge=0, le=86_400)
    stale_after_seconds: float = Field(default=60.0, gt=0, le=3600)
    # How often objects with our origin label that belong to no live job (nor to a finished
    # one whose pods are kept: retention.finishedPodsSeconds) are deleted from Kubernetes
    # members.
    garbage_collect_seconds: float = Field(default=60.0, gt=0, le=86_400)
    # DESIGN.md: unplaceable this long -> the burst controller plans cloud nodes.
    burst_after_seconds: float = Field(default=30.0, ge=0, le=86_400)

    @model_validator(mode="after")
    def _cap_above_base(self) -> SchedulerConfig:
        if self.backoff_cap_seconds < self.backoff_base_seconds:
            raise FieldError(["backoffCapSeconds"], "must be >= backoffBaseSeconds")
        return self


class LeaderElectionConfig(Section):
    """Several replicas on one store: exactly one places (broker/leader.py). ``enabled``
    defaults to on for a PostgreSQL store; a SQLite store always elects with an OS file
    lock (one machine; the timings do not apply) and ``enabled: false`` on PostgreSQL means
    the operator runs exactly one replica."""

    enabled: bool | None = None
    lease_seconds: float = Field(default=15.0, gt=0, le=3600)
    renew_seconds: float = Field(default=2.0, gt=0, le=600)
    # A leader that has not renewed for this long stops placing: before its lease expires,
    # so before another replica can take it.
    stop_after_seconds: float = Field(default=10.0, gt=0, le=3600)
    identity: str | None = Field(default=None, min_length=1, max_length=253)
    # A follower proxies a write (POST/PUT/PATCH/DELETE under /v1/) to the leader when the
    # leader's identity is an address (host:port); false, or when that fails: 503 naming it.
    forward_writes: bool = True

    @model_validator(mode="after")
    def _ordered(self) -> LeaderElectionConfig:
        if self.renew_seconds >= self.stop_after_seconds:
            raise FieldError(["renewSeconds"], "must be < stopAfterSeconds")
        if self.stop_after_seconds >= self.lease_seconds:
            raise FieldError(["stopAfterSeconds"], "must be < leaseSeconds")
        return self


# --- MQTT events (broker.service.mqtt) ----------------------------------------------------------


def _default_client_id() -> str:
    return f"fedbroker-{socket.gethostname()}"[:128]


class MqttTlsConfig(Section):
    """TLS to the MQTT broker (adapters.mqtt.tls): its certificate verified with ``caFile``
    (default: the system's trust store); with ``certFile`` and ``keyFile`` (PEM, an
    unencrypted key) the broker shows its own client certificate, which mosquitto can take
    as its username (deploy/mosquitto). Files that changed are loaded again before each
    reconnect: a renewed certificate is used from the next connection on."""

    ca_file: str | None = Field(default=None, min_length=1, max_length=4096)
    cert_file: str | None = Field(default=None, min_length=1, max_length=4096)
    key_file: str | None = Field(default=None, min_length=1, max_length=4096)

    @field_validator("ca_file", "cert_file", "key_file")
    @classmethod
    def _files_exist(cls, path: str | None) -> str | None:
        return None if path is None else _existing_file(path)

    @model_validator(mode="after")
    def _pair(self) -> MqttTlsConfig:
        if self.cert_file is not None and self.key_file is None:
            raise FieldError(["keyFile"], "required with certFile")
        if self.key_file is not None and self.cert_file is None:
            raise FieldError(["certFile"], "required with keyFile")
        return self


class MqttEventsConfig(Section):
    """The MQTT broker fedbroker publishes its events to (and hears agents on)."""

    host: str = Field(min_length=1, max_length=253)
    port: int = Field(default=1883, ge=1, le=65_535)
    client_id: str = Field(
        default_factory=_default_client_id, min_length=1, max_length=128, pattern=r"^[^\s#+/]+$"
    )
    username: str | None = Field(default=None, min_length=1, max_length=256)
    password: TokenRef | None = Field(default=None, repr=False)
    # Topic levels without wildcards, no leading or trailing slash.
    topic_prefix: str = Field(
        default="fedbroker", max_length=128, pattern=r"^[^#+/\s]+(/[^#+/\s]+)*$"
    )
    outbox_size: int = Field(default=10_000, ge=1, le=1_000_000)
    tls: MqttTlsConfig | None = None  # None: plain TCP


class EventsConfig(Section):
    mqtt: MqttEventsConfig | None = None
