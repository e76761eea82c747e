"""The schemas admission validates what a tenant sends against, shipped as data that
``generate`` (beside this module) writes from the upstream sources it records: Kubernetes'
own pod and batch Job types (``kubernetes.json``) and the workload kinds' CRDs
(``crds.json``). Read once, on first use; nothing here validates (``broker.manifest.kubeschema``
does)."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
QUANTITY_MARK = "x-fedbroker-quantity"


@functools.cache
def kubernetes() -> dict[str, Any]:
    """``{"source": ..., "roots": [...], "$defs": {...}}``: Kubernetes' definitions."""
    return json.loads((HERE / "kubernetes.json").read_text())  # type: ignore[no-any-return]


@functools.cache
def crds() -> dict[str, Any]:
    """``apiVersion/Kind`` -> ``{"source": ..., "plural": ..., "schema": <spec schema>}``."""
    return json.loads((HERE / "crds.json").read_text())  # type: ignore[no-any-return]


__all__ = ["QUANTITY_MARK", "crds", "kubernetes"]
