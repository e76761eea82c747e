"""A cluster's topology domains in the terminal view: one line per declared level, e.g.
``dc rack: b1-r1 4/4 free, b1-r2 2/4, +6 more; largest 4 x 8 A100 in b1-r1`` (whole free
nodes / schedulable GPU nodes of each domain, then the largest gang of 8-GPU pods that fits
inside one domain), cut to the width it is drawn in.

Rows come from ``/v1/clusters``' ``topology`` (``levels_from_json``, defensive like the rest
of ``broker.cli.view``: a field missing or of the wrong type reads as empty); ``domain_line``
is pure and table-tested; ``DomainLines`` draws the lines at the console's width.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rich.console import Console, ConsoleOptions, RenderResult
from rich.text import Text

ELLIPSIS = "…"


@dataclass(frozen=True, slots=True)
class DomainView:
    domain: str
    nodes: int  # schedulable GPU nodes
    free_nodes: int  # with every GPU free


@dataclass(frozen=True, slots=True)
class LevelView:
    """One level of a cluster: its listed domains, how many more there are, and the
    largest gang inside one domain (pods of ``gang_gpus`` GPUs of ``gang_type``, 0: none)."""

    name: str
    domains: tuple[DomainView, ...]
    more: int = 0
    gang: int = 0
    gang_gpus: int = 8
    gang_type: str = ""
    gang_domain: str = ""


def _int(doc: Mapping[str, Any], key: str) -> int:
    value = doc.get(key)
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0


def _dicts(value: object) -> list[Mapping[str, Any]]:
    return [x for x in value if isinstance(x, Mapping)] if isinstance(value, list) else []


def levels_from_json(value: object) -> tuple[LevelView, ...]:
    """A cluster's ``topology`` of ``/v1/clusters`` as rows (a domain without a name is
    left out; the largest gang: the GPU type with the most pods, the first by name among
    equals)."""
    levels = []
    for lv in _dicts(value):
        domains = tuple(
            DomainView(str(d.get("domain", "")), _int(d, "nodes"), _int(d, "freeNodes"))
            for d in _dicts(lv.get("domains"))
            if d.get("domain")
        )
        gangs = sorted(_dicts(lv.get("largestGangs")), key=lambda g: str(g.get("gpuType", "")))
        best = max(gangs, key=lambda g: _int(g, "largestGang"), default={})
        levels.append(LevelView(
            str(lv.get("name") or lv.get("level") or ""), domains, _int(lv, "more"),
            _int(best, "largestGang"), _int(lv, "gangGpusPerPod") or 8,
            str(best.get("gpuType", "")), str(best.get("domain", "")),
        ))  # fmt: skip
    return tuple(levels)


def domain_line(cluster: str, level: LevelView, width: int) -> str:
    """``<cluster> <level>: <domain> <free>/<nodes> free, ...[, +N more]; largest ...``
    in at most ``width`` characters: as many domains as fit beside the head and the largest
    gang, the rest counted; cut with an ellipsis only when not even those fit."""
    head = f"{cluster} {level.name}: "
    if level.gang:
        tail = f"; largest {level.gang} x {level.gang_gpus} {level.gang_type}"
        tail += f" in {level.gang_domain}" if level.gang_domain else ""
    else:
        tail = f"; no {level.gang_gpus}-GPU pod fits one {level.name}"
    parts = [
        f"{d.domain} {d.free_nodes}/{d.nodes}" + (" free" if i == 0 else "")
        for i, d in enumerate(level.domains)
    ]
    total = len(parts) + level.more
    if not total:
        return _cut(head + "no domains", width)
    shown = len(parts)
    while shown > 0 and len(_line(head, parts, shown, total, tail)) > width:
        shown -= 1
    return _cut(_line(head, parts, max(shown, 0), total, tail), width)


def _line(head: str, parts: Sequence[str], shown: int, total: int, tail: str) -> str:
    listed = list(parts[:shown])
    if shown < total:
        listed.append(f"+{total - shown} more" if shown else f"{total} domain" + "s" * (total > 1))
    return head + ", ".join(listed) + tail


def _cut(line: str, width: int) -> str:
    if width <= 0:
        return ""
    return line if len(line) <= width else line[: width - 1] + ELLIPSIS


class DomainLines:
    """Lines of ``(cluster, level)`` drawn at the width the console gives them."""

    def __init__(self, levels: Iterable[tuple[str, LevelView]]) -> None:
        self._levels = list(levels)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        for cluster, level in self._levels:
            text = Text(domain_line(cluster, level, options.max_width), no_wrap=True)
            text.stylize("bold", 0, len(cluster))
            yield text


__all__ = ["DomainLines", "DomainView", "LevelView", "domain_line", "levels_from_json"]
