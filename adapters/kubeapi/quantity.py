"""Kubernetes resource quantities for the adapters: the broker's one parser,
``broker.quantity`` (at the bottom layer, so the manifest and the adapters share it).

Node allocatable and pod requests (``adapters.kube``) and the Cluster API scale-from-zero
annotations (``adapters.capi``) are read with it.
"""

from __future__ import annotations

from broker.quantity import QuantityError, parse_quantity

__all__ = ["QuantityError", "parse_quantity"]
