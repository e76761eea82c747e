"""What the CLI reads out of an answer's body before it says anything (``answer_body``,
``error_of``): shared by every client command and ``top``."""

from __future__ import annotations

from typing import Any

import pytest

from broker.cli.connection import answer_body, error_of

BODIES: list[tuple[str, Any, str | None]] = [  # (body, as read, the error message in it)
    ("", {}, None),
    ('{"error": "job \\"x\\" not found"}', {"error": 'job "x" not found'}, 'job "x" not found'),
    ('{"items": []}', {"items": []}, None),
    ("[1, 2]", [1, 2], None),
    ('{"error": 42}', {"error": 42}, None),  # not a message: the status line speaks instead
    ("<html>502 Bad Gateway</html>\n", {"error": "<html>502 Bad Gateway</html>"},
     "<html>502 Bad Gateway</html>"),
    ("x" * 500, {"error": "x" * 200}, "x" * 200),  # a proxy's page, cut to one line's worth
]  # fmt: skip


@pytest.mark.parametrize(("body", "doc", "message"), BODIES)
def test_an_answer_body_is_read_and_its_error_found(
    body: str, doc: Any, message: str | None
) -> None:
    assert answer_body(body) == doc
    assert error_of(answer_body(body)) == message
