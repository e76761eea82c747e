"""What the Kubeflow kinds (the training operator's PyTorchJob, the MPI Operator's MPIJob)
share: their API group and why a tenant may not set their gang scheduling. Pure."""

from __future__ import annotations

GROUP = "kubeflow.org"
GANG_IS_THE_BROKERS = "the broker makes the gang, its size and its timeout (spec.gang)"
