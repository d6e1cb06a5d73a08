"""What every experiment script shares: running `piper ... --json`, writing a table (markdown + JSON) and an SVG
plot under docs/experiments/.

Every number in a table comes from a piper run made by the script that writes it (`make experiments` runs them
all); a script never edits a number by hand. Published figures are quoted with their source and confidence tag
from ../shared/reference (the tag says whether the figure was read in the primary source or only second-hand).
"""
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "docs", "experiments")
PIPER = os.environ.get("PIPER", os.path.join(ROOT, "build", "src", "cli", "piper"))


class PiperError(RuntimeError):
    pass


def piper(*args, timeout=900):
    """Runs `piper ARGS --json` and returns the parsed object; PiperError names the command and its error."""
    cmd = [PIPER] + [str(a) for a in args] + ["--json"]
    env = dict(os.environ)
    env.setdefault("PIPER_CALIBRATION", "none")  # preset figures unless the caller names a calibration
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    if p.returncode != 0:
        raise PiperError("%s: exit %d: %s" % (" ".join(cmd[1:]), p.returncode, p.stderr.strip()[-600:]))
    sys.stderr.write("  %.1f s  piper %s\n" % (time.time() - t0, " ".join(str(a) for a in args)))
    return json.loads(p.stdout)


def try_piper(*args, **kw):
    """piper(), or {"error": message} when the run is refused (e.g. a plan that does not fit)."""
    try:
        return piper(*args, **kw)
    except PiperError as e:
        return {"error": str(e)}


def fmt(v, digits=3):
    if v is None:
        return "—"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return ("%." + str(digits) + "g") % v
    return str(v)


def write_table(name, title, columns, rows, notes=(), extra=None):
    """docs/experiments/NAME.md (a markdown table under `title`, then `notes`) and NAME.json (the rows)."""
    os.makedirs(OUT, exist_ok=True)
    lines = ["# " + title, "", "Written by `experiments/%s.py` (`make experiments`); do not edit by hand." % name, ""]
    lines.append("| " + " | ".join(label for _, label in columns) + " |")
    lines.append("|" + "---|" * len(columns))
    for r in rows:
        lines.append("| " + " | ".join(fmt(r.get(key)) for key, _ in columns) + " |")
    if notes:
        lines.append("")
        lines.extend(notes)
    with open(os.path.join(OUT, name + ".md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    doc = {"experiment": name, "title": title, "columns": [k for k, _ in columns], "rows": rows}
    if extra:
        doc.update(extra)
    with open(os.path.join(OUT, name + ".json"), "w") as f:
        json.dump(doc, f, indent=1, sort_keys=True)
        f.write("\n")


def plot(name, title, xlabel, ylabel, series, logx=False, logy=False, kind="line", xticks=None):
    """docs/experiments/NAME.svg: `series` is a list of (label, xs, ys); kind "line" or "bar" (grouped)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    matplotlib.rcParams["svg.hashsalt"] = "piper"  # the same SVG for the same numbers
    fig, ax = plt.subplots(figsize=(7, 4))
    if kind == "bar":
        n = len(series)
        width = 0.8 / max(n, 1)
        for i, (label, xs, ys) in enumerate(series):
            pos = [j + (i - (n - 1) / 2) * width for j in range(len(xs))]
            ax.bar(pos, [y if y is not None else 0 for y in ys], width, label=label)
        ax.set_xticks(range(len(series[0][1])))
        ax.set_xticklabels([str(x) for x in series[0][1]], rotation=20, ha="right")
    else:
        for label, xs, ys in series:
            pts = [(x, y) for x, y in zip(xs, ys) if y is not None]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label)
        if logx:
            ax.set_xscale("log", base=2)
        if xticks:
            ax.set_xticks(xticks)
            ax.set_xticklabels([str(x) for x in xticks])
    if logy:
        ax.set_yscale("log")
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    os.makedirs(OUT, exist_ok=True)
    fig.savefig(os.path.join(OUT, name + ".svg"), metadata={"Date": None})
    plt.close(fig)


def ratio(a, b):
    return a / b if a and b else None
