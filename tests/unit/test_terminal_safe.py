"""``kernel-sandbox run`` prints sandbox output: only text and SGR colours get through."""

from __future__ import annotations

import pytest

from kernel_sandbox.cli.run import terminal_safe


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("a\x1b]52;c;ZXZpbA==\x07b", "ab"),  # OSC 52: write the clipboard
        ("x\x1b]0;title\x1b\\y", "xy"),  # OSC 0: window title, ST-terminated
        ("\x9d0;title\x9cz", "z"),  # the same in its 8-bit form
        ("\x1b[2J\x1b[H\x1b[6nq", "q"),  # clear screen, move cursor, report position
        ("\x9b2Jq", "q"),  # 8-bit CSI
        ("\x1bPq#0;2;0;0;0\x1b\\k", "k"),  # DCS (sixel)
        ("\x1b_apc\x1b\\k", "k"),  # APC
        ("\x1b7\x1b8\x1bck", "k"),  # save/restore cursor, reset the terminal
        ("bell\x07 del\x7f bs\x08 cr\r", "bell del bs cr"),
        ("u\x1b]unterminated", "uunterminated"),  # never eats the text after it
        ("\x1b[1;31mred\x1b[0m\tok\n", "\x1b[1;31mred\x1b[0m\tok\n"),  # colours kept
        ("é€😀 plain", "é€😀 plain"),
    ],
)
def test_terminal_safe(text: str, shown: str) -> None:
    assert terminal_safe(text) == shown
