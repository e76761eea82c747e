"""``fedbroker submit -f FILE|DIR|-``: every manifest document found, each submitted.

``-f`` names a file, ``-`` (stdin) or a directory (its ``*.yaml``, ``*.yml`` and ``*.json``
files, not its subdirectories, in name order); a YAML file may hold several documents
(``---`` lines). One document is answered as before: the job's table (or ``-o json|yaml``)
and, on stderr, what a name already known did. Several are submitted one by one, each
reported on its own line (``FILE: job 'x' submitted (Queued)``; ``FILE (document 2)`` when
the file holds several), and a failure is one line on stderr naming the file and the
document; the rest are still submitted, and the exit status is 1 if any failed.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from broker.cli.client import EXIT_ERROR, ClientError, exchange, submit_request
from broker.cli.connection import InputError, exit_status
from broker.cli.output import formatted
from broker.cli.render import render

SUFFIXES = (".yaml", ".yml", ".json")
TABLES = ("table", "wide")  # several answers: one line each (-o json|yaml: their items)
_SEPARATOR = re.compile(rb"^---(?=[ \t\r\n]|\Z)", re.MULTILINE)
_END = re.compile(rb"^\.\.\.[ \t]*$", re.MULTILINE)  # a document end marker


@dataclass(frozen=True)
class Document:
    """One manifest: where it came from (for messages) and its bytes."""

    source: str
    body: bytes
    is_json: bool


def documents(path: Path, stdin: Any = None) -> list[Document]:
    """The documents ``-f path`` stands for, in order; InputError (exit 2) names what is
    unreadable."""
    if str(path) == "-":
        return split(read_bytes(stdin or sys.stdin.buffer, "<stdin>"), "<stdin>", False)
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix in SUFFIXES and p.is_file())
        if not files:
            raise InputError(f"{path}: no *.yaml, *.yml or *.json file in this directory")
        return [d for f in files for d in split(read_bytes(f, str(f)), str(f), f.suffix == ".json")]
    return split(read_bytes(path, str(path)), str(path), path.suffix == ".json")


def read_bytes(source: Any, name: str) -> bytes:
    try:
        data: bytes = source.read_bytes() if isinstance(source, Path) else source.read()
    except OSError as exc:
        raise InputError(f"{name}: {exc.strerror}") from None
    return data


def split(body: bytes, source: str, is_json: bool) -> list[Document]:
    """A YAML stream's documents (empty ones skipped), named ``source (document N)`` when
    there are several; a JSON file is one document."""
    if is_json:
        return [Document(source, body, True)]
    parts = [p for p in _SEPARATOR.split(body) if not _empty(p)]
    if len(parts) <= 1:
        return [Document(source, body, False)]
    return [Document(f"{source} (document {i})", p, False) for i, p in enumerate(parts, 1)]


def _empty(part: bytes) -> bool:
    """A document of nothing (comments, an end marker): skipped, as kubectl does. One that
    does not parse is not empty: the broker says what is wrong with it."""
    try:
        return yaml.safe_load(_END.sub(b"", part)) is None
    except yaml.YAMLError:
        return False


def run_submit(args: argparse.Namespace) -> int:
    try:
        docs = documents(args.file)
        if len(docs) == 1:
            return asyncio.run(_submit_one(args, docs[0]))
        return asyncio.run(_submit_all(args, docs))
    except ClientError as exc:
        sys.stderr.write(f"fedbroker: error: {exc}\n")
        return exit_status(exc)
    except KeyboardInterrupt:
        return 130


async def _submit_one(args: argparse.Namespace, doc: Document) -> int:
    status, answer = await exchange(args, submit_request(args, doc.body, doc.source, doc.is_json))
    print(formatted(answer, args.output, lambda d: render("submit", d)))
    note = resubmit_note(status, answer)
    if note:
        sys.stderr.write(f"fedbroker: {note}\n")
    return 0


async def _submit_all(args: argparse.Namespace, docs: list[Document]) -> int:
    failed = 0
    answers: list[Any] = []
    for doc in docs:
        try:
            request = submit_request(args, doc.body, doc.source, doc.is_json)
            status, answer = await exchange(args, request)
        except ClientError as exc:
            failed += 1
            message = str(exc)
            named = message if message.startswith(doc.source) else f"{doc.source}: {message}"
            sys.stderr.write(f"fedbroker: error: {named}\n")
            continue
        answers.append(answer)
        if args.output in TABLES:
            print(f"{doc.source}: {outcome(status, answer)}", flush=True)
    if args.output not in TABLES:
        print(formatted({"items": answers}, args.output, str))
    return EXIT_ERROR if failed else 0


def outcome(status: int, answer: Any) -> str:
    """One line for one submission: what became of the job."""
    meta = answer.get("metadata", {}) if isinstance(answer, dict) else {}
    st = answer.get("status", {}) if isinstance(answer, dict) else {}
    name, state, generation = meta.get("name"), st.get("state"), st.get("generation") or 1
    if status == 200:
        return f"job {name!r} unchanged: it already exists with this spec ({state})"
    if generation > 1:
        return f"job {name!r} submitted again: run {generation} ({state})"
    return f"job {name!r} submitted ({state})"


def resubmit_note(status: int, doc: Any) -> str | None:
    """What a submission of a name already known did: reused a finished name (201 of a
    later generation), or answered the active job as it stands (200)."""
    if not isinstance(doc, dict):
        return None
    name = doc.get("metadata", {}).get("name")
    st = doc.get("status", {})
    generation = st.get("generation") or 1
    if status == 201 and generation > 1:
        return (
            f"job {name!r} had finished, so its name was reused: this is run "
            f"{generation} (generation {generation}), queued anew; `fedbroker get {name}` "
            f"follows this run, `fedbroker get {name} -o json` shows its generation, and the "
            f"earlier runs stay in the store's archive until retention purges them"
        )
    if status == 200:
        return (
            f"job {name!r} already exists with this spec ({st.get('state')}); nothing new was "
            f"submitted. To run it again: `fedbroker cancel {name}` then submit once it is "
            f"Cancelled, or change metadata.name"
        )
    return None


__all__ = ["Document", "documents", "outcome", "resubmit_note", "run_submit", "split"]
