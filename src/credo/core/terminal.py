"""Text from data or the command line made safe to print on a terminal: every command's one-line errors, the paths
it names and `credo show --terminal`'s tokens go through `escape_controls`."""

from __future__ import annotations

import re

CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")
"""What data may not write to a terminal as is: C0 controls but tab and newline (ESC starts the sequences that
set a title or clear the screen), DEL, C1 controls, and the bidirectional marks that reorder what a line shows."""


def escape_controls(text: str) -> str:
    """`text` with every CONTROLS character written out as its Python escape (ESC as '\\x1b'), newlines kept."""
    return CONTROLS.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)
