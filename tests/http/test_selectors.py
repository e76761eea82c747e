"""The list's ``selector`` (kubectl's equality-based label selectors) and ``name``."""

from __future__ import annotations

import pytest

from broker.http.selectors import SelectorError, name_matcher, parse_selector

LABELS = {"team": "vision", "fedbroker.io/submitted-by": "ada"}


@pytest.mark.parametrize(
    ("selector", "matches"),
    [
        ("team=vision", True),
        ("team==vision", True),
        ("team!=vision", False),
        ("stage!=dev", True),  # absent: not equal, as in Kubernetes
        ("team", True),
        ("!team", False),
        ("!stage", True),
        ("team=vision, fedbroker.io/submitted-by=ada", True),
        ("team=vision,fedbroker.io/submitted-by=bob", False),
    ],
)
def test_selectors_match_as_kubectl_does(selector: str, matches: bool) -> None:
    assert all(r.matches(LABELS) for r in parse_selector(selector)) is matches


@pytest.mark.parametrize(
    ("selector", "message"),
    [
        ("team in (a,b)", "set-based"),
        ("team=a,", "empty requirement"),
        ("te am=a", "not a label key"),
        ("team=a b", "not a label value"),
    ],
)
def test_bad_selectors_are_named(selector: str, message: str) -> None:
    with pytest.raises(SelectorError, match=message):
        parse_selector(selector)


def test_names_by_substring_or_glob() -> None:
    assert name_matcher("rain")("train-1") and not name_matcher("rain")("eval")
    assert name_matcher("train-*")("train-1") and not name_matcher("train-*")("xtrain-1")
    assert name_matcher("t?ain-[0-9]")("train-1")
