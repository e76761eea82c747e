"""A command under a pseudo-terminal, its screen read back with a terminal emulator (pyte),
and that screen drawn as an SVG (rich's ``export_svg``) for the docs.

``Terminal`` starts the process with its stdin, stdout and stderr on the pty's slave side
(a terminal of ``columns`` x ``lines``), and ``read_until`` feeds what it prints to the
emulator until a condition on the screen holds or a deadline passes; ``raw`` keeps every
byte, so what scrolled away can still be searched. ``screen_svg`` turns the emulated screen
(characters, colours, bold) into an SVG.

Run as a script it regenerates docs/terminal.svg from a fresh ``fedbroker demo``:
``python tests/cli/terminal.py`` (the acceptance test in test_demo_terminal.py does the
same when FEDBROKER_UPDATE_SCREENSHOT=1).
"""

from __future__ import annotations

import contextlib
import fcntl
import io
import os
import re
import select
import signal
import struct
import subprocess
import termios
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import pyte
from rich.console import Console
from rich.style import Style
from rich.text import Text

ROOT = Path(__file__).resolve().parents[2]
SCREENSHOT = ROOT / "docs" / "terminal.svg"


class Terminal:
    def __init__(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        cwd: Path = ROOT,
        columns: int = 120,
        lines: int = 48,
    ) -> None:
        self.columns, self.lines = columns, lines
        self.screen = pyte.Screen(columns, lines)
        self.stream = pyte.ByteStream(self.screen)
        self.raw = bytearray()
        master, slave = os.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", lines, columns, 0, 0))
        self.master = master
        try:
            self.proc = subprocess.Popen(
                list(argv), stdin=slave, stdout=slave, stderr=slave, cwd=cwd,
                env={**env, "TERM": "xterm-256color", "COLUMNS": str(columns),
                     "LINES": str(lines)},
                start_new_session=True,  # its own session: the pty is its controlling tty
            )  # fmt: skip
        finally:
            os.close(slave)

    @property
    def text(self) -> str:
        return "\n".join(line.rstrip() for line in self.screen.display)

    def _read(self, timeout: float) -> bytes | None:
        """Feed what is there within ``timeout`` to the emulator and return it (b"": nothing
        came); None at end of output."""
        ready, _, _ = select.select([self.master], [], [], max(0.0, timeout))
        if not ready:
            return b""
        try:
            data = os.read(self.master, 65536)
        except OSError:  # EIO: every writer closed the slave side
            return None
        if not data:
            return None
        self.raw += data
        self.stream.feed(data)
        return data

    def _pump(self, timeout: float) -> bool:
        """Feed what is there within ``timeout`` to the emulator; False at end of output."""
        return self._read(timeout) is not None

    def read_until(self, done: Callable[[Terminal], bool], deadline: float) -> bool:
        """Read until ``done(self)`` holds (True) or the monotonic ``deadline`` passes, or
        the output ends (False)."""
        while not done(self):
            left = deadline - time.monotonic()
            if left <= 0 or not self._pump(min(left, 0.5)):
                return done(self)
        return True

    def stop(self, deadline: float, sig: int = signal.SIGINT) -> int | None:
        """Send ``sig`` and read until the process exits (and what it wrote last) or
        ``deadline``; its exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        while self.proc.poll() is None and time.monotonic() < deadline:
            if not self._pump(min(0.2, max(0.0, deadline - time.monotonic()))):
                break
        try:
            code = self.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            return None
        # What it wrote last may still be in the pty when it has exited: read it too, until
        # the output ends or goes quiet (a process it left behind may hold the pty open).
        while time.monotonic() < deadline and self._read(0.2):
            pass
        return code

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        with contextlib.suppress(OSError):
            os.close(self.master)


_HEX = re.compile(r"[0-9a-fA-F]{6}")
_PYTE_NAMES = {"brown": "yellow"}  # pyte's name for ANSI colour 3


def _colour(name: str) -> str | None:
    if name == "default":
        return None
    if _HEX.fullmatch(name):
        return f"#{name.lower()}"
    if name.startswith("bright"):
        return "bright_" + _PYTE_NAMES.get(name[6:], name[6:])
    return _PYTE_NAMES.get(name, name)


def screen_text(screen: pyte.Screen) -> Text:
    """The emulated screen as rich Text: its characters with their colours and weight,
    trailing blank lines dropped."""
    rows: list[Text] = []
    for y in range(screen.lines):
        row = screen.buffer[y]
        line = Text()
        run = ""
        key: tuple[str | None, str | None, bool] = (None, None, False)
        for x in range(screen.columns):  # runs of one style: one span each
            char = row[x]
            fg, bg = _colour(char.fg), _colour(char.bg)
            if char.reverse:
                fg, bg = bg or "black", fg or "white"
            if (fg, bg, char.bold) != key:
                line.append(run, Style(color=key[0], bgcolor=key[1], bold=key[2]))
                run, key = "", (fg, bg, char.bold)
            run += char.data or " "
        line.append(run, Style(color=key[0], bgcolor=key[1], bold=key[2]))
        line.rstrip()
        rows.append(line)
    while rows and not rows[-1].plain.strip():
        rows.pop()
    return Text("\n").join(rows)


def screen_svg(screen: pyte.Screen, title: str) -> str:
    console = Console(file=io.StringIO(), record=True, width=screen.columns,
                      color_system="truecolor", force_terminal=True)  # fmt: skip
    console.print(screen_text(screen), crop=True, soft_wrap=False)
    return console.export_svg(title=title)


def main() -> None:  # pragma: no cover - a maintainer's tool; the test does the same
    import sys
    import tempfile

    sys.path[:0] = [str(ROOT), str(Path(__file__).parent)]  # this worktree's broker
    from test_demo_terminal import run_demo_on_a_terminal

    with tempfile.TemporaryDirectory(prefix="fbdemo-") as data_dir:
        terminal, _ = run_demo_on_a_terminal(Path(data_dir))
        try:
            svg = screen_svg(terminal.screen, "fedbroker demo")
            terminal.stop(time.monotonic() + 30.0)
        finally:
            terminal.close()
    SCREENSHOT.write_text(svg, encoding="utf-8")
    sys.stdout.write(f"wrote {SCREENSHOT}\n")


if __name__ == "__main__":  # pragma: no cover
    main()
