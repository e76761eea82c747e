"""The FederatedJob manifest: its wire format, its validation and its translation to a Job.

This package owns what a user may submit (DESIGN.md, "Job manifest"): the field types and
bounds that keep one bad manifest from hurting the broker (invariant 7) and Kubernetes
quantity parsing (``fields``), the pydantic wire models whose aliases are the camelCase
names (``models``), reading JSON or YAML into them (``parsing``), pydantic's errors as ONE
line naming the field path (``errors``), the template policy every pod template passes
before its job is stored (``podpolicy``, with the Pod Security Standards in ``podsecurity``
and every container's requests in ``podrequests``), and ``to_job``, the only bridge to
``broker.model`` (``translation``). A job gives ``podSets`` or one embedded Kubernetes
object, ``workload`` (batch Job, JobSet, PyTorchJob, RayJob, RayCluster), whose pod sets
are derived as Kueue derives them, one integration module per kind (``workloads``).
The API validates requests and generates its OpenAPI
schema from these same models. Import from the package: its names below are the API.
"""

from broker.manifest.errors import FieldError, ManifestError, field_path, first_error
from broker.manifest.fields import (
    MAX_GPUS_PER_POD,
    MAX_PRIORITY,
    CpuQuantity,
    DnsLabel,
    GpuTypeName,
    Labels,
    LabelValue,
    MemoryQuantity,
    cpu_millicores,
    memory_mebibytes,
)
from broker.manifest.models import API_VERSION, KIND, FederatedJob, json_schema
from broker.manifest.noderules import DEFAULT_RESERVED_TAINTS, NodeAccess
from broker.manifest.parsing import parse_manifest, stored_manifest
from broker.manifest.podpolicy import (
    PolicyViolation,
    admit_templates,
    derived_resources,
    template_violations,
)
from broker.manifest.podrequests import Violation, pod_requests
from broker.manifest.topology import qualified_key
from broker.manifest.translation import (
    master_port,
    pod_templates,
    to_job,
    workload_object,
    workload_of,
    workload_spec,
)
from broker.manifest.workloads import KINDS as WORKLOAD_KINDS
from broker.manifest.workloads import SUPPORTED as SUPPORTED_WORKLOADS
from broker.quantity import parse_quantity

__all__ = [
    "API_VERSION",
    "DEFAULT_RESERVED_TAINTS",
    "KIND",
    "MAX_GPUS_PER_POD",
    "MAX_PRIORITY",
    "SUPPORTED_WORKLOADS",
    "WORKLOAD_KINDS",
    "CpuQuantity",
    "DnsLabel",
    "FederatedJob",
    "FieldError",
    "GpuTypeName",
    "LabelValue",
    "Labels",
    "ManifestError",
    "MemoryQuantity",
    "NodeAccess",
    "PolicyViolation",
    "Violation",
    "admit_templates",
    "cpu_millicores",
    "derived_resources",
    "field_path",
    "first_error",
    "json_schema",
    "master_port",
    "memory_mebibytes",
    "parse_manifest",
    "parse_quantity",
    "pod_requests",
    "pod_templates",
    "qualified_key",
    "stored_manifest",
    "template_violations",
    "to_job",
    "workload_object",
    "workload_of",
    "workload_spec",
]
