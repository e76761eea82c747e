"""JobRecord: one stored job, immutable, its manifest decoded from the row's text once.

Re-exported by ``broker.store`` (import it from there).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from broker.store import JobState

_LAZY: Final = frozenset({"manifest", "placement"})  # decoded from their text when read
_RECORD_FIELDS: Final = (
    "tenant", "name", "queue", "priority", "manifest", "state", "cluster", "placement",
    "attempts", "not_before", "reason", "created_at", "updated_at", "seq", "generation",
)  # fmt: skip


class _Slots:
    """JobRecord's slots, open: a record is made as one of these, then becomes a JobRecord
    (``__class__`` assigned: the same layout, which CPython allows). Setting 17 slots through
    ``object.__setattr__`` cost 2 us a record against 0.3 us this way, and a restart of
    100,000 live jobs makes 166,000 records. Nothing else is ever one of these."""

    __slots__ = (
        "_manifest",
        "_placement",
        "_placement_text",
        "_text",
        "attempts",
        "cluster",
        "created_at",
        "generation",
        "name",
        "not_before",
        "priority",
        "queue",
        "reason",
        "seq",
        "spec_text",
        "state",
        "tenant",
        "updated_at",
    )

    tenant: str
    name: str
    queue: str
    priority: int
    _manifest: dict[str, Any] | None  # decoded, or None until first read
    _text: str | None  # the row's JSON until decoded
    state: JobState
    cluster: str | None
    _placement: dict[str, Any] | None  # decoded (None: none, or not decoded yet)
    _placement_text: str | None  # the row's JSON until decoded
    attempts: int  # failed attempts so far, the requeue backoff's exponent (see transition)
    not_before: float | None  # epoch seconds: not schedulable before (requeue backoff)
    reason: str  # the last transition's reason
    created_at: float
    updated_at: float
    seq: int  # increasing submission order (FIFO); gaps are possible
    generation: int  # 1, then +1 each time the name is submitted again after it finished
    spec_text: str | None  # the manifest's spec as JSON text, when the query selected it


class JobRecord(_Slots):
    """One stored job, immutable, with the fields below (in this order when positional).

    ``manifest`` (the FederatedJob as submitted, JSON-able) and ``placement`` (JSON-able
    once placed) are decoded from the row's JSON text the first time they are read, once:
    most records a write hands back (a transition's, a placement's, a page of a restart's
    read) are never asked for them, and decoding them is most of what turning a row into a
    record costs. ``manifest_text`` and ``placement_text`` build one that way. Written by
    hand because a dataclass field cannot be decoded lazily.

    ``spec_text`` is the manifest's ``spec`` as JSON text, when the query that read the row
    selected it (``Store.active_jobs``: a restart's pages). It is a hint, not a field: it is
    derived from the manifest, so equality, ``replace``, copies and pickles leave it out.
    Equal specs read by one backend have equal texts, so a restart keys what it builds
    from a spec by the text without decoding the manifest.
    """

    __slots__ = ()

    def __new__(
        cls,
        tenant: str,
        name: str,
        queue: str,
        priority: int,
        manifest: dict[str, Any] | None,
        state: JobState,
        cluster: str | None,
        placement: dict[str, Any] | None,
        attempts: int,
        not_before: float | None,
        reason: str,
        created_at: float,
        updated_at: float,
        seq: int,
        generation: int = 1,
        *,
        manifest_text: str | None = None,
        placement_text: str | None = None,
        spec_text: str | None = None,
    ) -> JobRecord:
        if (manifest is None) == (manifest_text is None):
            raise TypeError("JobRecord takes exactly one of manifest and manifest_text")
        if placement is not None and placement_text is not None:
            raise TypeError("JobRecord takes at most one of placement and placement_text")
        made = object.__new__(_Slots)
        made.tenant = tenant
        made.name = name
        made.queue = queue
        made.priority = priority
        made._manifest = manifest
        made._text = manifest_text
        made.state = state
        made.cluster = cluster
        made._placement = placement
        made._placement_text = placement_text
        made.attempts = attempts
        made.not_before = not_before
        made.reason = reason
        made.created_at = created_at
        made.updated_at = updated_at
        made.seq = seq
        made.generation = generation
        made.spec_text = spec_text
        made.__class__ = cls  # frozen from here on (see _Slots)
        return made  # type: ignore[return-value]  # it is one now

    @property
    def manifest(self) -> dict[str, Any]:
        manifest = self._manifest
        if manifest is None:
            manifest = _decoded(self, "_manifest", "_text")
        return manifest

    @property
    def placement(self) -> dict[str, Any] | None:
        text = self._placement_text  # read first: the decoding thread clears it last
        placement = self._placement
        if placement is None and text is not None:
            placement = _decoded(self, "_placement", "_placement_text")
        return placement

    def replace(self, **changes: Any) -> JobRecord:
        """A copy with ``changes`` (field names as above), as ``dataclasses.replace`` gives
        a dataclass; an unknown field is a TypeError. O(fields). A manifest or placement
        not yet decoded is copied as its text, still not decoded (the manifest's with the
        spec's text), unless it is among the changes."""
        unknown = changes.keys() - set(_RECORD_FIELDS)
        if unknown:
            raise TypeError(f"JobRecord has no field {', '.join(sorted(unknown))}")
        fields = {f: getattr(self, f) for f in _RECORD_FIELDS if f not in _LAZY}
        if "placement" not in changes:
            fields["placement"], fields["placement_text"] = self.placement_as_read()
        if "manifest" in changes:
            return JobRecord(**{**fields, **changes})
        manifest, text = self.manifest_as_read()
        return JobRecord(
            **{**fields, **changes}, manifest=manifest, manifest_text=text,
            spec_text=self.spec_text,
        )  # fmt: skip

    def manifest_as_read(self) -> tuple[dict[str, Any] | None, str | None]:
        """(manifest, None) once decoded, else (None, its JSON text): what a copy of this
        record passes on without decoding it (``JobRecord(..., manifest, ...,
        manifest_text=text)``)."""
        text = self._text  # read first: the decoding thread sets the manifest, then clears it
        return (None, text) if text is not None else (self._manifest, None)

    def placement_as_read(self) -> tuple[dict[str, Any] | None, str | None]:
        """As ``manifest_as_read``, for the placement (``placement_text=``); (None, None)
        when there is none."""
        text = self._placement_text  # read first, as manifest_as_read
        return (None, text) if text is not None else (self._placement, None)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"JobRecord is immutable: cannot set {name}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"JobRecord is immutable: cannot delete {name}")

    def _fields(self) -> tuple[Any, ...]:
        return tuple(getattr(self, field) for field in _RECORD_FIELDS)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, JobRecord):
            return NotImplemented
        return self._fields() == other._fields()

    __hash__ = None  # type: ignore[assignment]  # equal by value, and the manifest is a dict

    def __reduce__(self) -> tuple[type[JobRecord], tuple[Any, ...]]:
        # copy and pickle rebuild through __new__ (the default would set the slots, which
        # __setattr__ refuses).
        return JobRecord, self._fields()

    def __repr__(self) -> str:
        shown = ", ".join(f"{f}={getattr(self, f)!r}" for f in _RECORD_FIELDS)
        return f"JobRecord({shown})"


def _decoded(record: JobRecord, slot: str, text_slot: str) -> dict[str, Any]:
    """A lazily decoded field's document: decoded from ``text_slot``'s JSON and kept in
    ``slot``, the text let go (not kept beside the document). Two threads may both decode:
    each sets the document before clearing the text, so a reader that finds the text gone
    finds the document."""
    text = getattr(record, text_slot)
    if text is None:  # another thread decoded it meanwhile
        decoded: dict[str, Any] = getattr(record, slot)
        return decoded
    decoded = json.loads(text)
    object.__setattr__(record, slot, decoded)
    object.__setattr__(record, text_slot, None)
    return decoded


__all__ = ["JobRecord"]
