"""How every printing command prints: ``-o table|wide|json|yaml`` (``--json`` kept as
``-o json``), and ``--sort-by``.

``table`` is for people; ``wide`` is the table with more columns where a command has them
(the same table where it has none, as kubectl does); ``json`` (indented) and ``yaml`` are the
command's whole document for scripts, the same data in either. A command hands ``emit`` its
document and how to draw it as a table; it writes no format code of its own.

``--sort-by`` takes a column of the table (``--sort-by STATE``, any case) or a path into
each item's document (``--sort-by .status.createdAt``; a number in the path picks an element
of a list: ``.gpuTypes.0.free``). Numbers sort as numbers, absent values last; the sort is
of the items the command fetched, in every output.

Commands whose documents are printed below the CLI's room (``simulate``, ``bench``: the
simulator and the benchmarks print JSON themselves) get YAML through ``yaml_from_json``,
which turns what they print as JSON into YAML.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import yaml

from broker.cli.args import UsageError

OUTPUTS = ("table", "wide", "json", "yaml")
Draw = Callable[[Any], str]


def add_output_options(parser: argparse.ArgumentParser, *, wide: bool = True) -> None:
    """``-o/--output`` and ``--json`` (the same as ``-o json``), into ``args.output``."""
    choices = OUTPUTS if wide else tuple(o for o in OUTPUTS if o != "wide")
    parser.add_argument(
        "-o", "--output", choices=choices, default="table",
        help="a table for people (wide: with more columns), or the whole document as JSON "
        "or YAML for scripts",
    )  # fmt: skip
    parser.add_argument(
        "--json", dest="output", action="store_const", const="json",
        help="the same as -o json",
    )  # fmt: skip


def add_sort_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--sort-by", metavar="COLUMN|.PATH", default=None,
        help="sort by a column of the table (NAME, STATE, ...) or a path into each item "
        "(.status.createdAt)",
    )  # fmt: skip


def formatted(doc: Any, output: str, draw: Draw, wide: Draw | None = None) -> str:
    """``doc`` as the user asked: JSON, YAML, the wide table, or the table."""
    if output == "json":
        return json.dumps(doc, indent=2)
    if output == "yaml":
        return yaml.safe_dump(doc, sort_keys=False).rstrip("\n")
    if output == "wide" and wide is not None:
        return wide(doc)
    return draw(doc)


def emit(doc: Any, output: str, draw: Draw, wide: Draw | None = None) -> None:
    print(formatted(doc, output, draw, wide))


# -- --sort-by ------------------------------------------------------------------------------


def sort_items(items: Sequence[Any], sort_by: str | None, columns: Mapping[str, str]) -> list[Any]:
    """``items`` sorted by a column (its path in ``columns``) or by a ``.path``; UsageError
    naming the columns for a word that is neither."""
    if not sort_by:
        return list(items)
    path = sort_by if sort_by.startswith(".") else columns.get(sort_by.upper())
    if path is None:
        known = ", ".join(columns) or "none (give a .path)"
        raise UsageError(f"--sort-by {sort_by}: no such column (columns: {known}; or a .path)")
    keys = [k for k in path.split(".") if k]
    if not keys:
        raise UsageError(f"--sort-by {sort_by}: an empty path")
    return sorted(items, key=lambda item: _rank(_at(item, keys)))


def _at(doc: Any, keys: Sequence[str]) -> Any:
    for key in keys:
        if isinstance(doc, Mapping):
            doc = doc.get(key)
        elif isinstance(doc, list) and key.isdigit() and int(key) < len(doc):
            doc = doc[int(key)]
        else:
            return None
    return doc


def _rank(value: Any) -> tuple[int, float, str]:
    if isinstance(value, bool) or value is None or isinstance(value, dict | list):
        return (2, 0.0, "") if value is None else (1, 0.0, json.dumps(value, sort_keys=True))
    if isinstance(value, int | float):
        return (0, float(value), "")
    return (1, 0.0, str(value))


# -- commands that print their JSON themselves ----------------------------------------------


@contextlib.contextmanager
def yaml_from_json(output: str) -> Iterator[None]:
    """Under ``-o yaml``, what the block prints is caught and each line that is a JSON
    document is printed again as YAML (a second document after ``---``); other lines pass
    as they are."""
    if output != "yaml":
        yield
        return
    caught = io.StringIO()
    with contextlib.redirect_stdout(caught):
        yield
    documents = 0
    for line in caught.getvalue().splitlines():
        try:
            doc = json.loads(line)
        except json.JSONDecodeError:
            print(line)
            continue
        if documents:
            print("---")
        documents += 1
        sys.stdout.write(yaml.safe_dump(doc, sort_keys=False))


__all__ = [
    "OUTPUTS",
    "add_output_options",
    "add_sort_option",
    "emit",
    "formatted",
    "sort_items",
    "yaml_from_json",
]
