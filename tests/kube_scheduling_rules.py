"""The API server's rules for a pod's tolerations and node affinity
(kubernetes/kubernetes ``pkg/apis/core/validation/validation.go``: ``ValidateTolerations``,
``ValidateNodeSelector``/``ValidateNodeSelectorRequirement``,
``ValidateNodeFieldSelectorRequirement``): a toleration's key a qualified name, an empty key
only with ``Exists``, no value with ``Exists``, known operators and effects,
``tolerationSeconds`` only with ``NoExecute``; required node affinity with at least one term,
label requirements with the values their operator needs, field requirements only on
``metadata.name`` with ``In``/``NotIn`` and one value.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kube_names import each, qualified_name
from kube_schema import Cause, forbidden, invalid, required, unsupported

EMPTY_KEY_MSG = (
    'operator must be Exists when `key` is empty, which means "match all values and all keys"'
)
ONE_NODE_MSG = "must be only one value when `operator` is 'In' or 'NotIn' for node field selector"


def tolerations(given: list[Mapping[str, Any]], path: str) -> list[Cause]:
    out: list[Cause] = []
    for i, toleration in enumerate(given):
        here = f"{path}[{i}]"
        key, operator = toleration.get("key") or "", toleration.get("operator") or "Equal"
        if key:
            out += each(f"{here}.key", key, qualified_name(key))
        elif operator != "Exists":
            out.append(
                invalid(
                    f"{here}.operator",
                    operator,
                    EMPTY_KEY_MSG,
                )
            )
        if operator == "Exists" and toleration.get("value"):
            out.append(
                invalid(
                    f"{here}.operator",
                    toleration,
                    "value must be empty when `operator` is 'Exists'",
                )
            )
        elif operator not in ("Equal", "Exists"):
            out.append(unsupported(f"{here}.operator", operator, ["Equal", "Exists"]))
        effect = toleration.get("effect") or ""
        if effect not in ("", "NoSchedule", "PreferNoSchedule", "NoExecute"):
            out.append(
                unsupported(
                    f"{here}.effect", effect, ["NoSchedule", "PreferNoSchedule", "NoExecute"]
                )
            )
        if toleration.get("tolerationSeconds") is not None and effect != "NoExecute":
            out.append(
                invalid(
                    f"{here}.effect",
                    effect,
                    "effect must be 'NoExecute' when `tolerationSeconds` is set",
                )
            )
    return out


def node_affinity(affinity: Mapping[str, Any] | None, path: str) -> list[Cause]:
    """Required node selector terms: at least one, each requirement well formed."""
    out: list[Cause] = []
    required_terms = (affinity or {}).get("requiredDuringSchedulingIgnoredDuringExecution")
    if required_terms is None:
        return out
    terms_path = f"{path}.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms"
    terms = required_terms.get("nodeSelectorTerms") or []
    if not terms:
        out.append(required(terms_path, "must have at least one node selector term"))
    for i, term in enumerate(terms):
        for j, expression in enumerate(term.get("matchExpressions") or ()):
            out += _requirement(
                expression, f"{terms_path}[{i}].matchExpressions[{j}]", fields=False
            )
        for j, expression in enumerate(term.get("matchFields") or ()):
            out += _requirement(expression, f"{terms_path}[{i}].matchFields[{j}]", fields=True)
    return out


def _requirement(expression: Mapping[str, Any], path: str, fields: bool) -> list[Cause]:
    operator, values = expression.get("operator"), expression.get("values") or []
    out: list[Cause] = []
    if fields and expression.get("key") != "metadata.name":
        out.append(invalid(f"{path}.key", expression.get("key"), "not a valid field selector key"))
    elif not fields:
        out += each(
            f"{path}.key", str(expression.get("key")), qualified_name(str(expression.get("key")))
        )
    if operator in ("In", "NotIn"):
        if not values:
            out.append(
                required(f"{path}.values", "must be specified when `operator` is 'In' or 'NotIn'")
            )
        elif fields and len(values) != 1:
            out.append(
                required(
                    f"{path}.values",
                    ONE_NODE_MSG,
                )
            )
    elif operator in ("Exists", "DoesNotExist") and not fields:
        if values:
            out.append(
                forbidden(
                    f"{path}.values",
                    "may not be specified when `operator` is 'Exists' or 'DoesNotExist'",
                )
            )
    elif operator in ("Gt", "Lt") and not fields:
        if len(values) != 1:
            out.append(
                required(
                    f"{path}.values",
                    "must be specified single value when `operator` is 'Lt' or 'Gt'",
                )
            )
    else:
        out.append(
            unsupported(
                f"{path}.operator",
                operator,
                ["In", "NotIn"]
                if fields
                else ["DoesNotExist", "Exists", "Gt", "In", "Lt", "NotIn"],
            )
        )
    return out
