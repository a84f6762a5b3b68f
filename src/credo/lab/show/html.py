"""HTML for `credo show` and `audit.html`: inline CSS, no scripts, no fonts, no network (audit.html shows the
audit.png beside it).

Layout: a summary table (method, first-error top-1 on the shown traces, cost), a legend of the one
diverging colour scale of the page, then a grid with one row per trace and one column per method
(plus the MC reference when present). In a cell each segment is a line: its step mark (✓ / ✗ from
the step labels), then its tokens, each with a background colour for its credit (red negative, blue
positive, white zero; |credit| >= page.scale is full colour; tokens sharing a credit take it from one span around
them). The labelled first error is outlined.
Machine-readable attributes (data-trace, data-method, data-step, data-ok, data-first, data-credit)
let tests check the rendered DOM.
"""

from __future__ import annotations

import html
import os
from typing import Any

NEGATIVE = (202, 0, 32)
POSITIVE = (5, 113, 176)
MAX_MIX = 0.85  # full colour stays light enough for black text
DROP = 0.15  # a reference value drop this large marks a localisable step (docs/methods.md, "## How fidelity is judged")

CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;margin:16px;color:#222;background:#fff}
h1{font-size:20px;margin:0 0 4px} h2{font-size:16px;margin:18px 0 6px} .sub{color:#666;font-size:12px;margin-bottom:10px}
table.summary{border-collapse:collapse;font-size:13px;margin-bottom:10px}
table.summary td,table.summary th{border:1px solid #ccc;padding:3px 8px;text-align:right}
table.summary td:first-child,table.summary th:first-child{text-align:left}
.legend{display:flex;align-items:center;gap:8px;font-size:12px;margin:6px 0 14px;flex-wrap:wrap}
.bar{width:220px;height:14px;border:1px solid #999}
.grid{display:grid;gap:0;border-top:1px solid #ccc;width:max-content}
.grid>div{border-bottom:1px solid #ccc;border-right:1px solid #eee;padding:6px 8px}
.head{font-weight:600;font-size:13px;background:#f4f4f4;position:sticky;top:0}
.info{font-size:12px;max-width:15em} .info pre{margin:2px 0;font-size:12px;white-space:pre-wrap;word-break:break-all}
.ok{color:#1a7f37} .bad{color:#c0392b}
.seg{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:13px;line-height:20px;height:20px;
     white-space:pre;padding:0 2px;border:2px solid transparent}
.seg.first{border-color:#111;border-radius:3px}
.mark{display:inline-block;width:1.2em;font-weight:700}
.ref.drop{color:#c0392b;font-weight:700} .t,.c{padding:1px 0} .t.nl{color:#999} .ref{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12px;color:#444}
"""  # noqa: E501  (the stylesheet is written into the page as it stands)


def colour(value: float, scale: float) -> tuple[int, int, int]:
    """Diverging colour of a credit value: white at 0, NEGATIVE / POSITIVE at |value| >= scale."""
    x = max(-1.0, min(1.0, value / scale)) if scale > 0 else 0.0
    target = NEGATIVE if x < 0 else POSITIVE
    mix = abs(x) * MAX_MIX
    return tuple(round(255 + (c - 255) * mix) for c in target)  # type: ignore[return-value]


def token_text(token: str) -> str:
    """How a token is shown: a newline as '↵', the end-of-sequence (empty string) as '∎'."""
    return "∎" if token == "" else token.replace("\n", "↵")


def _summary(page: Any) -> str:
    rows = ["<table class='summary'><tr><th>method</th><th>first-error top-1 (these traces)</th>"
            "<th>cost vs sampling the trace</th><th>tokens / trace</th></tr>"]
    for r in page.summary:
        top1 = "–" if r["first_error_top1"] != r["first_error_top1"] else f"{r['first_error_top1']:.2f}"
        cost = "–" if r["cost_vs_step"] is None else f"{r['cost_vs_step']:.2f}×"
        tokens = "–" if r["tokens_per_trace"] is None else f"{r['tokens_per_trace']:.0f}"
        rows.append(f"<tr data-summary='{html.escape(r['label'])}'><td>{html.escape(r['label'])}</td>"
                    f"<td>{top1}</td><td>{cost}</td><td>{tokens}</td></tr>")
    return "".join(rows) + "</table>"


def _legend(scale: float) -> str:
    stops = ", ".join("rgb({},{},{})".format(*colour(v * scale, scale)) for v in (-1, -0.5, 0, 0.5, 1))
    return (f"<div class='legend'><span>credit −{scale:.3g}</span><span class='bar' style='background:linear-gradient("
            f"to right, {stops})'></span><span>+{scale:.3g}</span><span>(advantage × weight; one scale for the page, "
            f"clipped at the 98th percentile of |credit|)</span><span class='ok'>✓ step right</span>"
            "<span class='bad'>✗ step wrong</span>"
            "<span style='border:2px solid #111;padding:0 3px'>labelled first error</span>"
            f"<span class='ref drop'>MC value drop ≥ {DROP}</span></div>")


def _hex(rgb: tuple[int, int, int]) -> str:
    return "#%02x%02x%02x" % rgb


def _segment_line(trace: Any, k: int, seg: Any, label: str, scale: float) -> str:
    """One segment's line. Tokens that share one credit (every segment-level method's) sit in one span holding
    that credit and colour, each token a bare span: about a quarter of the bytes of a coloured span per token."""
    mark = "" if seg.ok is None else ("<span class='mark ok'>✓</span>" if seg.ok else "<span class='mark bad'>✗</span>")
    shown = [(f"{value:.4g}", _hex(colour(value, scale))) for value in seg.credit[label]]  # (credit, colour)
    shared = len(set(shown)) == 1
    spans = []
    for tok, (credit, rgb) in zip(seg.tokens, shown):
        cls = "t nl" if tok in ("\n", "") else "t"
        own = "" if shared else f" data-credit='{credit}' style='background:{rgb}'"
        spans.append(f"<span class='{cls}'{own}>{html.escape(token_text(tok))}</span>")
    tokens = "".join(spans)
    if shared and spans:
        tokens = f"<span class='c' data-credit='{shown[0][0]}' style='background:{shown[0][1]}'>{tokens}</span>"
    first = " first" if k == trace.first_error else ""
    ok = "" if seg.ok is None else f" data-ok='{int(seg.ok)}'"
    return f"<div class='seg{first}' data-step='{k + 1}'{ok}>{mark or '<span class=mark></span>'}{tokens}</div>"


def _trace_rows(page: Any) -> str:
    cells = []
    for trace in page.traces:
        verdict = ("<span class='ok'>correct</span>" if trace.correct else "<span class='bad'>wrong</span>"
                   + (f", first error at step {trace.first_error + 1}" if trace.first_error is not None else ""))
        cells.append(f"<div class='info' data-trace='{trace.index}'><b>trace {trace.index}</b> · {verdict}"
                     f"<pre>{html.escape(trace.prompt.strip())}</pre></div>")
        for label in page.methods:
            lines = "".join(_segment_line(trace, k, seg, label, page.scale) for k, seg in enumerate(trace.segments))
            cells.append(f"<div class='cell' data-trace='{trace.index}' "
                         f"data-method='{html.escape(label)}'>{lines}</div>")
        if page.has_reference:
            refs = "".join(f"<div class='seg ref{' drop' if seg.ref_diff <= -DROP else ''}'>V={seg.ref_value:.2f} "
                           f"Δ{seg.ref_diff:+.2f}</div>" for seg in trace.segments)
            cells.append(f"<div class='cell' data-trace='{trace.index}' data-method='mc_reference'>{refs}</div>")
    return "".join(cells)


def grid(page: Any) -> str:
    """The summary, the legend and the traces-by-methods grid (an HTML fragment)."""
    columns = ["trace"] + list(page.methods) + (["MC reference V(s_k), Δ"] if page.has_reference else [])
    head = "".join(f"<div class='head'>{html.escape(c)}</div>" for c in columns)
    style = f"grid-template-columns: repeat({len(columns)}, max-content)"
    return (_summary(page) + _legend(page.scale) + f"<div class='grid' style='{style}'>{head}{_trace_rows(page)}</div>")


def document(title: str, body: str) -> str:
    return (f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{CSS}</style></head><body>{body}</body></html>\n")


def render(page: Any) -> str:
    """The whole `credo show` page."""
    return document(page.title, f"<h1>{html.escape(page.title)}</h1><div class='sub'>{html.escape(page.subtitle)}</div>"
                                + grid(page))


def markdown_tables(markdown: str) -> str:
    """The audit's markdown (headings, paragraphs, pipe tables) as HTML, nothing more."""
    out, table = [], []

    def flush() -> None:
        if table:
            rows = [r for r in table if not set(r.replace("|", "").strip()) <= set("-: ")]
            cells = [[html.escape(c.strip()) for c in r.strip().strip("|").split("|")] for r in rows]
            head = "".join(f"<th>{c}</th>" for c in cells[0])
            body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in cells[1:])
            out.append(f"<table class='summary'><tr>{head}</tr>{body}</table>")
            table.clear()

    for line in markdown.splitlines():
        if line.startswith("|"):
            table.append(line)
            continue
        flush()
        if line.startswith("#"):
            level = min(len(line) - len(line.lstrip("#")), 3)
            out.append(f"<h{level}>{html.escape(line.lstrip('#').strip())}</h{level}>")
        elif line.strip():
            out.append(f"<p>{html.escape(line)}</p>")
    flush()
    return "".join(out)


def render_audit(markdown: str, plot_path: str | None, page: Any) -> str:
    """audit.html: the audit's tables, its plot and a show grid of its traces. The plot is linked by its file name,
    not inlined: audit.png lies beside the page, and a copy inside it would only double the folder's size."""
    body = markdown_tables(markdown)
    if plot_path and os.path.exists(plot_path):
        name = html.escape(os.path.basename(plot_path), quote=True)
        body += f"<img alt='audit plot' style='max-width:100%' src='{name}'>"
    body += (f"<h2>Credit on {len(page.traces)} of the audited traces</h2>"
             f"<div class='sub'>{html.escape(page.subtitle)}</div>")
    return document("credo audit", body + grid(page))
