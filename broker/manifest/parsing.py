"""Reading a submitted FederatedJob: JSON or YAML by content type (or sniffed), YAML
without aliases, neither with a key given twice, and validation into the wire models;
every failure is ONE ManifestError line naming the field path. ``load_yaml``: safe_load
refusing duplicate keys, for the broker's other YAML readers (the config, the CLI)."""

from __future__ import annotations

import json
from typing import Any

import yaml
from pydantic import ValidationError

from broker.manifest.documents import (
    DuplicateKey,
    DuplicateKeyError,
    RefusesDuplicateKeys,
    check_document,
    duplicate_keys_refused,
)
from broker.manifest.errors import ManifestError, field_path, first_error, kind_of, reason
from broker.manifest.models import FederatedJob


class _NoAliasLoader(RefusesDuplicateKeys, yaml.SafeLoader):
    """safe_load without anchors/aliases: nested aliases expand exponentially ("billion
    laughs") once the manifest is validated, stored or echoed; a manifest never needs them.
    Nor duplicate keys, as JSON's (``RefusesDuplicateKeys``)."""

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()  # type: ignore[no-untyped-call]
            raise yaml.composer.ComposerError(
                None, None, "YAML aliases (*name) are not supported", event.start_mark
            )
        return super().compose_node(parent, index)  # the pure-Python path


def parse_manifest(body: bytes, content_type: str | None) -> FederatedJob:
    """Validate a FederatedJob from JSON or YAML; raises ManifestError (one line).

    A JSON content type is parsed as JSON only, a YAML one as YAML; anything else (curl's
    form type, none at all) is sniffed: JSON when it starts with '{', else YAML.
    """
    try:
        text = body.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise ManifestError("manifest: body is not UTF-8 text") from None
    if not text.strip():
        raise ManifestError("manifest: empty body")
    media = (content_type or "").split(";")[0].strip().lower()
    is_json = media == "application/json" or media.endswith("+json")
    is_yaml = media in ("application/yaml", "application/x-yaml", "text/yaml", "text/x-yaml")
    data: object
    if is_json or (not is_yaml and text.lstrip().startswith("{")):
        try:
            data = json.loads(text, object_pairs_hook=duplicate_keys_refused)
        except json.JSONDecodeError as exc:
            json_error = ManifestError(
                f"manifest: invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}"
            )
            if is_json:
                raise json_error from None
            try:
                data = _load_yaml(text)  # a YAML flow mapping also starts with '{'
            except DuplicateKeyError:
                raise
            except ManifestError:
                raise json_error from None
        except ManifestError:
            raise  # a duplicate key (JSON's, or YAML's when a flow mapping is tried as YAML)
        except (ValueError, RecursionError) as exc:
            raise ManifestError(f"manifest: invalid JSON: {reason(exc)}") from None
    else:
        data = _load_yaml(text)
    if not isinstance(data, dict):
        raise ManifestError(f"manifest: must be a mapping (an object), got {kind_of(data)}")
    check_document(data)
    try:
        return FederatedJob.model_validate(data)
    except ValidationError as exc:
        path, message = first_error(exc)
        raise ManifestError(f"{path or 'manifest'}: {message}", path or "manifest") from None


def stored_manifest(data: dict[str, Any]) -> FederatedJob:
    """A manifest the store holds (``FederatedJob.wire()`` of an admitted one), validated
    into the models again, as the rules may have changed since; ManifestError as
    ``parse_manifest``. No text to parse, and its document bounds (``check_document``) held
    when it was admitted: a restart reads every live job through here."""
    try:
        return FederatedJob.model_validate(data)
    except ValidationError as exc:
        path, message = first_error(exc)
        raise ManifestError(f"{path or 'manifest'}: {message}", path or "manifest") from None


# libyaml's C loader when the wheel has it: the pure-Python one costs about 2 ms per
# manifest, the largest share of a submission.
_C_LOADER: Any = getattr(yaml, "CSafeLoader", None)
_FAST_LOADER: Any = (
    None if _C_LOADER is None else type("_FastLoader", (RefusesDuplicateKeys, _C_LOADER), {})
)
# safe_load's own (pure-Python) loader, refusing duplicate keys: for the config file and
# the CLI's reads of the user's files, small and read once, whose YAML errors read as ever.
_SAFE_LOADER: Any = type("_SafeLoader", (RefusesDuplicateKeys, yaml.SafeLoader), {})


def load_yaml(text: str | bytes) -> object:
    """``yaml.safe_load`` that refuses a key given twice in a mapping (DuplicateKey, with
    the mapping's path and both lines); yaml.YAMLError as safe_load."""
    return yaml.load(text, Loader=_SAFE_LOADER)


def _no_aliases(text: str) -> None:
    """The C loader composes in C, beyond _NoAliasLoader's reach: refuse aliases from its
    event stream first (a cheap pass, also in C)."""
    for event in yaml.parse(text, Loader=_FAST_LOADER):
        if isinstance(event, yaml.AliasEvent):
            mark: Any = event.start_mark  # libyaml's own Mark class, the same fields
            raise yaml.composer.ComposerError(
                None, None, "YAML aliases (*name) are not supported", mark
            )


def _load_yaml(text: str) -> object:
    try:
        if _FAST_LOADER is None:
            return yaml.load(text, Loader=_NoAliasLoader)
        _no_aliases(text)
        return yaml.load(text, Loader=_FAST_LOADER)
    except DuplicateKey as exc:
        where = field_path(exc.path) or "manifest"
        raise DuplicateKeyError(exc.message("manifest"), where) from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ManifestError(f"manifest: invalid YAML{where}: {exc.problem}") from None
    except (yaml.YAMLError, ValueError, TypeError, RecursionError) as exc:
        # int("9" * 5000) and other constructor failures surface as plain ValueErrors.
        raise ManifestError(f"manifest: invalid YAML: {reason(exc)}") from None
