"""Writing the lab's plots: a PNG of at most 256 colours, so committed reports stay small enough for the tracked
tree's limit (tests/test_tree_size.py). A matplotlib plot holds few distinct colours, so a palette keeps it as it
looks at about a third of the bytes of matplotlib's RGBA PNG."""

from __future__ import annotations

import io
from typing import Any

from PIL import Image  # matplotlib's own dependency

DPI = 110


def save_figure(fig: Any, path: str) -> None:
    """`fig` (a matplotlib Figure) written to `path` as a palette PNG at DPI dots per inch."""
    buffer = io.BytesIO()
    fig.savefig(buffer, dpi=DPI, format="png")
    buffer.seek(0)
    with Image.open(buffer) as image:
        image.convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT).save(path, "PNG", optimize=True)
