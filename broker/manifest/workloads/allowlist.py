"""The fields of a workload object's ``spec`` a tenant may set, as each kind declares them:
the rules a table is made of, the walker that checks an object against its kind's table
(anything not listed is refused: an allowlist), where its pod templates are, and the rule
every pod template's metadata follows. Pure: no I/O.

A table is rows of ``(path, rule)``. A path is relative to the object's ``spec``, dotted,
``[*]`` standing for every item of a list and ``*`` for every value of a map; only leaves
are listed, so every parent is a mapping (or a list, before ``[*]``). A rule says what the
value may be (its type, bounds, the values allowed) and why, or refuses the field and says
why. A pod template is a leaf (``TEMPLATE``): what is inside it is the template policy's
(``broker.manifest.podpolicy``) and the schema's; ``templates`` finds every one of them in
an object, whatever its replica count or mode. Paths in what the walker returns are from
the object's root (``("spec", "replicatedJobs", 0, ...)``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import Any, Literal

from broker.manifest.podrequests import Violation
from broker.manifest.workloads.reading import Path

BROKER_DOMAIN = "fedbroker.io"
ITEMS = "[*]"
VALUES = "*"
INT32_MAX = 2**31 - 1
# Retries of a workload's pods or of the whole workload (a Job's backoffLimit, a JobSet's
# maxRestarts, ...): each retry runs inside the placement the broker made, so a bound keeps
# a failing job from holding it for ever; Kubernetes' own default for a Job is 6.
MAX_RETRIES = 100
# Kubernetes' own bound on a Job's maxFailedIndexes (and on completions with
# backoffLimitPerIndex), from the batch/v1 API validation.
MAX_FAILED_INDEXES = 100_000
# The broker reads how a workload ended from the object itself and deletes it when its job
# ends; an object deleted sooner by its TTL reads as deleted behind the broker's back, a
# failure. An hour outlasts a broker restart or a failover.
MIN_TTL_SECONDS = 3600

RuleKind = Literal["string", "boolean", "integer", "number", "labels", "template", "refused"]


@dataclass(frozen=True, slots=True)
class Rule:
    """What a tenant may write at one path: a ``kind`` of value within ``least``/``most``
    (numbers) and among ``values`` (when given), or ``refused``; ``why`` is said in the
    refusal and in docs/security.md."""

    kind: RuleKind
    why: str = ""
    least: int | None = None
    most: int | None = None
    values: tuple[str | bool, ...] = ()

    def describe(self) -> str:
        """The rule in a few words, for docs/security.md."""
        if self.kind == "refused":
            return "refused"
        if self.values:
            return " or ".join(f"`{str(v).lower() if isinstance(v, bool) else v}`"
                               for v in self.values)  # fmt: skip
        if self.kind in ("integer", "number") and (self.least, self.most) != (None, None):
            low = "" if self.least is None else f"{self.least}"
            high = "" if self.most is None else f"{self.most}"
            return f"{self.kind} {low}..{high}"
        return {"labels": "string map", "template": "pod template"}.get(self.kind, self.kind)


Table = tuple[tuple[str, Rule], ...]


def string(why: str = "") -> Rule:
    return Rule("string", why)


def one_of(*values: str, why: str = "") -> Rule:
    return Rule("string", why, values=values)


def boolean(why: str = "") -> Rule:
    return Rule("boolean", why)


def false_only(why: str) -> Rule:
    return Rule("boolean", why, values=(False,))


def whole(least: int, most: int = INT32_MAX, why: str = "") -> Rule:
    return Rule("integer", why, least=least, most=most)


def number(least: int, why: str = "") -> Rule:
    return Rule("number", why, least=least)


def refused(why: str) -> Rule:
    return Rule("refused", why)


LABELS = Rule("labels", f"free, but {BROKER_DOMAIN} keys are the broker's")
TEMPLATE = Rule("template", "checked by the template policy")


def under(prefix: str, table: Table) -> Table:
    """``table`` with every path below ``prefix``."""
    return tuple((f"{prefix}.{path}", rule) for path, rule in table)


NAMED_BY_CONTROLLER = (
    "a template's metadata carries only labels and annotations: its controller names what "
    "it makes and owns it, in the job's namespace"
)


def template_meta(prefix: str) -> Table:
    """The metadata of an embedded child template (a JobSet's Job template): labels and
    annotations only, as for pod templates."""
    named = ("name", "namespace", "finalizers")
    return (
        (f"{prefix}.labels", LABELS),
        (f"{prefix}.annotations", LABELS),
        *((f"{prefix}.{key}", refused(NAMED_BY_CONTROLLER)) for key in named),
    )


def markdown(table: Table) -> str:
    """``table`` as docs/security.md shows it: one row per path, what a tenant may write
    there, and why."""
    rows = [f"| `{path}` | {rule.describe()} | {rule.why} |" for path, rule in table]
    return "\n".join(["| field | a tenant may set | why |", "|---|---|---|", *rows])


# -- the walker --------------------------------------------------------------------------


@dataclass(slots=True)
class _Node:
    """One step of a table: a leaf's rule, or what lies below (named fields, list items or
    map values)."""

    rule: Rule | None = None
    fields: dict[str, _Node] = field(default_factory=dict)
    items: _Node | None = None
    values: _Node | None = None
    holds_template: bool = False  # a TEMPLATE leaf is here or below


def _mark_templates(node: _Node) -> bool:
    below = [*node.fields.values(), *(n for n in (node.items, node.values) if n is not None)]
    marked = [_mark_templates(child) for child in below]  # every child marked, not just one
    node.holds_template = any(marked) or (node.rule is not None and node.rule.kind == "template")
    return node.holds_template


def steps(path: str) -> tuple[str, ...]:
    """``"a[*].b.*"`` -> ``("a", "[*]", "b", "*")``."""
    out: list[str] = []
    for part in path.split("."):
        name, bracket, _ = part.partition("[")
        out.append(name)
        if bracket:
            out.append(ITEMS)
    return tuple(out)


@cache
def _compiled(table: Table) -> _Node:
    root = _Node()
    for path, rule in table:
        node = root
        for step in steps(path):
            if node.rule is not None:
                raise ValueError(f"{path}: below the leaf of another row")
            if step == ITEMS:
                node.items = node.items or _Node()
                node = node.items
            elif step == VALUES:
                node.values = node.values or _Node()
                node = node.values
            else:
                node = node.fields.setdefault(step, _Node())
        if node.rule is not None or node.fields or node.items or node.values:
            raise ValueError(f"{path}: listed twice, or a parent of another row")
        node.rule = rule
    _mark_templates(root)
    return root


def violations(table: Table, spec: Mapping[str, Any], kind: str) -> list[Violation]:
    """Every field of ``spec`` (a ``kind`` object's) that ``table`` does not allow, with its
    path from the object's root, in the object's order."""
    out: list[Violation] = []
    _walk(_compiled(table), spec, ("spec",), kind, out)
    return out


def _walk(node: _Node, value: Any, path: Path, kind: str, out: list[Violation]) -> None:
    if value is None:  # Kubernetes reads null as absent
        return
    if node.rule is not None:
        out.extend(_leaf(node.rule, value, path))
    elif node.items is not None:
        if not isinstance(value, list):
            out.append(Violation(path, "must be a list"))
            return
        for i, item in enumerate(value):
            _walk(node.items, item, (*path, i), kind, out)
    elif not isinstance(value, Mapping):
        out.append(Violation(path, "must be a mapping"))
    elif node.values is not None:
        for key, item in value.items():
            _walk(node.values, item, (*path, key), kind, out)
    else:
        for key, item in value.items():
            child = node.fields.get(key)
            if child is None:
                message = f"not a field a tenant may set in a {kind} (docs/security.md)"
                out.append(Violation((*path, key), message))
            else:
                _walk(child, item, (*path, key), kind, out)


def _leaf(rule: Rule, value: Any, path: Path) -> list[Violation]:
    because = f": {rule.why}" if rule.why else ""
    if rule.kind == "refused":
        return [Violation(path, f"not allowed: {rule.why}")]
    if rule.kind == "template":
        return [] if isinstance(value, Mapping) else [Violation(path, "must be a mapping")]
    if rule.kind == "labels":
        return _labels(value, path)
    wrong = _wrong_type(rule.kind, value)
    if wrong:
        return [Violation(path, wrong)]
    if rule.values and value not in rule.values:
        allowed = rule.describe().replace("`", "")
        return [Violation(path, f"must be {allowed}{because}")]
    if rule.least is not None and value < rule.least:
        return [Violation(path, f"must be >= {rule.least}{because}")]
    if rule.most is not None and value > rule.most:
        return [Violation(path, f"must be <= {rule.most}{because}")]
    return []


def _wrong_type(kind: RuleKind, value: Any) -> str | None:
    if kind == "boolean":
        return None if isinstance(value, bool) else "must be a boolean (true or false)"
    if kind == "string":
        return None if isinstance(value, str) else "must be a string"
    if isinstance(value, bool) or not isinstance(value, int | float):
        return "must be a number" if kind == "number" else "must be an integer"
    if kind == "integer" and not isinstance(value, int):
        return "must be an integer"
    return None


def _labels(value: Any, path: Path) -> list[Violation]:
    if not isinstance(value, Mapping):
        return [Violation(path, "must be a mapping")]
    out: list[Violation] = []
    for key, item in value.items():
        if reserved_key(key):
            out.append(Violation((*path, key), f"{BROKER_DOMAIN} keys are the broker's"))
        elif not isinstance(item, str):
            out.append(Violation((*path, key), "must be a string"))
    return out


def reserved_key(key: object) -> bool:
    """A label or annotation key of the broker's: ``fedbroker.io/...`` or
    ``<anything>.fedbroker.io/...``."""
    prefix, slash, _ = key.partition("/") if isinstance(key, str) else ("", "", "")
    return bool(slash) and (prefix == BROKER_DOMAIN or prefix.endswith("." + BROKER_DOMAIN))


# -- where the pod templates are ---------------------------------------------------------


def templates(table: Table, spec: Mapping[str, Any]) -> list[tuple[Path, Mapping[str, Any]]]:
    """Every pod template in ``spec`` at a ``TEMPLATE`` row of ``table``, with its path from
    the object's root, in the table's order of fields and the object's order of items (a
    value of the wrong type is skipped: the walker or the kind's reading refuses it)."""
    out: list[tuple[Path, Mapping[str, Any]]] = []
    _templates(_compiled(table), spec, ("spec",), out)
    return out


def _templates(
    node: _Node, value: Any, path: Path, out: list[tuple[Path, Mapping[str, Any]]]
) -> None:
    """Down the branches of the table that hold a template, only."""
    if node.rule is not None:
        if node.rule.kind == "template" and isinstance(value, Mapping):
            out.append((path, value))
    elif node.items is not None:
        for i, item in enumerate(value if isinstance(value, list) else ()):
            _templates(node.items, item, (*path, i), out)
    elif not isinstance(value, Mapping):
        return
    elif node.values is not None:
        for key, item in value.items():
            _templates(node.values, item, (*path, key), out)
    else:
        for key, child in node.fields.items():
            if child.holds_template and key in value:
                _templates(child, value[key], (*path, key), out)


def matches(pattern: str, path: Path) -> bool:
    """Whether ``path`` (from the object's root) is one that ``pattern`` (a table path,
    relative to ``spec``) names."""
    wanted = ("spec", *steps(pattern))
    if len(wanted) != len(path):
        return False
    for step, part in zip(wanted, path, strict=True):
        if step == ITEMS:
            if not isinstance(part, int):
                return False
        elif step not in (VALUES, part):
            return False
    return True


# -- every pod template's metadata -------------------------------------------------------

_TEMPLATE_KEYS = ("metadata", "spec")
_METADATA_KEYS = ("labels", "annotations")
_LABEL_MAPS = frozenset(_METADATA_KEYS)


def template_metadata(template: Mapping[str, Any], at: Path) -> list[Violation]:
    """What is wrong with a pod template's own fields and metadata (at ``at`` from the
    manifest root): a template holds only ``metadata`` and ``spec``, its metadata only
    labels and annotations (its controller names its pods, in the job's namespace, and owns
    them), and no map of labels or annotations anywhere in it has a key of the broker's."""
    out = [
        Violation((*at, key), "a pod template holds only metadata and spec")
        for key in template
        if key not in _TEMPLATE_KEYS
    ]
    meta = template.get("metadata")
    if isinstance(meta, Mapping):
        out.extend(
            Violation((*at, "metadata", key), NAMED_BY_CONTROLLER)
            for key in meta
            if key not in _METADATA_KEYS
        )
    out.extend(_reserved_anywhere(template, at))
    return out


def _reserved_anywhere(value: Any, at: Path) -> Iterator[Violation]:
    """Keys of the broker's in every ``labels`` or ``annotations`` map at any depth (the
    pod's own, a volume claim template's, ...), in the template's order. The manifest's
    depth is bounded (``broker.manifest.documents``), so is this recursion."""
    if isinstance(value, list):
        for i, item in enumerate(value):
            yield from _reserved_anywhere(item, (*at, i))
    elif isinstance(value, Mapping):
        for key, item in value.items():
            if key in _LABEL_MAPS and isinstance(item, Mapping):
                for name in item:
                    if reserved_key(name):
                        yield Violation((*at, key, name), f"{BROKER_DOMAIN} {key} are the broker's")
            yield from _reserved_anywhere(item, (*at, key))


__all__ = [
    "LABELS",
    "MAX_RETRIES",
    "MIN_TTL_SECONDS",
    "TEMPLATE",
    "Rule",
    "Table",
    "boolean",
    "false_only",
    "markdown",
    "matches",
    "number",
    "one_of",
    "refused",
    "reserved_key",
    "steps",
    "string",
    "template_meta",
    "template_metadata",
    "templates",
    "under",
    "violations",
    "whole",
]
