"""Schedules written in Python and registered by name: simulate, compile, plan and train use them."""
import importlib.util
import os

import pytest

import piper
from conftest import SOURCE_DIR


def load_example(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(SOURCE_DIR, "examples", "python", name + ".py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def gpipe(p):
    d = piper.Directives()
    for r in range(p.pp):
        d.place({"stage": r}, rank=r)
    for r in range(p.pp):
        d.order(r, [piper.action(r, "F", m) for m in range(p.microbatches)] +
                [piper.action(r, "BW", m) for m in range(p.microbatches)])
    return d


def reversed_gpipe(p):
    # Backwards in reverse microbatch order: not any built-in's list.
    d = gpipe(p).to_list()
    for o in d[p.pp:]:
        o["slots"] = o["slots"][:p.microbatches] + o["slots"][p.microbatches:][::-1]
    return d


@pytest.fixture(scope="module", autouse=True)
def registered():
    piper.register_schedule("py-gpipe", gpipe)
    piper.register_schedule("py-rgpipe", reversed_gpipe, help="gpipe, backwards last-in first-out")
    piper.register_schedule("py-dualpipev", load_example("dualpipev").dualpipev, stages_per_rank=2)


@pytest.mark.parametrize("pp,m", [(1, 1), (2, 4), (4, 5)])
def test_python_gpipe_emits_the_built_in_directives(pp, m):
    assert piper.schedule_directives("py-gpipe", pp, m) == piper.schedule_directives("gpipe", pp, m)


@pytest.mark.parametrize("pp", [1, 2, 3, 4])
def test_python_dualpipev_emits_the_built_in_directives(pp):
    for m in (2 * pp, 2 * pp + 1, 3 * pp + 2):
        assert piper.schedule_directives("py-dualpipev", pp, m) == piper.schedule_directives("dualpipev", pp, m)


def test_registered_names_are_strategy_schedules(tiny):
    assert {"py-gpipe", "py-rgpipe", "py-dualpipev"} <= set(piper.python_schedules())
    s = piper.Strategy.parse("pp=2,schedule=py-rgpipe,microbatches=4")
    assert s.schedule == "py-rgpipe" and piper.Strategy.parse(str(s)) == s


def test_simulate_and_compile_use_the_python_schedule(tiny):
    cluster = piper.Cluster.preset("local-cpu", nodes=1)
    builtin = piper.simulate(tiny, cluster, "pp=2,schedule=gpipe,microbatches=4", seq=128)
    same = piper.simulate(tiny, cluster, "pp=2,schedule=py-gpipe,microbatches=4", seq=128)
    assert same.step_time_s == builtin.step_time_s
    c = piper.compile(tiny, "pp=2,schedule=py-rgpipe,microbatches=4", seq=128)
    assert c.world_size == 2 and c.instructions > 0
    v = piper.simulate(tiny, cluster, "pp=2,schedule=py-dualpipev,microbatches=4", seq=128)
    assert v.step_time_s == piper.simulate(tiny, cluster, "pp=2,schedule=dualpipev,microbatches=4", seq=128).step_time_s


def test_plan_searches_a_python_schedule(h100):
    p = piper.plan("tiny-moe", h100, seq=128, global_batch=8, schedules=["py-rgpipe"], top=2, threads=2,
                   simulate_top=2, local_search=0)
    assert p.plans and all("schedule=py-rgpipe" in q.strategy for q in p.plans)
    assert p.plans[0].verified


def test_train_runs_a_python_schedule_on_the_ranks(tiny):
    # The ranks are other processes: they compile the directive file the function's rows were written to.
    reference = piper.train(tiny, "pp=2,schedule=gpipe,microbatches=2,mbs=1", ranks=2, steps=2, seq=32)
    mine = piper.train(tiny, "pp=2,schedule=py-rgpipe,microbatches=2,mbs=1", ranks=2, steps=2, seq=32)
    assert mine.strategy != reference.strategy or mine.plan_hash != reference.plan_hash
    assert mine.losses == pytest.approx(reference.losses, rel=1e-5)  # same maths, another order of backwards


def test_errors_of_a_python_schedule(tiny):
    with pytest.raises(piper.InvalidArgument, match="built-in schedule"):
        piper.register_schedule("dualpipev", gpipe)
    with pytest.raises(ValueError, match="stages_per_rank"):
        piper.register_schedule("py-bad", gpipe, stages_per_rank=0)

    def raises(p):
        raise RuntimeError("no schedule for pp=%d" % p.pp)

    piper.register_schedule("py-raises", raises)
    with pytest.raises(piper.InvalidArgument, match="RuntimeError: no schedule for pp=2"):
        piper.compile(tiny, "pp=2,schedule=py-raises,microbatches=2", seq=128)
    piper.register_schedule("py-split", lambda p: piper.Directives().split(2))
    with pytest.raises(piper.InvalidArgument, match="'split' directive"):
        piper.compile(tiny, "pp=2,schedule=py-split,microbatches=2", seq=128)
    with pytest.raises(piper.InvalidArgument, match="microbatches >= 2\\*pp"):
        piper.compile(tiny, "pp=2,schedule=py-dualpipev,microbatches=2", seq=128)
