"""piper.train: training on local MPI ranks, as `piper train` does (docs/python.md, "Training").

The ranks are processes (mpirun starts them; one rank runs in one process), so piper.train runs the `piper`
executable's train command, ``piper train --json ...``, and returns its JSON object with the per-step losses.
Directives built in Python, and strategies naming a schedule registered from Python, reach the ranks as a directive
file that every rank compiles: a rank's process cannot call back into this interpreter. Errors raise the
piper.Error subclass and message of the CLI's JSON error object. The GIL is free while the ranks train (the call
waits on the child process), so other Python threads keep running.
"""

import json
import os
import shutil
import subprocess
import tempfile

from .errors import Error, error_class

try:
    from . import _build_info
except ImportError:  # a copy of the package without the file CMake writes
    _build_info = None


def executable():
    """The `piper` executable piper.train runs: $PIPER_BIN, else the one built or installed with this package,
    else `piper` on PATH. Raises piper.NotFound naming the three places when there is none."""
    candidates = [os.environ.get("PIPER_BIN"), getattr(_build_info, "PIPER_EXECUTABLE", None), shutil.which("piper")]
    for path in candidates:
        if path and os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    raise error_class("NOT_FOUND")(
        "train: no piper executable (looked at $PIPER_BIN=%r, the build's %r and PATH); build the project "
        "(`make build`) or set PIPER_BIN to build/src/cli/piper" % (os.environ.get("PIPER_BIN"),
                                                                   getattr(_build_info, "PIPER_EXECUTABLE", None)))


class TrainResult:
    """What `piper train --json` printed: ``losses`` (one per step), ``steps`` (per-step loss, aux_loss,
    grad_norm, seconds), and the summary fields as attributes (``loss_first``, ``loss_last``, ``tokens_per_s``,
    ``peak_memory_bytes``, ``predicted_vs_measured``, ...); ``to_dict()`` is the whole object."""

    def __init__(self, data, command):
        from . import Result
        self._result = Result(data, "train")
        self.command = command  # the argv that ran, for the record

    @property
    def losses(self):
        return [s["loss"] for s in self._result.to_dict()["steps"]]

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._result, name)

    def __getitem__(self, key):
        return self._result[key]

    def to_dict(self):
        return self._result.to_dict()

    def __repr__(self):
        d = self._result.to_dict()
        return "TrainResult(%s, %s, %d steps, loss %.4f -> %.4f)" % (d["model"], d["strategy"], len(d["steps"]),
                                                                    d["loss_first"], d["loss_last"])


_FLAGS = {  # keyword -> flag of `piper train`
    "ranks": "--ranks", "steps": "--steps", "global_batch": "--global-batch", "seq": "--seq", "seed": "--seed",
    "lr": "--lr", "warmup": "--warmup", "threads": "--threads", "data": "--data", "trace": "--trace",
    "save": "--save", "save_every": "--save-every", "resume": "--resume", "calibration": "--calibration",
    "comm_calibration": "--comm-calibration", "ranks_per_node": "--ranks-per-node",
    "record_expert_loads": "--record-expert-loads", "expert_loads": "--expert-loads", "router_skew": "--router-skew",
}


def _model_arg(model, scratch):
    from . import Model
    if isinstance(model, Model):
        if model._source is not None:
            return model._source
        path = os.path.join(scratch, "model.json")  # a model built from a dict: the ranks read its JSON
        with open(path, "w") as f:
            json.dump(model.to_dict(), f)
        return path
    return os.fspath(model)


def _python_schedule_directives(model, strategy, seq, global_batch):
    """(directive list, mesh text, global batch) of a strategy whose schedule was registered from Python, for the
    runtime (target cpu-runtime): the list `piper compile --target cpu-runtime --emit-directives` would write."""
    from . import Directives, Strategy
    from .schedules import python_schedules
    try:
        s = strategy if isinstance(strategy, Strategy) else Strategy.parse(strategy)
    except Error:
        return None  # the CLI reports it, with its message
    if s.schedule not in python_schedules():
        return None
    options = {"seq": seq} if seq is not None else {}
    d = Directives.of_strategy(model, s, target="cpu-runtime", **options)
    batch = global_batch if global_batch is not None else s.dp * s.microbatches * s.mbs
    return d, batch


def _run(argv, timeout):
    p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    try:
        out = json.loads(p.stdout) if p.stdout.strip() else None
    except json.JSONDecodeError:
        out = None
    if p.returncode != 0:
        if isinstance(out, dict) and "error" in out:
            err = out["error"]
            raise error_class(err.get("code", ""))(err.get("message", ""))
        lines = [l[len("piper: error: "):] for l in p.stderr.splitlines() if l.startswith("piper: error: ")]
        raise Error(lines[-1] if lines else "piper train exited with status %d: %s" % (p.returncode,
                                                                                     p.stderr.strip()[-2000:]))
    if not isinstance(out, dict) or "steps" not in out:
        raise error_class("INTERNAL")("piper train printed no JSON result: %s" % p.stdout[-2000:])
    return out


def train(model="tiny-moe", strategy=None, *, directives=None, mesh=None, ranks=None, steps=20, global_batch=None,
          seq=None, seed=None, lr=None, warmup=None, threads=None, data=None, trace=None, save=None,
          save_every=None, resume=None, calibration=None, comm_calibration=None, ranks_per_node=None,
          record_expert_loads=None, expert_loads=None, router_skew=None, migrate=False, timeout=None):
    """`piper train --json`: trains `model` on `ranks` local MPI ranks (mpirun starts them; 1 or None: this
    machine's one rank, as the CLI) for `steps` steps and returns a TrainResult (``.losses``, the summary).

    ``strategy``: a string or piper.Strategy (its schedule may be one registered from Python); or ``directives``:
    a piper.Directives (its mesh, or ``mesh=``) or a directive file with ``mesh``. The other keywords are the
    command's flags (``global_batch`` is --global-batch, ...). ``timeout`` (seconds) stops a run that takes longer
    (subprocess.TimeoutExpired)."""
    from . import Directives, Strategy, _as_model
    with tempfile.TemporaryDirectory(prefix="piper-train-") as scratch:
        argv = [executable(), "train", "--json", "--model", _model_arg(model, scratch)]
        if strategy is not None and directives is None:
            py = _python_schedule_directives(_as_model(model), strategy, seq, global_batch)
            if py is not None:
                directives, global_batch = py
                strategy = None
        if isinstance(directives, Directives):
            mesh = mesh or directives.mesh
            directives = directives.save(os.path.join(scratch, "directives.json"))
        if strategy is not None:
            argv += ["--strategy", str(strategy)]
        if directives is not None:
            argv += ["--directives", os.fspath(directives)]
        if mesh is not None:
            argv += ["--mesh", str(mesh)]
        values = dict(ranks=ranks, steps=steps, global_batch=global_batch, seq=seq, seed=seed, lr=lr, warmup=warmup,
                      threads=threads, data=data, trace=trace, save=save, save_every=save_every, resume=resume,
                      calibration=calibration, comm_calibration=comm_calibration, ranks_per_node=ranks_per_node,
                      record_expert_loads=record_expert_loads, expert_loads=expert_loads, router_skew=router_skew)
        for key, value in values.items():
            if value is not None:
                argv += [_FLAGS[key], os.fspath(value) if hasattr(value, "__fspath__") else str(value)]
        if migrate:
            argv.append("--migrate")
        return TrainResult(_run(argv, timeout), argv)
