"""What the one-shot commands share about arguments: the parser that reports a mistake as
one line with exit status 2, the checked argument types, and ``UsageError``.

A command module builds its subparser with these types, so a bad number or an unknown
policy ends as ``fedbroker: error: <flag> must be ...`` on stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from policies import POLICY_NAMES

EXIT_USAGE = 2
PLOT_EXTRA = "pip install 'fedbroker[plot]'"


class UsageError(Exception):
    """A problem with what the user asked for; printed as one line."""


class HelpFormatter(argparse.HelpFormatter):
    """Help that states each option's default: ``(default: X)`` is added to an option's
    help unless it says its default itself or has none worth saying (None, off)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if (
            not action.option_strings
            or "default" in text
            or default is None
            or default is False
            or default is argparse.SUPPRESS
            or default == []
        ):
            return text
        return f"{text} (default: %(default)s)"


class CommandParser(argparse.ArgumentParser):
    """An argparse parser whose errors are one line on stderr and exit status 2, and whose
    help states every option's default."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> None:  # type: ignore[override]
        sys.stderr.write(f"fedbroker: error: {message}\n")
        raise SystemExit(EXIT_USAGE)


def loads(text: str) -> list[int]:
    """``--loads``: comma-separated positive whole percentages."""
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--loads must be whole percentages like 80,90,130, not {text!r}"
        ) from None
    if not values or any(x <= 0 for x in values):
        raise argparse.ArgumentTypeError(f"--loads must be positive percentages, not {text!r}")
    return values


def positive(name: str) -> Callable[[str], int]:
    """A whole number of at least 1 for the flag ``name``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{name} must be a whole number, not {text!r}"
            ) from None
        if value < 1:
            raise argparse.ArgumentTypeError(f"{name} must be at least 1, not {value}")
        return value

    return parse


def _number(name: str, text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{name} must be a number, not {text!r}") from None


def positive_float(name: str) -> Callable[[str], float]:
    """A finite number above 0 for the flag ``name``."""

    def parse(text: str) -> float:
        value = _number(name, text)
        if not 0 < value < float("inf"):
            raise argparse.ArgumentTypeError(f"{name} must be a positive number, not {text!r}")
        return value

    return parse


def fraction(name: str) -> Callable[[str], float]:
    """A number from 0 to 1 for the flag ``name``."""

    def parse(text: str) -> float:
        value = _number(name, text)
        if not 0.0 <= value <= 1.0:
            raise argparse.ArgumentTypeError(f"{name} must be between 0 and 1, not {text!r}")
        return value

    return parse


def policy(text: str) -> str:
    """A placement policy's name."""
    if text not in POLICY_NAMES:
        raise argparse.ArgumentTypeError(
            f"unknown policy {text!r} (known: {', '.join(POLICY_NAMES)})"
        )
    return text


def plot_file(text: str) -> Path:
    """``--plot FILE``: matplotlib is an optional extra (the broker never needs it), so its
    absence is refused here, in one line, before a long run rather than after it."""
    if importlib.util.find_spec("matplotlib") is None:
        raise argparse.ArgumentTypeError(f"needs matplotlib, an optional extra: {PLOT_EXTRA}")
    return Path(text)
