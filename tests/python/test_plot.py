"""piper.plot: each plot writes a valid PNG of the size matplotlib reports, drawn from the result's own fields."""
import json
import struct

import pytest

pytest.importorskip("matplotlib")

import piper
import piper.plot

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
STRATEGY = "dp=4,pp=2,ep=4,schedule=1f1b,microbatches=4,mbs=1"


def png_size(path):
    """(width, height) from a PNG's IHDR chunk, after checking the signature and the chunk's type."""
    with open(path, "rb") as f:
        head = f.read(24)
    assert head[:8] == PNG_SIGNATURE, "not a PNG"
    assert head[12:16] == b"IHDR"
    return struct.unpack(">II", head[16:24])


def check_png(fig, path):
    width, height = png_size(path)
    w_in, h_in = fig.get_size_inches()
    assert width > 100 and height > 100
    assert width <= w_in * 100 + 2 and height <= h_in * 100 + 2  # bbox_inches="tight" only crops


def test_timeline(tiny, h100, tmp_path):
    sim = piper.simulate(tiny, h100, STRATEGY, seq=128, trace=tmp_path / "step.json")
    fig = piper.plot.timeline(sim, tmp_path / "timeline.png")
    check_png(fig, tmp_path / "timeline.png")
    bars = fig.axes[0].patches
    with open(tmp_path / "step.json") as f:
        events = json.load(f)
    events = events["traceEvents"] if isinstance(events, dict) else events
    assert len(bars) == sum(1 for ev in events if ev.get("ph") == "X")  # one bar per task of the 4 ranks shown
    assert len({b.get_facecolor() for b in bars}) >= 4  # F, BW, collectives, p2p at least
    with pytest.raises(ValueError):
        piper.plot.timeline(piper.simulate(tiny, h100, STRATEGY, seq=128))


def test_memory(tiny, h100, tmp_path):
    e = piper.estimate(tiny, h100, STRATEGY, seq=128)
    fig = piper.plot.memory(e, tmp_path / "memory.png")
    check_png(fig, tmp_path / "memory.png")
    # 5 parts stacked on each of the 2 pipeline ranks; the stack's top is each rank's total.
    bars = fig.axes[0].patches
    assert len(bars) == 5 * 2
    tops = [max(b.get_y() + b.get_height() for b in bars if round(b.get_x() + b.get_width() / 2) == r) for r in (0, 1)]
    assert tops == pytest.approx([r.total / 2**30 for r in e.ranks])


def test_sweep(tiny, h100, tmp_path):
    results = [piper.estimate(tiny, h100, "dp=%d,pp=%d,ep=2,microbatches=4" % (8 // pp, pp), seq=128)
               for pp in (1, 2, 4)]
    fig = piper.plot.sweep(results, x="pp", y="step_time_s", path=tmp_path / "sweep.png")
    check_png(fig, tmp_path / "sweep.png")
    xs, ys = fig.axes[0].lines[0].get_data()
    assert list(xs) == [1, 2, 4]
    assert list(ys) == [r.step_time_s for r in results]
