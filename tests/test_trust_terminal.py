"""Hostile text in a terminal: `credo show --terminal` and the CLI's one-line errors write
every control character of data (questions, completions, answers, paths) escaped, keeping newlines."""

from __future__ import annotations

import io
import json
import re
from dataclasses import replace

from rich.console import Console

from credo.cli.main import main
from credo.core.terminal import escape_controls
from credo.lab.show.view import render_terminal
from builders import page_of

TITLE, CLEAR = "\x1b]0;title\x07", "\x1b[2J"
HOSTILE = f"What is 2 + 2?{TITLE} Then{CLEAR} line two\nline three\x9b31m\u202eevil"


def test_escape_controls_writes_them_out_and_keeps_newlines_and_tabs():
    assert escape_controls(HOSTILE) == ("What is 2 + 2?\\x1b]0;title\\x07 Then\\x1b[2J line two\nline three"
                                        "\\x9b31m\\u202eevil")
    assert escape_controls("a\tb\nc é ∑ ✓") == "a\tb\nc é ∑ ✓"  # printable text of any script is untouched
    assert escape_controls("\r\x00\x7f") == "\\r\\x00\\x7f"


def test_the_terminal_view_escapes_prompts_tokens_and_the_subtitle(policy):
    page = page_of(policy, methods=("grpo",), with_reference=False)
    traces = [replace(t, prompt=HOSTILE, segments=[replace(s, tokens=[CLEAR, TITLE] + s.tokens[2:])
                                                   for s in t.segments]) for t in page.traces]
    page = replace(page, subtitle=f"checkpoint {TITLE}", traces=traces)
    buffer = io.StringIO()
    render_terminal(page, Console(file=buffer, force_terminal=True, width=200, color_system="truecolor"))
    out = buffer.getvalue()
    plain = re.sub("\x1b\\[[0-9;]*m", "", out)  # without rich's own colours (SGR sequences)
    assert "\x1b" not in plain  # nothing else: no title, no screen clearing
    assert "\x1b]" not in out and "\x07" not in out and "\x1b[2J" not in out and "\x9b" not in out
    assert "\u202e" not in out
    assert plain.count("\\x1b]0;title\\x07") >= 1 + 2 * len(traces)  # the subtitle, each prompt, its tokens
    assert "\\x1b[2J" in plain and "line two\nline three" in plain  # the prompt's own newline is kept


def test_credo_show_terminal_escapes_a_hostile_question(hf_dir, tmp_path, capsys):
    data = tmp_path / "d.jsonl"
    rows = [{"question": f"{i} + 1 = ?{TITLE}{CLEAR}", "answer": f"{i + 1}{CLEAR}"} for i in range(30)]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["show", "--checkpoint", hf_dir, "--task", f"jsonl:{data}", "--n", "2", "--methods", "grpo",
                 "--set", "group_size=2", "--set", "max_new_tokens=6", "--out", str(tmp_path / "out"),
                 "--terminal", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out  # not a terminal: rich adds no styles, so no ESC at all
    assert out.count("\\x1b]0;title\\x07\\x1b[2J") == 2  # each shown question, escaped


def test_a_one_line_error_escapes_what_the_user_gave(capsys):
    assert main(["eval", "--task", f"jsonl:/nonexistent{CLEAR}.jsonl", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "\x1b" not in err and "/nonexistent\\x1b[2J.jsonl" in err


def test_credo_show_escapes_its_out_path_on_the_wrote_line(saved_policy, tmp_path, capsys):
    """The `wrote ...` line prints the user's --out: escaped like any data (before, raw: a path could clear the
    terminal or set its title)."""
    out = str(tmp_path / f"out{TITLE}{CLEAR}")
    assert main(["show", "--checkpoint", saved_policy, "--n", "2", "--methods", "grpo", "--set", "group_size=2",
                 "--set", "max_new_tokens=6", "--out", out, "--quiet"]) == 0
    printed = capsys.readouterr().out
    assert "\x1b" not in printed and "\x07" not in printed
    assert f"wrote {tmp_path}/out\\x1b]0;title\\x07\\x1b[2J/" in printed
