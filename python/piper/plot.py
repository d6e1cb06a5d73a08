"""Plots of piper results with matplotlib (Debian's python3-matplotlib; imported only when a plot is made).

    piper.plot.timeline(piper.simulate(..., trace="step.json"), "timeline.png")   # per-rank lanes, as the trace
    piper.plot.memory(piper.estimate(...), "memory.png")     # stacked bars per pipeline rank
    piper.plot.sweep(results, x="pp", y="step_time_s", path="sweep.png")

Each function returns the matplotlib Figure and, given a path, saves it there (PNG, SVG or PDF by extension).
The plots read the results' own fields (and the simulator's Chrome trace): nothing is recomputed here.
"""

import json


def _pyplot():
    import matplotlib
    if matplotlib.get_backend().lower() not in ("agg", "pdf", "svg", "cairo"):
        matplotlib.use("Agg")  # files, never a window
    import matplotlib.pyplot as plt
    return plt


def _field(obj, name):
    data = obj.to_dict() if hasattr(obj, "to_dict") else obj
    for part in name.split("."):
        data = data[part]
    return data


def _save(fig, path):
    if path is not None:
        fig.savefig(path, dpi=100, bbox_inches="tight")
    return fig


def timeline(sim_result, path=None, max_ranks=16):
    """One lane per (rank, stream) with a bar per task, from the Chrome trace piper.simulate(..., trace=F) wrote
    (the lanes of chrome://tracing or Perfetto)."""
    trace = sim_result["trace"] if "trace" in sim_result else None
    if trace is None:
        raise ValueError("timeline needs the step's trace: call piper.simulate(..., trace='step.json') first")
    with open(trace) as f:
        events = json.load(f)
    events = events["traceEvents"] if isinstance(events, dict) else events
    names = {}
    for ev in events:
        if ev.get("ph") == "M" and ev.get("name") == "thread_name":
            names[(ev["pid"], ev["tid"])] = ev["args"]["name"]
    tasks = [ev for ev in events if ev.get("ph") == "X"]
    lanes = sorted({(ev["pid"], ev.get("tid", 0)) for ev in tasks})
    ranks = sorted({pid for pid, _ in lanes})[:max_ranks]
    lanes = [lane for lane in lanes if lane[0] in ranks]
    row = {lane: i for i, lane in enumerate(lanes)}
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(12, 0.35 * len(lanes) + 1.5))
    # Compute by pass (F, B, W, BW), communication and the optimizer update by kind, as the trace's args say.
    colors = {"F": "tab:blue", "B": "tab:orange", "W": "tab:green", "BW": "tab:red", "collective": "tab:purple",
              "send": "tab:brown", "recv": "tab:pink", "update": "tab:olive"}
    for ev in tasks:
        lane = (ev["pid"], ev.get("tid", 0))
        if lane not in row:
            continue
        args = ev.get("args", {})
        color = colors.get(args.get("pass") if ev.get("cat") == "compute" else ev.get("cat"), "tab:gray")
        ax.barh(row[lane], ev.get("dur", 0) / 1e3, left=ev["ts"] / 1e3, height=0.8, color=color, linewidth=0)
    from matplotlib.patches import Patch
    ax.legend(handles=[Patch(color=c, label=k) for k, c in colors.items()], fontsize=7, ncol=4, loc="upper right")
    ax.set_yticks(range(len(lanes)))
    ax.set_yticklabels(["rank %d %s" % (pid, names.get((pid, tid), tid)) for pid, tid in lanes], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("time (ms)")
    ax.set_title("simulated step: %s, %s" % (sim_result["model"], sim_result["strategy"]["schedule"]))
    return _save(fig, path)


MEMORY_PARTS = ("params", "grads", "optimizer", "activations", "buffers")


def memory(estimate, path=None):
    """Stacked bars per pipeline rank (params, grads, optimizer, activations, buffers) in GiB, with the device's
    memory as a line."""
    ranks = _field(estimate, "ranks")
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(max(4, 0.5 * len(ranks) + 2), 4))
    bottom = [0.0] * len(ranks)
    for part in MEMORY_PARTS:
        values = [r[part] / 2**30 for r in ranks]
        ax.bar([r["pp_rank"] for r in ranks], values, bottom=bottom, label=part)
        bottom = [b + v for b, v in zip(bottom, values)]
    ax.axhline(_field(estimate, "device_memory_bytes") / 2**30, color="black", linestyle="--", label="device")
    ax.set_xlabel("pipeline rank")
    ax.set_ylabel("GiB per device")
    ax.legend(fontsize=7)
    return _save(fig, path)


def sweep(results, x, y="step_time_s", path=None, label=None, ax=None):
    """One point per result: `x` and `y` are field names, dotted for nested ones ("strategy.pp"); a strategy key
    alone ("pp") is looked up in the result's strategy. Give `ax` (a previous call's figure's axes) to draw
    several series on one plot."""
    def value(r, name):
        try:
            return _field(r, name)
        except (KeyError, TypeError):
            return _field(r, "strategy." + name)
    points = sorted((value(r, x), value(r, y)) for r in results)
    if ax is None:
        fig, ax = _pyplot().subplots(figsize=(5, 4))
    fig = ax.figure
    ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=label)
    ax.set_xlabel(x)
    ax.set_ylabel(y)
    if label:
        ax.legend()
    return _save(fig, path)
