"""`piper plan --report FILE.html|FILE.svg`: the plans as charts in one file, no external resources."""
import html.parser
import re
import xml.etree.ElementTree as ET

import pytest

import piper
from conftest import cli_error, cli_json, run_cli

SVG = "{http://www.w3.org/2000/svg}"
PLAN = ["plan", "--model", "tiny-moe", "--cluster", "dgx-h100", "--nodes", "1", "--seq", "128", "--global-batch",
        "8", "--top", "3", "--threads", "2", "--simulate-top", "2", "--local-search", "0"]


class Page(html.parser.HTMLParser):
    """Collects the tags of an HTML page, its table rows, and every attribute that could load another file."""

    def __init__(self):
        super().__init__()
        self.tags, self.rows, self.external, self.text = [], 0, [], []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.rows += tag == "tr"
        for name, value in attrs:
            if name in ("src", "href", "xlink:href") or (value and "url(" in value):
                self.external.append((tag, name, value))

    def handle_data(self, data):
        self.text.append(data)


def rect_fills(svg_text):
    return re.findall(r'<rect [^>]*fill="(#[0-9a-f]{6})"', svg_text)


def test_html_report(tmp_path):
    path = tmp_path / "plans.html"
    rc, out, err = run_cli(*PLAN, "--report", str(path))
    assert rc == 0, err
    text = path.read_text()
    page = Page()
    page.feed(text)
    assert page.tags[0] == "html" and "script" not in page.tags and "link" not in page.tags
    assert page.external == []
    assert re.findall(r"https?://", text) == ["http://"] * text.count("http://www.w3.org/2000/svg")
    plans = cli_json(*PLAN)["plans"]
    assert page.rows == 1 + len(plans)  # the header and one row per plan
    for p in plans:
        assert p["strategy"] in text
    # Every inline SVG parses as XML: the breakdown, the memory legend and one memory chart per plan.
    svgs = re.findall(r"<svg .*?</svg>", text, flags=re.S)
    assert len(svgs) == 2 + len(plans)
    for s in svgs:
        ET.fromstring(s)
    breakdown = svgs[0]
    assert len([f for f in rect_fills(breakdown) if f == "#4e79a7"]) == 1 + len(plans)  # legend + a compute bar each
    pp_ranks = [len(p["estimate"]["ranks"]) for p in plans]
    for s, n in zip(svgs[2:], pp_ranks):
        assert len(rect_fills(s)) == 5 * n  # five memory categories per pipeline rank


def test_svg_report_and_python(tmp_path):
    path = tmp_path / "plans.svg"
    rc, _, err = run_cli(*PLAN, "--report", str(path))
    assert rc == 0, err
    root = ET.parse(path).getroot()
    assert root.tag == SVG + "svg" and float(root.get("height")) > 300
    assert len(root.findall(".//" + SVG + "svg")) >= 3
    # piper.plan(report=...) writes the same charts for the same plans.
    p = piper.plan("tiny-moe", "dgx-h100", seq=128, global_batch=8, top=3, threads=2, simulate_top=2, local_search=0,
                   report=tmp_path / "py.svg")
    assert (tmp_path / "py.svg").read_text().count("<rect") == path.read_text().count("<rect")
    assert len(p.plans) == 3


def test_bad_report_extension():
    msg = cli_error(*PLAN, "--report", "plans.pdf")
    assert "the report is HTML (FILE.html) or SVG (FILE.svg)" in msg
    with pytest.raises(piper.InvalidArgument) as e:
        piper.plan("tiny-moe", "dgx-h100", seq=128, global_batch=8, report="plans.pdf")
    assert str(e.value) == msg
    assert cli_error(*PLAN, "--report", "/nonexistent/plans.html") == (
        "--report /nonexistent/plans.html: directory '/nonexistent' does not exist; create it or write the report "
        "elsewhere")
