"""The list's ``selector`` (kubectl's equality-based label selectors) and ``name``."""

from __future__ import annotations

import fnmatch

import pytest

from broker.http.selectors import (
    GLOB_CACHE_SIZE,
    MAX_REQUIREMENTS,
    SelectorError,
    _glob,
    name_matcher,
    parse_selector,
)

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


@pytest.mark.parametrize(
    ("pattern", "message"),
    [
        ("a" * 129, "at most 128 characters (got 129)"),
        ("*" * 129, "at most 128 characters (got 129)"),
        ("train-*" * 1100, "at most 128 characters (got 7700)"),
        ("[a-z]" * 26, "at most 128 characters (got 130)"),
    ],
)
def test_a_name_pattern_is_bounded(pattern: str, message: str) -> None:
    with pytest.raises(SelectorError) as refused:
        name_matcher(pattern)
    assert str(refused.value) == message


@pytest.mark.parametrize(
    ("pattern", "name", "matches"),
    [
        ("a" * 128, "a" * 63, False),  # the longest substring allowed
        ("*" * 128, "train", True),
        ("[a-z]" * 25 + "*", "abcdefghijklmnopqrstuvwxy-1", True),
        ("[a-z]" * 25 + "*", "abc", False),
    ],
)
def test_patterns_up_to_the_bound_work(pattern: str, name: str, matches: bool) -> None:
    assert name_matcher(pattern)(name) is matches


@pytest.mark.parametrize(
    ("count", "refused"),
    [(MAX_REQUIREMENTS, None), (MAX_REQUIREMENTS + 1, "at most 32 requirements (got 33)")],
)
def test_a_selector_has_at_most_32_requirements(count: int, refused: str | None) -> None:
    text = ",".join(f"!absent-{i}" for i in range(count))
    if refused is None:
        assert all(r.matches(LABELS) for r in parse_selector(text))
    else:
        with pytest.raises(SelectorError) as error:
            parse_selector(text)
        assert str(error.value) == refused


def test_compiled_globs_are_bounded_and_fnmatchs_cache_is_not_used() -> None:
    fnmatch_cached = fnmatch._compile_pattern.cache_info().currsize  # type: ignore[attr-defined]
    for i in range(GLOB_CACHE_SIZE * 3):
        assert name_matcher(f"job-{i}-*")(f"job-{i}-x")
    assert _glob.cache_info().currsize == GLOB_CACHE_SIZE
    assert fnmatch._compile_pattern.cache_info().currsize == fnmatch_cached  # type: ignore[attr-defined]
