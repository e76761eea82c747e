"""JobRecord: one stored job, immutable, its manifest decoded from the row's text once.

Re-exported by ``broker.store`` (import it from there).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from broker.store import JobState

_RECORD_FIELDS: Final = (
    "tenant", "name", "queue", "priority", "manifest", "state", "cluster", "placement",
    "attempts", "not_before", "reason", "created_at", "updated_at", "seq", "generation",
)  # fmt: skip


class JobRecord:
    """One stored job, immutable, with the fields below (in this order when positional).

    ``manifest`` (the FederatedJob as submitted, JSON-able) is decoded from the row's JSON
    text the first time it is read, once: most records a write hands back (a transition's,
    a placement's, a page of a restart's read) are never asked for it, and decoding it is
    most of what turning a row into a record costs. ``manifest_text`` builds one that way.
    Written by hand because a dataclass field cannot be decoded lazily.

    ``spec_text`` is the manifest's ``spec`` as JSON text, when the query that read the row
    selected it (``Store.active_jobs``: a restart's pages). It is a hint, not a field: it is
    derived from the manifest, so equality, ``replace``, copies and pickles leave it out.
    Equal specs read by one backend have equal texts, so a restart keys what it builds
    from a spec by the text without decoding the manifest.
    """

    __slots__ = (
        "_manifest",
        "_text",
        "attempts",
        "cluster",
        "created_at",
        "generation",
        "name",
        "not_before",
        "placement",
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
    placement: dict[str, Any] | None  # JSON-able placement once placed
    attempts: int  # failed attempts so far, the requeue backoff's exponent (see transition)
    not_before: float | None  # epoch seconds: not schedulable before (requeue backoff)
    reason: str  # the last transition's reason
    created_at: float
    updated_at: float
    seq: int  # increasing submission order (FIFO); gaps are possible
    generation: int  # 1, then +1 each time the name is submitted again after it finished
    spec_text: str | None  # the manifest's spec as JSON text, when the query selected it

    def __init__(
        self,
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
        spec_text: str | None = None,
    ) -> None:
        if (manifest is None) == (manifest_text is None):
            raise TypeError("JobRecord takes exactly one of manifest and manifest_text")
        init = object.__setattr__
        init(self, "tenant", tenant)
        init(self, "name", name)
        init(self, "queue", queue)
        init(self, "priority", priority)
        init(self, "_manifest", manifest)
        init(self, "_text", manifest_text)
        init(self, "state", state)
        init(self, "cluster", cluster)
        init(self, "placement", placement)
        init(self, "attempts", attempts)
        init(self, "not_before", not_before)
        init(self, "reason", reason)
        init(self, "created_at", created_at)
        init(self, "updated_at", updated_at)
        init(self, "seq", seq)
        init(self, "generation", generation)
        init(self, "spec_text", spec_text)

    @property
    def manifest(self) -> dict[str, Any]:
        manifest: dict[str, Any] | None = self._manifest
        if manifest is not None:
            return manifest
        text = self._text
        if text is None:  # another thread decoded it meanwhile: it sets the manifest first
            decoded = self._manifest
            assert decoded is not None
            return decoded
        manifest = json.loads(text)
        object.__setattr__(self, "_manifest", manifest)
        object.__setattr__(self, "_text", None)  # the text is not kept beside the document
        return manifest

    def replace(self, **changes: Any) -> JobRecord:
        """A copy with ``changes`` (field names as above), as ``dataclasses.replace`` gives
        a dataclass; an unknown field is a TypeError. O(fields). A manifest not yet decoded
        is copied as its text, still not decoded (and the spec's text with it), unless
        ``manifest`` is among the changes."""
        unknown = changes.keys() - set(_RECORD_FIELDS)
        if unknown:
            raise TypeError(f"JobRecord has no field {', '.join(sorted(unknown))}")
        fields = {f: getattr(self, f) for f in _RECORD_FIELDS if f != "manifest"}
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
        # copy and pickle rebuild through __init__ (the default would set the slots, which
        # __setattr__ refuses).
        return JobRecord, self._fields()

    def __repr__(self) -> str:
        shown = ", ".join(f"{f}={getattr(self, f)!r}" for f in _RECORD_FIELDS)
        return f"JobRecord({shown})"


__all__ = ["JobRecord"]
