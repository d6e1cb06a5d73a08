"""Piper from Python: specs, the closed-form estimate, the simulator, the planner and the compiler (docs/python.md).

    import piper
    model = piper.Model.preset("mixtral-8x7b")
    cluster = piper.Cluster.preset("dgx-h100", nodes=8)
    s = piper.Strategy.parse("dp=8,pp=8,ep=8,schedule=1f1b,microbatches=32")
    e = piper.estimate(model, cluster, s)          # `piper estimate --json`, as an object
    print(e.step_time_s, e.memory.total, e.to_dict()["mfu"])

Every function wraps the C++ library (the module piper._core); results are the JSON objects of the matching
`piper <command> --json`, with attribute access. Errors raise piper.Error subclasses (piper/errors.py) with the
message the CLI prints.
"""

import copy
import json
import os

from . import _core
from .directives import Directives, action, make_filter
from .schedules import ScheduleParams, python_schedules, register_schedule, schedule, schedule_directives
from .training import TrainResult, train
from .errors import (DataLoss, DeadlineExceeded, Error, FailedPrecondition, Internal, InvalidArgument, NotFound,
                     OutOfRange, ResourceExhausted, Unavailable, Unimplemented)

__all__ = ["Model", "Cluster", "Strategy", "Result", "Directives", "estimate", "simulate", "plan", "compile",
           "train", "TrainResult", "register_schedule", "schedule", "ScheduleParams", "python_schedules",
           "schedule_directives", "action", "make_filter", "Error", "InvalidArgument", "NotFound", "OutOfRange", "FailedPrecondition",
           "DataLoss", "DeadlineExceeded", "Unavailable", "ResourceExhausted", "Unimplemented", "Internal"]


class Result:
    """A result object: the JSON of `piper <command> --json` with attribute access (nested objects too).

    ``r.step_time_s``, ``r["step_time_s"]`` and ``r.to_dict()["step_time_s"]`` are the same value. ``kind`` says
    which command made it ("estimate", "simulate", "plan", "compile")."""

    def __init__(self, data, kind=None):
        object.__setattr__(self, "_data", data)
        object.__setattr__(self, "kind", kind)

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        try:
            return _wrap(self._data[name])
        except KeyError:
            raise AttributeError("%s result has no field '%s' (fields: %s)"
                                 % (self.kind or "this", name, ", ".join(sorted(self._data)))) from None

    def __getitem__(self, key):
        return _wrap(self._data[key])

    def __contains__(self, key):
        return key in self._data

    def __setattr__(self, name, value):
        raise AttributeError("results are read-only; use to_dict() for a copy to edit")

    def __dir__(self):
        return sorted(set(self._data) | {"to_dict", "keys", "kind"})

    def keys(self):
        return self._data.keys()

    def to_dict(self):
        """A deep copy of the result as plain dicts and lists (json.dumps-able)."""
        return copy.deepcopy(self._data)

    def __eq__(self, other):
        return isinstance(other, Result) and self._data == other._data

    def __repr__(self):
        return "Result(%s: %s)" % (self.kind or "object", json.dumps(self._data)[:200])


def _wrap(value):
    if isinstance(value, dict):
        return Result(value)
    if isinstance(value, list):
        return [_wrap(v) for v in value]
    return value


class Model:
    """A model spec: a preset name (configs/models), our JSON file, or a Hugging Face config.json."""

    def __init__(self, spec, source=None):
        self._spec = spec
        self._source = source  # the preset name or file it was loaded from (piper.train passes it to the ranks)

    @classmethod
    def preset(cls, name):
        """A preset ("deepseek-v3", "mixtral-8x7b", ...) or a file path, as `piper info --model` takes it."""
        name = os.fspath(name) if hasattr(name, "__fspath__") else str(name)
        return cls(_core.load_model(name), os.path.abspath(name) if os.path.exists(name) else name)

    load = preset

    @classmethod
    def from_hf_config(cls, path_or_dict, name=None):
        """A Hugging Face config.json: its path, or the dict it holds (``name`` names the model; default: the
        config's ``_name_or_path``, else its ``model_type``)."""
        if isinstance(path_or_dict, dict):
            name = name or path_or_dict.get("_name_or_path") or path_or_dict.get("model_type") or "hf-config"
            return cls(_core.model_from_text(json.dumps(path_or_dict), str(name), "config dict"))
        return cls.preset(path_or_dict)

    @property
    def name(self):
        return self._spec.name

    def to_dict(self):
        """The spec as `piper info --json`'s "model" object (our JSON format)."""
        return self._spec.to_json()

    def __repr__(self):
        return "Model(%r)" % self.name


class Cluster:
    """A cluster spec: a preset name (configs/clusters) or a file, with a node count."""

    def __init__(self, spec):
        self._spec = spec

    @classmethod
    def preset(cls, name, nodes=1):
        return cls(_core.load_cluster(str(name), nodes))

    load = preset

    @property
    def name(self):
        return self._spec.name

    @property
    def nodes(self):
        return self._spec.num_nodes

    @property
    def world_size(self):
        return self._spec.world_size

    def to_dict(self):
        return self._spec.to_json()

    def __repr__(self):
        return "Cluster(%r, nodes=%d)" % (self.name, self.nodes)


class Strategy:
    """A parallel strategy, parsed by the C++ parser: ``Strategy.parse("dp=8,pp=4,ep=8")`` or
    ``Strategy(dp=8, pp=4, ep=8)``. Every key is an attribute (``s.pp``); ``str(s)`` prints every key and parses
    back to an equal strategy; ``s.replace(pp=2)`` is a copy with keys changed."""

    def __init__(self, text=None, **keys):
        if text is not None and keys:
            raise TypeError("give a strategy string or keywords, not both (or use .replace)")
        if text is None:
            text = ",".join("%s=%s" % (k, v) for k, v in keys.items())
        text, fields = _core.parse_strategy(str(text))
        object.__setattr__(self, "_text", text)
        object.__setattr__(self, "_fields", fields)

    @classmethod
    def parse(cls, text):
        return cls(text)

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        try:
            return self._fields[name]
        except KeyError:
            raise AttributeError("strategy has no key '%s' (keys: %s)" % (name, ", ".join(self._fields))) from None

    def __setattr__(self, name, value):
        raise AttributeError("strategies are immutable; use s.replace(%s=...)" % name)

    def replace(self, **keys):
        items = dict(item.split("=", 1) for item in self._text.split(","))
        items.update({k: str(v) for k, v in keys.items()})
        return Strategy(",".join("%s=%s" % kv for kv in items.items()))

    def to_dict(self):
        return copy.deepcopy(self._fields)

    def __str__(self):
        return self._text

    def __repr__(self):
        return "Strategy(%r)" % self._text

    def __eq__(self, other):
        return isinstance(other, Strategy) and self._text == other._text

    def __hash__(self):
        return hash(self._text)


def _as_model(model):
    return model if isinstance(model, Model) else Model.preset(model)


def _as_cluster(cluster, nodes):
    if isinstance(cluster, Cluster):
        if nodes is not None and nodes != cluster.nodes:
            raise ValueError("cluster %r already has %d nodes; drop nodes=%d" % (cluster.name, cluster.nodes, nodes))
        return cluster
    return Cluster.preset(cluster, nodes if nodes is not None else 1)


def _options(strategy, directives, mesh, kw):
    """The keyword dict the C++ side reads (python/bindings.cc): strategy or directives (a builder or a file)."""
    o = {k: v for k, v in kw.items() if v is not None}
    for path_key in ("calibration", "comm_calibration"):
        if path_key in o:
            o[path_key] = os.fspath(o[path_key])
    if strategy is not None:
        o["strategy"] = str(strategy)
    if isinstance(directives, Directives):
        o["directives_json"] = directives.to_json()
        o["directives_label"] = "<python directives>"
        mesh = mesh or directives.mesh
    elif directives is not None:
        o["directives_file"] = os.fspath(directives)
    if mesh is not None:
        o["mesh"] = mesh
    return o


def estimate(model, cluster, strategy=None, *, nodes=None, directives=None, mesh=None, global_batch=None, seq=None,
             precision=None, calibration=None, comm_calibration=None, domain_nodes=None):
    """`piper estimate --json`: closed-form memory per pipeline rank, step time and MFU of one strategy."""
    o = _options(strategy, directives, mesh, dict(global_batch=global_batch, seq=seq, precision=precision,
                                                   calibration=calibration, comm_calibration=comm_calibration,
                                                   domain_nodes=domain_nodes))
    return Result(_core.estimate(_as_model(model)._spec, _as_cluster(cluster, nodes)._spec, o), "estimate")


def simulate(model, cluster, strategy=None, *, nodes=None, directives=None, mesh=None, trace=None, full=False,
             global_batch=None, seq=None, precision=None, calibration=None, comm_calibration=None, domain_nodes=None):
    """`piper simulate --json`: the compiled step on the modelled cluster; ``trace=path`` writes its Chrome trace
    (piper.plot.timeline reads it)."""
    o = _options(strategy, directives, mesh, dict(global_batch=global_batch, seq=seq, precision=precision,
                                                   calibration=calibration, comm_calibration=comm_calibration,
                                                   domain_nodes=domain_nodes, full=full))
    if trace is not None:
        o["trace"] = os.fspath(trace)
    return Result(_core.simulate(_as_model(model)._spec, _as_cluster(cluster, nodes)._spec, o), "simulate")


def plan(model, cluster, *, nodes=None, global_batch, seq=None, top=5, schedules=None, threads=None, verify=True,
         verify_attempts=3, simulate_top=None, local_search=8, sim_budget_s=15.0, memory_fraction=0.95,
         precision=None, calibration=None, comm_calibration=None, domain_nodes=None, rescore_bound=True, report=None):
    """`piper plan --json`: the best strategies for a model on a cluster, best first (``.plans``; ``.best`` is the
    first's Strategy). Raises piper.ResourceExhausted when nothing fits, with the CLI's message. ``report``:
    also write `piper plan --report`'s charts to this .html or .svg file. ``rescore_bound=False`` is
    `--no-rescore-bound`."""
    if report is not None:
        report = os.fspath(report)
        _core.check_plan_report_path(report)
    o = dict(global_batch=global_batch, seq=seq, top=top, threads=threads, verify=verify, verify_attempts=verify_attempts,
             simulate_top=simulate_top, local_search=local_search, sim_budget_s=sim_budget_s,
             memory_fraction=memory_fraction, precision=precision, calibration=calibration,
             domain_nodes=domain_nodes, rescore_bound=rescore_bound)
    for path_key, value in (("calibration", calibration), ("comm_calibration", comm_calibration)):
        if value is not None:
            o[path_key] = os.fspath(value)
    if schedules is not None:
        o["schedules"] = schedules.split(",") if isinstance(schedules, str) else list(schedules)
    r = _core.plan(_as_model(model)._spec, _as_cluster(cluster, nodes)._spec, {k: v for k, v in o.items()
                                                                               if v is not None})
    if report is not None:
        _core.write_plan_report(report, json.dumps(r), memory_fraction)
    return PlanResult(r, "plan")


class PlanResult(Result):
    @property
    def best(self):
        """The best plan's Strategy."""
        return Strategy(self._data["plans"][0]["strategy"])


def compile(model, strategy=None, *, directives=None, mesh=None, global_batch=None, seq=None, microbatches=None,
            capacity_gib=None, target=None, precision=None):
    """`piper compile --json`: compiles and verifies (acyclic, sends match receives, deadlock-free, memory per rank
    against ``capacity_gib``) and returns the report: per program template its ranks, instructions and peak
    memory. Directives that do not verify raise piper.Error with the compiler's message."""
    o = _options(strategy, directives, mesh, dict(global_batch=global_batch, seq=seq, microbatches=microbatches,
                                                   capacity_gib=capacity_gib, target=target, precision=precision))
    return Result(_core.compile(_as_model(model)._spec, o), "compile")
