"""What conformance keeps between submissions: each distinct small template's outcome, so a
template sent again is not validated again, and never a large one (a tenant sending
distinct large templates could otherwise hold 2,048 bodies in memory)."""

from __future__ import annotations

from typing import Any

from broker.manifest import conformance


def template(env_value: str) -> dict[str, Any]:
    container = {"name": "main", "image": "t:1", "env": [{"name": "PAD", "value": env_value}]}
    return {"spec": {"containers": [container]}}


def test_a_small_template_is_remembered_and_a_large_one_is_not() -> None:
    conformance._checked.cache_clear()
    small = template("small")
    assert conformance.pod_template(small, ("t",), pod_set=True) == small
    assert conformance.pod_template(small, ("t",), pod_set=True) == small
    info = conformance._checked.cache_info()
    assert (info.currsize, info.hits) == (1, 1)
    large = template("x" * (conformance._REMEMBERED_TEXT + 1))
    assert conformance.pod_template(large, ("t",), pod_set=True) == large
    assert conformance._checked.cache_info().currsize == 1
