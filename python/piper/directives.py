"""The directive builder: a strategy written in Python, one method per directive (docs/directives.md).

Each method appends one directive as the JSON object the C++ reader takes (src/ir/directive.h) and writes every
field the C++ emitter writes, with the reader's defaults, so that ``Directives(...).to_list()`` equals
``piper compile --emit-directives`` for the same strategy (tests/python/test_directives.py checks this for every
built-in schedule). Filters are dicts of tags, or keywords: ``layer``/``stage``/``mb`` (an int, or a
``(lo, hi)`` range), ``part`` and ``pass_`` ("F", "B", "W", "BW").

    d = piper.Directives(mesh="pp=2")
    d.split(4)
    d.place(layer=(0, 1), stage=0).place(layer=(2, 3), stage=1)
    d.place(filter={"stage": 0}, rank=0).place(filter={"stage": 1}, rank=1)
    d.order(0, ["0F0", "0F1", ...])
    report = d.compile(piper.Model.preset("tiny-moe"))
"""

import copy
import json

from . import _core

_TAG_KEYS = ("layer", "stage", "mb", "part", "pass")


def _range(value):
    """An int, or (lo, hi) / [lo, hi] / "lo-hi", as the C++ writes a range: an int when lo == hi, else "lo-hi"."""
    if isinstance(value, (tuple, list)):
        lo, hi = value
        return int(lo) if lo == hi else "%d-%d" % (lo, hi)
    return value


def make_filter(filter=None, **tags):
    """A tag filter dict from a dict and/or keyword tags (``pass_`` for "pass")."""
    f = dict(filter or {})
    if "pass_" in tags:
        tags["pass"] = tags.pop("pass_")
    for key, value in tags.items():
        if value is not None:
            f[key] = value
    for key in ("layer", "stage", "mb"):
        if key in f:
            f[key] = _range(f[key])
    return {k: f[k] for k in _TAG_KEYS if k in f} | {k: v for k, v in f.items() if k not in _TAG_KEYS}


def action(stage, pass_, mb):
    """The action string of one task, "<stage><pass><mb>": action(0, "F", 3) == "0F3"."""
    return "%d%s%d" % (stage, pass_, mb)


def _slot_member(member):
    # The C++ writes a filter naming exactly one stage, one microbatch and a pass (nothing else) as its action string.
    if isinstance(member, str):
        return member
    f = make_filter(member)
    if set(f) == {"stage", "mb", "pass"} and isinstance(f["stage"], int) and isinstance(f["mb"], int):
        return action(f["stage"], f["pass"], f["mb"])
    return f


def _slot(slot):
    if isinstance(slot, (list, tuple)):
        members = [_slot_member(m) for m in slot]
        return members[0] if len(members) == 1 else members
    return _slot_member(slot)


def _mesh_text(mesh, axes):
    if mesh is None and not axes:
        return None
    if isinstance(mesh, str):
        if axes:
            raise TypeError("give the mesh as a string or as keywords, not both")
        return mesh
    parts = dict(mesh or {}) | axes
    return ",".join("%s=%d" % (k, v) for k, v in parts.items())


class Directives:
    """An ordered list of directives and the mesh it is written for ("pp=2,dp=4,ep=2" or keywords pp=2, dp=4)."""

    def __init__(self, mesh=None, **axes):
        self.mesh = _mesh_text(mesh, axes)
        self._list = []

    # -- one method per directive (each returns self, so calls chain) --

    def split(self, microbatches):
        """Cuts every node into `microbatches` microbatches (first, once)."""
        return self._add({"directive": "split", "microbatches": microbatches})

    def place(self, filter=None, *, stage=None, rank=None, **tags):
        """Tags the matched chunks with a pipeline `stage`, and/or puts the matched nodes on pipeline `rank`."""
        d = {"directive": "place", "filter": make_filter(filter, **tags)}
        if stage is not None:
            d["stage"] = stage
        if rank is not None:
            d["rank"] = rank
        return self._add(d)

    def replicate(self, filter=None, *, axis="dp", zero=0, reduce="all_reduce", bucket_mb=0, stream="dp",
                  param_gather="after_update", **tags):
        """Data parallelism over `axis`; ZeRO `zero` (1..3 imply reduce="reduce_scatter", as the reader does)."""
        return self._add({"directive": "replicate", "filter": make_filter(filter, **tags), "axis": axis,
                          "zero": zero, "reduce": "reduce_scatter" if zero >= 1 else reduce,
                          "bucket_mb": bucket_mb, "stream": stream, "param_gather": param_gather})

    def shard(self, filter=None, *, axis="ep", algorithm="flat", sequence_parallel=False, stream=None, **tags):
        """Expert (axis "ep": algorithm "flat" or "halo") or tensor (axis "tp": "ring") parallelism."""
        d = {"directive": "shard", "filter": make_filter(filter, **tags), "axis": axis, "algorithm": algorithm,
             "sequence_parallel": sequence_parallel}
        if stream:
            d["stream"] = stream
        return self._add(d)

    def order(self, rank, slots, *, stream="compute"):
        """The order of pipeline rank `rank`'s tasks on `stream`. A slot is an action string ("0F3"), a filter,
        or a list of them that may overlap."""
        return self._add({"directive": "order", "rank": rank, "stream": stream, "slots": [_slot(s) for s in slots]})

    def stream(self, filter=None, *, stream, **tags):
        """Moves the matched nodes to the named stream (e.g. weight gradients on "wgrad")."""
        return self._add({"directive": "stream", "filter": make_filter(filter, **tags), "stream": stream})

    def recompute(self, filter=None, *, modules=None, **tags):
        """Re-runs the matched forward chunks before their backward (or only `modules`, "layernorm+moe_act")."""
        d = {"directive": "recompute", "filter": make_filter(filter, **tags)}
        if modules:
            d["modules"] = modules if isinstance(modules, str) else "+".join(modules)
        return self._add(d)

    def disaggregate(self, attn_groups, ffn_groups):
        """Attention chunks on `attn_groups` groups, expert chunks on `ffn_groups` groups (af-pipe)."""
        return self._add({"directive": "disaggregate", "attn_groups": attn_groups, "ffn_groups": ffn_groups})

    # -- the list --

    def _add(self, directive):
        self._list.append(directive)
        return self

    def __len__(self):
        return len(self._list)

    def to_list(self):
        """The directive list as JSON values (a deep copy)."""
        return copy.deepcopy(self._list)

    def to_json(self, indent=None):
        return json.dumps(self._list, indent=indent)

    def save(self, path):
        """Writes a directive file as `piper compile --emit-directives` does ({"directives": [...]}), which
        `piper compile --directives FILE --mesh M` reads."""
        with open(path, "w") as f:
            f.write(json.dumps({"directives": self._list}, indent=1) + "\n")
        return path

    def check(self):
        """The list as the C++ reader reads it and writes it back; raises piper.Error as the CLI would."""
        return _core.read_directives(self.to_json(), "<python directives>")

    @classmethod
    def from_list(cls, directives, mesh=None, **axes):
        """Rebuilds a list (a directive file's JSON) through the builder's methods, one call per directive."""
        if isinstance(directives, dict):
            directives = directives["directives"]
        out = cls(mesh, **axes)
        for d in directives:
            fields = {k: v for k, v in d.items() if k != "directive"}
            kind = d["directive"]
            if kind in ("split", "disaggregate"):
                getattr(out, kind)(**fields)
            elif kind == "order":
                out.order(fields.pop("rank"), fields.pop("slots"), **fields)
            elif kind in ("place", "replicate", "shard", "stream", "recompute"):
                getattr(out, kind)(fields.pop("filter", None), **fields)
            else:
                raise ValueError("unknown directive '%s' (known: split, place, replicate, shard, order, stream, "
                                 "recompute, disaggregate)" % kind)
        return out

    @classmethod
    def load(cls, path, mesh=None, **axes):
        with open(path) as f:
            return cls.from_list(json.load(f), mesh, **axes)

    @classmethod
    def of_strategy(cls, model, strategy, target="megatron", **options):
        """The directives a built-in strategy emits (`piper compile --emit-directives`), rebuilt with this builder,
        with the strategy's mesh."""
        from . import _as_model
        out = _core.strategy_directives(_as_model(model)._spec, dict(options, strategy=str(strategy), target=target))
        mesh = out["mesh"]
        return cls.from_list(out["directives"], ",".join("%s=%d" % (k, mesh[k]) for k in ("pp", "vpp", "dp", "ep", "tp")))

    # -- what the commands do with a directive file --

    def compile(self, model, **options):
        """piper.compile(model, directives=self): the verification report (raises piper.Error if it does not verify)."""
        from . import compile as compile_
        return compile_(model, directives=self, **options)

    def simulate(self, model, cluster, **options):
        """piper.simulate(model, cluster, directives=self)."""
        from . import simulate
        return simulate(model, cluster, directives=self, **options)

    def __repr__(self):
        return "Directives(mesh=%r, %d directives)" % (self.mesh, len(self._list))
