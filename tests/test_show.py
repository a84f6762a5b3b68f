"""`credo show`: the credit page's structure, colours and self-containedness; audit.html; the terminal view."""

import os
import re
from html.parser import HTMLParser

from builders import page_of
from credo.lab.audit.config import AuditConfig
from credo.lab.audit.run import run_audit
from credo.cli.main import main
from credo.lab.show.view import render_terminal, write_audit_page
from credo.lab.show.html import colour, render


class Elements(HTMLParser):
    """Every start tag as (tag, attrs dict), in document order."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict]] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))


def parse(text: str) -> list[tuple[str, dict]]:
    parser = Elements()
    parser.feed(text)
    return parser.tags


def test_page_structure_marks_and_first_error(policy):
    page = page_of(policy)
    text = render(page)
    tags = parse(text)
    cells = {(a["data-trace"], a["data-method"]) for t, a in tags if t == "div" and "data-method" in a}
    assert cells == {(str(i), m) for i in (1, 2, 3, 4) for m in ("grpo", "rredcot:mode=replace", "mc_reference")}
    summary = [a["data-summary"] for t, a in tags if "data-summary" in a]
    assert summary == ["grpo", "rredcot:mode=replace", "mc_reference"]
    # the labelled first error (trace 2: step 1, trace 3: step 3, trace 4: step 2) is outlined in every column
    firsts, cell = set(), None
    for tag, a in tags:
        if tag == "div" and "data-method" in a:
            cell = (a["data-trace"], a["data-method"])
        elif tag == "div" and "first" in a.get("class", "").split():
            assert a["data-ok"] == "0"
            firsts.add((cell[0], cell[1], a["data-step"]))
    assert firsts == {(t, m, s) for t, s in (("2", "1"), ("3", "3"), ("4", "2"))
                      for m in ("grpo", "rredcot:mode=replace")}
    # trace 1 is right throughout: five steps marked ok
    assert page.traces[0].correct and [s.ok for s in page.traces[0].segments] == [True] * 5
    # self-contained: no scripts, no links, no remote resources
    assert "<script" not in text and "<link" not in text and not re.search(r"(src|href)=['\"]?https?:", text)


def test_wrong_trace_is_coloured_negative_under_grpo(policy):
    page = page_of(policy, methods=("grpo",), with_reference=False)
    tags = parse(render(page))
    spans, in_cell = [], None
    for tag, a in tags:
        if tag == "div" and "data-method" in a:
            in_cell = (a["data-trace"], a["data-method"])
        elif tag == "span" and "data-credit" in a and in_cell == ("2", "grpo"):
            spans.append(a)
    assert spans and all(float(a["data-credit"]) < 0 for a in spans)  # wrong trace in a mixed group
    for a in spans:
        r, g, b = (int(h, 16) for h in re.search(r"#(..)(..)(..)", a["style"]).groups())
        assert r > b and r > g  # red: negative
    assert colour(0.0, 1.0) == (255, 255, 255) and colour(5.0, 1.0) == colour(1.0, 1.0)


def test_a_shared_credit_is_written_once_per_segment_and_a_varying_one_per_token(policy):
    from dataclasses import replace
    page = page_of(policy, methods=("grpo",), with_reference=False)
    seg = page.traces[1].segments[0]
    n = len(seg.tokens)
    varying = replace(seg, credit={"grpo": [-1.0 + 2.0 * i / max(n - 1, 1) for i in range(n)]})
    trace = replace(page.traces[1], segments=[seg, varying])
    tags = parse(render(replace(page, traces=[trace])))
    divs = [i for i, (t, a) in enumerate(tags) if t == "div" and "data-step" in a]
    shared, own = tags[divs[0] + 1:divs[1]], tags[divs[1] + 1:]
    tokens = [a for t, a in shared if a.get("class") in ("t", "t nl")]
    assert len(tokens) == n and not any("data-credit" in a for a in tokens)  # bare token spans
    holders = [a for t, a in shared if "data-credit" in a]
    assert len(holders) == 1 and float(holders[0]["data-credit"]) == float(f"{seg.credit['grpo'][0]:.4g}")
    credited = [a for t, a in own if a.get("class") in ("t", "t nl")]
    assert [float(a["data-credit"]) for a in credited] == [float(f"{v:.4g}") for v in varying.credit["grpo"]]
    assert credited[0]["style"] == "background:#%02x%02x%02x" % colour(-1.0, page.scale)
    text = render(replace(page, traces=[trace]))  # the shared credit's span holds the segment's token spans
    shared_colour = "#%02x%02x%02x" % colour(seg.credit["grpo"][0], page.scale)
    assert (f"<span class='c' data-credit='{seg.credit['grpo'][0]:.4g}' style='background:{shared_colour}'>"
            f"<span class='t") in text


def test_cli_show_and_terminal(saved_policy, tmp_path, capsys):
    out = str(tmp_path / "show")
    args = ["show", "--checkpoint", saved_policy, "--methods", "grpo,shuffled:of=rredcot", "--n", "2", "--k-ref", "2",
            "--set", "group_size=2", "--set", "max_new_tokens=12", "--out", out, "--terminal", "--quiet"]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "shuffled:of=rredcot" in printed and "trace 2" in printed and "wrote" in printed
    text = open(os.path.join(out, "index.html")).read()
    assert text.count("data-method='shuffled:of=rredcot'") == 2 and "data-method='mc_reference'" in text
    assert main(["show", "--checkpoint", saved_policy, "--n", "0", "--out", out]) == 2
    assert "show.n" in capsys.readouterr().err
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "index.html").write_text("my page")
    assert main(["show", "--checkpoint", saved_policy, "--out", str(foreign)]) == 2
    assert (foreign / "index.html").read_text() == "my page"


def test_audit_writes_html_with_a_show_grid(saved_policy, tmp_path):
    cfg = AuditConfig(checkpoint=saved_policy, n=8, group_size=4, k_ref=2, methods=("rloo",), max_new_tokens=16)
    write_audit_page(str(tmp_path / "audit"), run_audit(cfg, str(tmp_path / "audit"), progress=False))
    text = open(tmp_path / "audit" / "audit.html").read()
    # the plot beside the page is linked, not inlined (a second copy of it)
    assert "<table" in text and "src='audit.png'" in text and "base64" not in text
    assert os.path.isfile(tmp_path / "audit" / "audit.png")
    assert text.count("data-method='rloo'") == 2 and "data-method='mc_reference'" in text


def test_terminal_view_prints_every_method(policy):
    from rich.console import Console
    console = Console(record=True, width=120)
    render_terminal(page_of(policy), console)
    out = console.export_text()
    assert out.splitlines().count(" rredcot:mode=replace") == 4 and "first error step 1" in out


def test_text_from_someone_elses_file_is_escaped_in_the_page(policy):
    # a jsonl prompt, a method label or a generated token is data, never markup: a <script> in any of them
    # arrives as text (the page must be safe to open from another person's run)
    from dataclasses import replace
    page = page_of(policy, methods=("grpo",), with_reference=False)
    evil = "<script>alert(1)</script><img src=x onerror=alert(2)>'\""
    traces = [replace(t, prompt=evil, segments=[replace(s, tokens=[evil]) for s in t.segments]) for t in page.traces]
    text = render(replace(page, title=evil, subtitle=evil, traces=traces))
    assert "<script" not in text and "<img" not in text  # no tag of it survives
    assert text.count("&lt;script&gt;alert(1)&lt;/script&gt;") >= 1 + len(traces)  # the title, each prompt
