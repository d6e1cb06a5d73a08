"""examples/python: each script runs and prints what it says."""
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET

from conftest import SOURCE_DIR
from test_plot import png_size


def test_best_plan_from_hf_config(tmp_path):
    script = os.path.join(SOURCE_DIR, "examples", "python", "best_plan.py")
    config = os.path.join(SOURCE_DIR, "tests", "data", "hf", "olmoe-1b-7b", "config.json")
    png = tmp_path / "memory.png"
    report = tmp_path / "plans.html"
    p = subprocess.run([sys.executable, script, config, "--nodes", "1", "--global-batch", "64", "--seq", "4096",
                        "--top", "2", "--simulate-top", "0", "--memory-png", str(png), "--report", str(report)],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[0].startswith("model   olmoe")
    assert lines[1].startswith("#1  ") and lines[2].startswith("#2  ")
    assert any(l.startswith("best    dp=") for l in lines)
    assert png_size(png)[0] > 100
    page = report.read_text()
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    for svg in re.findall(r"<svg .*?</svg>", page, flags=re.S):
        ET.fromstring(svg)  # every chart is well-formed SVG
    assert page.count("<svg ") == 2 + 2  # breakdown, memory legend, one memory chart per plan (--top 2)


def test_best_plan_bad_config_prints_the_error(tmp_path):
    script = os.path.join(SOURCE_DIR, "examples", "python", "best_plan.py")
    p = subprocess.run([sys.executable, script, str(tmp_path / "missing.json")], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 1
    assert p.stderr.startswith("error: ") and "missing.json" in p.stderr


def test_sweep_pp_ep_writes_a_png(tmp_path):
    script = os.path.join(SOURCE_DIR, "examples", "python", "sweep_pp_ep.py")
    png = tmp_path / "sweep.png"
    p = subprocess.run([sys.executable, script, str(png)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    rows = [l for l in p.stdout.splitlines() if l.startswith("ep=")]
    assert len(rows) >= 4  # at least one line of four points
    assert p.stdout.splitlines()[-1] == "wrote %s" % png
    width, height = png_size(png)
    assert width > 200 and height > 200


def test_dualpipev_in_python_trains_as_the_built_in(tmp_path):
    # DualPipeV written in Python (examples/python/dualpipev.py) on 4 ranks: the same losses as the built-in one.
    script = os.path.join(SOURCE_DIR, "examples", "python", "dualpipev.py")
    png = tmp_path / "timeline.png"
    p = subprocess.run([sys.executable, script, "--steps", "3", "--timeline-png", str(png)], capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    lines = p.stdout.splitlines()
    assert sum(1 for l in lines if l.startswith("directives ") and l.endswith(": equal")) == 8
    losses = {l.split()[0]: [float(x) for x in l.split()[2:]] for l in lines if " losses " in l}
    assert len(losses["dualpipev"]) == 3 and losses["py-dualpipev"] == losses["dualpipev"]
    assert lines[-1] == "losses equal, bit for bit"
    width, height = png_size(png)
    assert width > 200 and height > 100
