"""The FederatedJob manifest: its wire format, its validation and its translation to a Job.

This module owns what a user may submit (DESIGN.md, "Job manifest"): pydantic models whose
aliases are the camelCase wire names, the bounds that keep one bad manifest from hurting
the broker (invariant 7), Kubernetes quantity parsing, and the turning of pydantic's errors
into ONE line that names the field path. The API validates requests and generates its
OpenAPI schema from these same models; `to_job` is the only bridge to ``broker.model``.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from fractions import Fraction
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel
from pydantic.json_schema import DEFAULT_REF_TEMPLATE

from broker.model import GpuType, Job, PodSet, PolicyName, Resources

API_VERSION = "fedbroker.io/v1alpha1"
KIND = "FederatedJob"

# Bounds (invariant 7). Pod sets per job follow Kueue's limit of 8; the pod limits keep one
# gang's placement search and its launch fan-out small enough for one scheduling cycle.
MAX_POD_SETS = 8
MAX_PODS_PER_SET = 1024
MAX_PODS = 4096
MAX_GPUS_PER_POD = 16
MAX_PRIORITY = 1_000_000
MAX_TIMEOUT_SECONDS = 86_400
MAX_BACKOFF_LIMIT = 1000
MAX_CPU_MILLI = 1024 * 1000  # 1024 cores, above any node we know of
MAX_MEMORY_MIB = 16 * 1024 * 1024  # 16 TiB
MAX_LABELS = 32
MAX_GPU_TYPES = 32


class ManifestError(ValueError):
    """A manifest the user got wrong; ``str()`` is one line naming the field path."""

    def __init__(self, message: str, path: str = "manifest") -> None:
        super().__init__(_one_line(message))
        self.path = path


class FieldError(ValueError):
    """Raised inside validators to point below the field being validated, e.g. at
    ``gang.minMember`` from the spec's cross-field check. `first_error` appends ``path``."""

    def __init__(self, path: Sequence[str | int], message: str) -> None:
        super().__init__(message)
        self.path = tuple(path)
        self.message = message


# --- Kubernetes quantities -------------------------------------------------------------

_QUANTITY_PATTERN = r"^[+-]?(\d+(\.\d*)?|\.\d+)(Ki|Mi|Gi|Ti|Pi|Ei|[eE][+-]?\d+|m|k|M|G|T|P|E)?$"
_QUANTITY = re.compile(
    r"([+-]?)(\d+(?:\.\d*)?|\.\d+)(Ki|Mi|Gi|Ti|Pi|Ei|[eE][+-]?\d+|m|k|M|G|T|P|E)?"
)
# Decimal SI (m, k..E) and binary SI (Ki..Ei) suffixes; "e<n>" exponents are handled apart.
_SUFFIX: dict[str, Fraction] = {
    "": Fraction(1),
    "m": Fraction(1, 1000),
    **{s: Fraction(10 ** (3 * i)) for i, s in enumerate("kMGTPE", 1)},
    **{f"{s}i": Fraction(2 ** (10 * i)) for i, s in enumerate("KMGTPE", 1)},
}


def parse_quantity(value: object) -> Fraction:
    """A Kubernetes quantity ("64", "500m", "0.5", "512Gi", "1G", "1e3") as an exact number.

    Numbers (from YAML or JSON) are accepted too, booleans are not. Exact arithmetic, so
    "0.1" CPU is exactly 100 millicores and rounding happens once, upward, by the caller.
    """
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ValueError(f"not a quantity: {_show(value)}")
    text = value if isinstance(value, str) else str(value)
    match = _QUANTITY.fullmatch(text) if len(text) <= 64 else None
    if match is None:
        raise ValueError(f"not a quantity: {_show(value)}")
    sign, number, suffix = match.group(1), match.group(2), match.group(3) or ""
    amount = Fraction(number)
    if suffix[:1] in ("e", "E") and len(suffix) > 1:
        exponent = int(suffix[1:])
        if abs(exponent) > 30:  # exact powers of ten this large would only burn CPU
            raise ValueError(f"not a quantity: {_show(value)} (exponent out of range)")
        amount *= Fraction(10) ** exponent
    else:
        amount *= _SUFFIX[suffix]
    return -amount if sign == "-" else amount


def cpu_millicores(value: object) -> int:
    """CPU in millicores, rounded up (a request is never shrunk)."""
    return math.ceil(parse_quantity(value) * 1000)


def memory_mebibytes(value: object) -> int:
    """Memory in MiB, rounded up, so "1G" (10^9 bytes) is 954 MiB."""
    return math.ceil(parse_quantity(value) / 2**20)


def _bounded_quantity(value: object, to_int: Callable[[object], int], limit: int, unit: str) -> str:
    amount = to_int(value)
    if parse_quantity(value) <= 0:
        raise ValueError("must be positive")
    if amount > limit:
        raise ValueError(f"must be at most {unit}")
    return value if isinstance(value, str) else str(value)


def _cpu(value: object) -> str:
    return _bounded_quantity(value, cpu_millicores, MAX_CPU_MILLI, "1024 cores")


def _memory(value: object) -> str:
    return _bounded_quantity(value, memory_mebibytes, MAX_MEMORY_MIB, "16Ti")


_QUANTITY_SCHEMA = WithJsonSchema(
    {
        "anyOf": [
            {"type": "string", "pattern": _QUANTITY_PATTERN},
            {"type": "number", "exclusiveMinimum": 0},
        ]
    }
)
# The user's text is kept (numbers become their decimal text) so the manifest round-trips.
CpuQuantity = Annotated[str, BeforeValidator(_cpu), _QUANTITY_SCHEMA]
MemoryQuantity = Annotated[str, BeforeValidator(_memory), _QUANTITY_SCHEMA]


# --- names ---------------------------------------------------------------------------

_DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
_LABEL_NAME = r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
_LABEL_KEY = r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
_LABEL_VALUE = r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$"


def _name_check(pattern: str, max_length: int, what: str) -> Callable[[str], str]:
    compiled = re.compile(pattern)

    def check(value: str) -> str:
        if len(value) > max_length or not compiled.match(value):
            raise ValueError(f"{_show(value)} is not {what}")
        return value

    return check


def _name_schema(pattern: str, max_length: int) -> WithJsonSchema:
    return WithJsonSchema({"type": "string", "pattern": pattern, "maxLength": max_length})


_DNS_WHAT = (
    "a DNS-1123 label (lowercase letters, digits and '-', starting and ending with a "
    "letter or digit, at most 63 characters)"
)
DnsLabel = Annotated[
    str, AfterValidator(_name_check(_DNS_LABEL, 63, _DNS_WHAT)), _name_schema(_DNS_LABEL, 63)
]
GpuTypeName = Annotated[
    str,
    AfterValidator(_name_check(_LABEL_NAME, 63, "a GPU type name (letters, digits, '-_.')")),
    _name_schema(_LABEL_NAME, 63),
]
LabelKey = Annotated[
    str, AfterValidator(_name_check(_LABEL_KEY, 317, "a label key")), _name_schema(_LABEL_KEY, 317)
]
LabelValue = Annotated[
    str,
    AfterValidator(_name_check(_LABEL_VALUE, 63, "a label value")),
    _name_schema(_LABEL_VALUE, 63),
]
Labels = Annotated[dict[LabelKey, LabelValue], Field(max_length=MAX_LABELS)]


# --- the manifest --------------------------------------------------------------------


class WireModel(BaseModel):
    """camelCase on the wire, nothing unknown, no silent coercion ("8" is not a count)."""

    model_config = ConfigDict(alias_generator=to_camel, extra="forbid", strict=True, frozen=True)


class Metadata(WireModel):
    name: DnsLabel
    namespace: DnsLabel | None = None


class GangSpec(WireModel):
    min_member: int = Field(default=0, ge=0, le=MAX_PODS, description="0 means all pods")
    schedule_timeout_seconds: int = Field(default=600, ge=1, le=MAX_TIMEOUT_SECONDS)
    backoff_limit: int | None = Field(default=None, ge=0, le=MAX_BACKOFF_LIMIT)


class PlacementSpec(WireModel):
    gpu_types: list[GpuTypeName] = Field(default_factory=list, max_length=MAX_GPU_TYPES)
    cluster_selector: Labels = Field(default_factory=dict)
    # Opt-in: a cloud node costs money, so a job bursts only when its owner said so.
    allow_burst: bool = False


class ResourcesSpec(WireModel):
    nvidia_gpu: int | None = Field(default=None, alias="nvidia.com/gpu", ge=0, le=MAX_GPUS_PER_POD)
    amd_gpu: int | None = Field(default=None, alias="amd.com/gpu", ge=0, le=MAX_GPUS_PER_POD)
    gpu_milli: int | None = Field(default=None, alias="fedbroker.io/gpu-milli", ge=1, le=999)
    cpu: CpuQuantity | None = None
    memory: MemoryQuantity | None = None

    @model_validator(mode="after")
    def _one_kind_of_gpu(self) -> ResourcesSpec:
        if self.nvidia_gpu is not None and self.amd_gpu is not None:
            raise FieldError(["amd.com/gpu"], "ask for nvidia.com/gpu or amd.com/gpu, not both")
        if self.gpus and self.gpu_milli is not None:
            raise FieldError(
                ["fedbroker.io/gpu-milli"],
                "ask for whole GPUs or a fedbroker.io/gpu-milli share of one, not both",
            )
        return self

    @property
    def gpus(self) -> int:
        return self.nvidia_gpu or self.amd_gpu or 0

    def to_resources(self) -> Resources:
        return Resources(
            gpus=self.gpus,
            gpu_milli=self.gpu_milli or 0,
            cpu_milli=cpu_millicores(self.cpu) if self.cpu is not None else 0,
            memory_mib=memory_mebibytes(self.memory) if self.memory is not None else 0,
        )


class PodSetSpec(WireModel):
    name: DnsLabel
    count: int = Field(ge=1, le=MAX_PODS_PER_SET)
    resources: ResourcesSpec
    # Free-form pod template, handed to the cluster as is; only checked to be plain JSON so
    # storing and echoing it can never fail later (YAML can hold dates, sets and bytes).
    template: dict[str, Any] = Field(default_factory=dict)

    @field_validator("template")
    @classmethod
    def _plain_json(cls, template: dict[str, Any]) -> dict[str, Any]:
        stack: list[tuple[tuple[str | int, ...], object]] = [((), template)]
        while stack:
            path, value = stack.pop()
            if isinstance(value, dict):
                for key, item in value.items():
                    if not isinstance(key, str):
                        raise FieldError(path, f"keys must be strings, got {_show(key)}")
                    stack.append(((*path, key), item))
            elif isinstance(value, list):
                stack.extend(((*path, i), item) for i, item in enumerate(value))
            elif isinstance(value, float) and not math.isfinite(value):
                raise FieldError(path, "must be a finite number")
            elif value is not None and not isinstance(value, str | int | float | bool):
                raise FieldError(path, f"must be plain JSON, got {type(value).__name__}")
        return template

    def tolerations(self) -> frozenset[str]:
        """Taint keys the template's pods tolerate (``spec.tolerations[].key``), so the
        placement honours the same tolerations the cluster will."""
        spec = self.template.get("spec")
        items = spec.get("tolerations") if isinstance(spec, dict) else None
        if not isinstance(items, list):
            return frozenset()
        return frozenset(
            t["key"] for t in items if isinstance(t, dict) and isinstance(t.get("key"), str)
        )


class JobSpec(WireModel):
    queue: DnsLabel | None = None
    priority: int = Field(default=0, ge=-MAX_PRIORITY, le=MAX_PRIORITY)
    policy: PolicyName = "auto"
    gang: GangSpec = GangSpec()  # frozen, so one shared default is safe
    placement: PlacementSpec = PlacementSpec()
    pod_sets: list[PodSetSpec] = Field(min_length=1, max_length=MAX_POD_SETS)

    @model_validator(mode="after")
    def _whole_job(self) -> JobSpec:
        seen: set[str] = set()
        for i, pod_set in enumerate(self.pod_sets):
            if pod_set.name in seen:
                raise FieldError(["podSets", i, "name"], f"duplicate pod set name {pod_set.name!r}")
            seen.add(pod_set.name)
        total = self.total_pods
        if total > MAX_PODS:
            raise FieldError(["podSets"], f"{total} pods in all, at most {MAX_PODS} allowed")
        if self.gang.min_member > total:
            raise FieldError(["gang", "minMember"], f"must be <= the job's {total} pods")
        return self

    @property
    def total_pods(self) -> int:
        return sum(ps.count for ps in self.pod_sets)


class FederatedJob(WireModel):
    api_version: Literal["fedbroker.io/v1alpha1"]
    kind: Literal["FederatedJob"]
    metadata: Metadata
    spec: JobSpec

    def wire(self) -> dict[str, Any]:
        """The manifest as JSON-ready data in its wire names (parses back to an equal one)."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


def json_schema(ref_template: str = DEFAULT_REF_TEMPLATE) -> dict[str, Any]:
    """The FederatedJob JSON schema, in wire names, for the OpenAPI document."""
    return FederatedJob.model_json_schema(by_alias=True, ref_template=ref_template)


# --- parsing and translation ----------------------------------------------------------


class _NoAliasLoader(yaml.SafeLoader):
    """safe_load without anchors/aliases: nested aliases expand exponentially ("billion
    laughs") once the manifest is validated, stored or echoed; a manifest never needs them."""

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()  # type: ignore[no-untyped-call]
            raise yaml.composer.ComposerError(
                None, None, "YAML aliases (*name) are not supported", event.start_mark
            )
        return super().compose_node(parent, index)  # the pure-Python path


def parse_manifest(body: bytes, content_type: str | None) -> FederatedJob:
    """Validate a FederatedJob from JSON or YAML; raises ManifestError (one line).

    A JSON content type is parsed as JSON only, a YAML one as YAML; anything else (curl's
    form type, none at all) is sniffed: JSON when it starts with '{', else YAML.
    """
    try:
        text = body.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise ManifestError("manifest: body is not UTF-8 text") from None
    if not text.strip():
        raise ManifestError("manifest: empty body")
    media = (content_type or "").split(";")[0].strip().lower()
    is_json = media == "application/json" or media.endswith("+json")
    is_yaml = media in ("application/yaml", "application/x-yaml", "text/yaml", "text/x-yaml")
    data: object
    if is_json or (not is_yaml and text.lstrip().startswith("{")):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            json_error = ManifestError(
                f"manifest: invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}"
            )
            if is_json:
                raise json_error from None
            try:
                data = _load_yaml(text)  # a YAML flow mapping also starts with '{'
            except ManifestError:
                raise json_error from None
        except (ValueError, RecursionError) as exc:
            raise ManifestError(f"manifest: invalid JSON: {_reason(exc)}") from None
    else:
        data = _load_yaml(text)
    if not isinstance(data, dict):
        raise ManifestError(f"manifest: must be a mapping (an object), got {_kind(data)}")
    try:
        return FederatedJob.model_validate(data)
    except ValidationError as exc:
        path, message = first_error(exc)
        raise ManifestError(f"{path or 'manifest'}: {message}", path or "manifest") from None


# libyaml's C loader when the wheel has it: the pure-Python one costs about 2 ms per
# manifest, the largest share of a submission.
_FAST_LOADER: Any = getattr(yaml, "CSafeLoader", None)


def _no_aliases(text: str) -> None:
    """The C loader composes in C, beyond _NoAliasLoader's reach: refuse aliases from its
    event stream first (a cheap pass, also in C)."""
    for event in yaml.parse(text, Loader=_FAST_LOADER):
        if isinstance(event, yaml.AliasEvent):
            mark: Any = event.start_mark  # libyaml's own Mark class, the same fields
            raise yaml.composer.ComposerError(
                None, None, "YAML aliases (*name) are not supported", mark
            )


def _load_yaml(text: str) -> object:
    try:
        if _FAST_LOADER is None:
            return yaml.load(text, Loader=_NoAliasLoader)
        _no_aliases(text)
        return yaml.load(text, Loader=_FAST_LOADER)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ManifestError(f"manifest: invalid YAML{where}: {exc.problem}") from None
    except (yaml.YAMLError, ValueError, TypeError, RecursionError) as exc:
        # int("9" * 5000) and other constructor failures surface as plain ValueErrors.
        raise ManifestError(f"manifest: invalid YAML: {_reason(exc)}") from None


def to_job(manifest: FederatedJob, tenant: str, default_queue: str) -> Job:
    """The placement core's Job for a validated manifest submitted by ``tenant``.

    The namespace defaults to the tenant; a namespace naming another tenant is refused by
    the caller (who knows about tenants), not here. ``backoffLimit`` has no place in Job
    and is read from the manifest by the lifecycle.
    """
    spec = manifest.spec
    return Job(
        name=manifest.metadata.name,
        pod_sets=tuple(
            PodSet(ps.name, ps.count, ps.resources.to_resources(), ps.tolerations())
            for ps in spec.pod_sets
        ),
        tenant=tenant,
        queue=spec.queue or default_queue,
        priority=spec.priority,
        gpu_types=frozenset(GpuType(t) for t in spec.placement.gpu_types),
        cluster_selector=dict(spec.placement.cluster_selector),
        min_member=spec.gang.min_member,
        schedule_timeout_seconds=spec.gang.schedule_timeout_seconds,
        policy=spec.policy,
        allow_burst=spec.placement.allow_burst,
    )


def pod_templates(wire: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    """Pod set name -> its non-empty pod template, from a stored manifest (wire names)."""
    pod_sets = (wire.get("spec") or {}).get("podSets") or []
    return {ps["name"]: ps["template"] for ps in pod_sets if ps.get("template")}


# --- one-line errors -----------------------------------------------------------------

_MESSAGES = {
    "missing": "required",
    "extra_forbidden": "unknown field",
    "int_type": "must be an integer",
    "string_type": "must be a string",
    "bool_type": "must be a boolean (true or false)",
    "float_type": "must be a number",
    "dict_type": "must be a mapping",
    "model_type": "must be a mapping",
    "model_attributes_type": "must be a mapping",
    "list_type": "must be a list",
    "finite_number": "must be a finite number",
    "greater_than_equal": "must be >= {ge}",
    "greater_than": "must be > {gt}",
    "less_than_equal": "must be <= {le}",
    "less_than": "must be < {lt}",
    "literal_error": "must be {expected}",
}


def first_error(exc: ValidationError) -> tuple[str, str]:
    """(field path, message) for pydantic's first error, plus " (and N more)".

    The input value is never repeated (a config error may be about a secret); messages
    that show a value build it themselves, from values that are safe to show.
    """
    errors = exc.errors(include_url=False)
    error = errors[0]
    loc: list[str | int] = list(error["loc"])
    ctx = error.get("ctx") or {}
    kind = error["type"]
    cause = ctx.get("error")
    prefix = ""
    if "[key]" in loc:
        loc = loc[: loc.index("[key]")]
        prefix = "key "
    if isinstance(cause, FieldError):
        loc.extend(cause.path)
        message = cause.message
    elif isinstance(cause, Exception) and kind in ("value_error", "assertion_error"):
        message = str(cause)
    elif kind in ("too_short", "too_long"):
        n = ctx.get("min_length" if kind == "too_short" else "max_length", 0)
        least = "at least" if kind == "too_short" else "at most"
        message = f"must have {least} {n} item{'' if n == 1 else 's'}"
    elif kind in _MESSAGES:
        message = _MESSAGES[kind].format(**ctx)
    else:
        message = error["msg"][:1].lower() + error["msg"][1:]
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return field_path(loc), _one_line(prefix + message + more)


def field_path(loc: Sequence[str | int]) -> str:
    """``("spec", "podSets", 0, "name")`` -> ``spec.podSets[0].name``."""
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += f".{part}" if path else str(part)
    return path


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _show(value: object) -> str:
    text = value if isinstance(value, str) else repr(value)
    return json.dumps(text[:40] + ("..." if len(text) > 40 else ""))


def _kind(value: object) -> str:
    return {list: "a list", str: "a string", type(None): "nothing"}.get(
        type(value), type(value).__name__
    )


def _reason(exc: BaseException) -> str:
    return "nested too deeply" if isinstance(exc, RecursionError) else str(exc)[:200]
