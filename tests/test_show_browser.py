"""`credo show` in a real browser: headless Chromium renders the page; every trace and method is in the
rendered DOM, and a known wrong line is painted negative (red). `make test-slow` installs Chromium."""

import json
import os
import re
import shutil
import subprocess

import pytest

from credo.cli.main import main

pytestmark = pytest.mark.slow
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars"]


@pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed (make test-slow installs Debian's chromium)")
def test_show_page_renders_in_chromium(tmp_path):
    out = str(tmp_path / "show")
    methods = ["grpo", "rredcot", "shuffled:of=rredcot"]
    assert main(["show", "--task", "arith", "--methods", ",".join(methods), "--n", "6", "--k-ref", "4",
                 "--out", out, "--quiet"]) == 0
    url = "file://" + os.path.join(out, "index.html")
    dom = subprocess.run([CHROMIUM, *FLAGS, "--dump-dom", url], capture_output=True, text=True, timeout=120).stdout
    cells = set(re.findall(r'data-trace="(\d+)" data-method="([^"]+)"', dom))
    assert cells == {(str(t), m) for t in range(1, 7) for m in methods + ["mc_reference"]}
    # a wrong trace's labelled first error in a mixed group: GRPO gives it negative credit -> red in the DOM
    page = json.load(open(os.path.join(out, "page.json")))
    known = [(t["index"], t["first_error"]) for t in page["traces"] if t["first_error"] is not None
             and sum(t["segments"][t["first_error"]]["credit"]["grpo"]) < 0]
    assert known, "no wrong trace in a mixed group among the shown traces"
    trace, step = known[0]
    cell = re.search(rf'data-trace="{trace}" data-method="grpo">(.*?)</div></div>', dom).group(1)
    line = re.search(rf'data-step="{step + 1}"[^>]*>(.*?)</div>', cell + "</div>").group(1)
    colours = [tuple(map(int, c)) for c in re.findall(r"background:\s*rgb\((\d+),\s*(\d+),\s*(\d+)\)", line)]
    assert colours and all(r > b and r > g for r, g, b in colours)
    shot = str(tmp_path / "shot.png")
    subprocess.run([CHROMIUM, *FLAGS, f"--screenshot={shot}", "--window-size=1400,1000", url],
                   capture_output=True, timeout=120)
    assert os.path.getsize(shot) > 10_000
