"""Pipeline schedules written in Python and registered by name (docs/python.md, "Schedules in Python").

A schedule is what a C++ schedule is (src/strategy/schedules/schedule.h): a function of the schedule's parameters
(``p.pp`` pipeline ranks, ``p.microbatches``, ``p.vpp``, ``p.ep_overlap``) that returns the ``place`` directives
putting every pipeline stage on a rank, then one ``order`` row per rank, as a :class:`piper.Directives` (or its
list). Registered, its name is a ``schedule=`` value like a built-in one:

    @piper.schedule("my-gpipe")
    def my_gpipe(p):
        d = piper.Directives()
        for r in range(p.pp):
            d.place({"stage": r}, rank=r)
        for r in range(p.pp):
            d.order(r, [piper.action(r, "F", m) for m in range(p.microbatches)] +
                       [piper.action(r, "BW", m) for m in range(p.microbatches)])
        return d

    piper.simulate("tiny-moe", "local-cpu", "pp=2,schedule=my-gpipe,microbatches=4")

The C++ compiler calls the function whenever it lowers a strategy naming it: piper.simulate, piper.compile and
piper.plan (``schedules=["my-gpipe"]``) in this process. piper.train runs its ranks as separate processes (mpirun),
which cannot call back into this interpreter: it writes the strategy's directives, the function's rows included, to
a directive file that every rank compiles (``piper train --directives F --mesh M``).
"""

import json

from . import _core

_PYTHON_SCHEDULES = {}


class ScheduleParams:
    """The parameters a schedule is generated for (schedule.h ScheduleParams)."""

    __slots__ = ("pp", "microbatches", "vpp", "ep_overlap")

    def __init__(self, pp, microbatches, vpp=1, ep_overlap=False):
        self.pp, self.microbatches, self.vpp, self.ep_overlap = pp, microbatches, vpp, ep_overlap

    def __repr__(self):
        return "ScheduleParams(pp=%d, microbatches=%d, vpp=%d, ep_overlap=%s)" % (
            self.pp, self.microbatches, self.vpp, self.ep_overlap)


def _rows_of(name, out):
    """The function's result as the JSON list the C++ reads: only place-on-a-rank and order directives."""
    from .directives import Directives
    rows = out.to_list() if isinstance(out, Directives) else out
    if not isinstance(rows, list):
        raise TypeError("schedule %s returned %s; return a piper.Directives (place + order) or its list"
                        % (name, type(out).__name__))
    for d in rows:
        kind = d.get("directive") if isinstance(d, dict) else None
        if kind == "place" and "rank" in d and "stage" not in d:
            continue
        if kind != "order":
            raise ValueError("schedule %s returned a %r directive; a schedule writes only place(..., rank=R) and "
                             "order directives (the strategy adds split, partition, replicate and shard)"
                             % (name, kind if kind else d))
    return rows


def register_schedule(name, fn, *, stages_per_rank=1, help=""):
    """Registers ``fn(params) -> Directives`` as schedule ``name``. ``stages_per_rank``: pipeline stages each rank
    holds (1 for 1F1B-like schedules, 2 for V-shapes such as DualPipeV), or "vpp" for the strategy's vpp.
    Registering a name again replaces the function; a built-in name is refused (piper.InvalidArgument). Register
    before other threads compile (as C++'s register_schedule, it is not thread-safe)."""
    name = str(name)
    if not name or any(c in name for c in ",= "):
        raise ValueError("schedule name %r: give a non-empty name without ',', '=' or spaces" % name)
    if stages_per_rank == "vpp":
        spr = 0
    elif isinstance(stages_per_rank, int) and not isinstance(stages_per_rank, bool) and stages_per_rank >= 1:
        spr = stages_per_rank
    else:
        raise ValueError("stages_per_rank=%r: give an int >= 1 or \"vpp\"" % (stages_per_rank,))

    def generate(params):
        return json.dumps(_rows_of(name, fn(ScheduleParams(**params))))

    _core.register_schedule(name, str(help), spr, generate)
    _PYTHON_SCHEDULES[name] = fn
    return fn


def schedule(name, *, stages_per_rank=1, help=""):
    """Decorator form of register_schedule: ``@piper.schedule("my-v", stages_per_rank=2)``."""
    def wrap(fn):
        return register_schedule(name, fn, stages_per_rank=stages_per_rank, help=help or (fn.__doc__ or "").strip())
    return wrap


def python_schedules():
    """Names of the schedules registered from Python in this process."""
    return sorted(_PYTHON_SCHEDULES)


def schedule_directives(name, pp, microbatches, vpp=1, ep_overlap=False):
    """A schedule's place and order directives as the compiler receives them (built-in or registered)."""
    return _core.schedule_directives(str(name), pp, microbatches, vpp, ep_overlap)
