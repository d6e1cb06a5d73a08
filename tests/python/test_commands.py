"""piper.estimate / simulate / plan / compile: the same results as `piper <command> --json`, and the CLI's errors."""
import json
import os

import pytest

import piper
from conftest import cli_error, cli_json

STRATEGY = "dp=4,pp=2,ep=4,schedule=1f1b,microbatches=4,mbs=1"
SCENARIO = ["--model", "tiny-moe", "--cluster", "dgx-h100", "--nodes", "1", "--seq", "128"]
# Wall-clock fields differ between two runs of the same command.
WALL = {"compile_seconds", "step_seconds", "compile_s", "search_time_s", "verify_time_s", "simulate_time_s"}


def without_wall(d):
    if isinstance(d, dict):
        return {k: without_wall(v) for k, v in d.items() if k not in WALL and not k.endswith("_wall_s")}
    if isinstance(d, list):
        return [without_wall(v) for v in d]
    return d


def test_estimate_equals_cli(tiny, h100):
    e = piper.estimate(tiny, h100, piper.Strategy.parse(STRATEGY), seq=128)
    assert e.to_dict() == cli_json("estimate", *SCENARIO, "--strategy", STRATEGY)
    assert e.kind == "estimate"
    assert e.step_time_s > 0 and e.step_time_s == e["step_time_s"]
    assert e.strategy.pp == 2


def test_estimate_takes_preset_names(tiny, h100):
    by_name = piper.estimate("tiny-moe", "dgx-h100", STRATEGY, seq=128)
    assert by_name == piper.estimate(tiny, h100, STRATEGY, seq=128)


def test_simulate_equals_cli_and_writes_trace(tiny, h100, tmp_path):
    trace = tmp_path / "step.json"
    r = piper.simulate(tiny, h100, STRATEGY, seq=128, trace=trace)
    cli = cli_json("simulate", *SCENARIO, "--strategy", STRATEGY)
    assert without_wall(r.to_dict()) == without_wall(cli) | {"trace": str(trace)}
    with open(trace) as f:
        events = json.load(f)
    events = events["traceEvents"] if isinstance(events, dict) else events
    assert any(ev.get("ph") == "X" for ev in events)


def test_plan_equals_cli():
    args = ["--model", "tiny-moe", "--cluster", "dgx-h100", "--nodes", "1", "--seq", "128", "--global-batch", "8",
            "--schedules", "1f1b", "--top", "2", "--threads", "2", "--simulate-top", "0", "--local-search", "0"]
    p = piper.plan("tiny-moe", "dgx-h100", seq=128, global_batch=8, schedules="1f1b", top=2, threads=2,
                   simulate_top=0, local_search=0)
    cli = cli_json("plan", *args)
    assert without_wall(p.to_dict()) == without_wall(cli)
    assert str(p.best) == cli["plans"][0]["strategy"]
    assert isinstance(p.best, piper.Strategy)


def test_plan_without_the_rescore_bound_equals_cli():
    args = ["--model", "tiny-moe", "--cluster", "dgx-h100", "--nodes", "1", "--seq", "128", "--global-batch", "8",
            "--schedules", "1f1b", "--top", "2", "--threads", "2", "--simulate-top", "1", "--local-search", "2",
            "--no-rescore-bound"]
    p = piper.plan("tiny-moe", "dgx-h100", seq=128, global_batch=8, schedules="1f1b", top=2, threads=2,
                   simulate_top=1, local_search=2, rescore_bound=False)
    cli = cli_json("plan", *args)
    assert without_wall(p.to_dict()) == without_wall(cli)
    assert cli["search"]["local_search_ruled_out"] == 0 and cli["search"]["local_search_tried"] == 2


def test_compile_report_equals_cli(tiny):
    r = piper.compile(tiny, STRATEGY, seq=128, capacity_gib=80)
    cli = cli_json("compile", "--model", "tiny-moe", "--seq", "128", "--capacity-gib", "80", "--strategy", STRATEGY)
    assert without_wall(r.to_dict()) == without_wall(cli)
    assert r.world_size == 8 and r.instructions > 0 and r.templates[0].peak_bytes > 0


# One error path per family: each raises a piper.Error subclass whose message is the CLI's.

def test_bad_strategy_raises_the_cli_message(tiny, h100):
    with pytest.raises(piper.InvalidArgument) as e:
        piper.Strategy.parse("dp=8,pq=2")
    assert str(e.value) == cli_error("estimate", *SCENARIO, "--strategy", "dp=8,pq=2")
    with pytest.raises(piper.Error) as e:
        piper.estimate(tiny, h100, "dp=3,ep=2", seq=128)
    assert str(e.value) == cli_error("estimate", *SCENARIO, "--strategy", "dp=3,ep=2")


def test_bad_model_file_raises_the_cli_message(tmp_path):
    bad = tmp_path / "config.json"
    bad.write_text('{"model_type": "mixtral", "hidden_size": -4}')
    with pytest.raises(piper.Error) as e:
        piper.Model.from_hf_config(bad)
    assert str(e.value) == cli_error("info", "--model", str(bad))
    missing = tmp_path / "missing.json"
    with pytest.raises(piper.NotFound) as e:
        piper.Model.from_hf_config(missing)
    assert str(e.value) == cli_error("info", "--model", str(missing))


def test_bad_seq_raises_the_cli_message(tiny, h100):
    # A flag's range error: the CLI's line, less the pointer to `piper --help` it adds for flags.
    with pytest.raises(piper.InvalidArgument) as e:
        piper.estimate(tiny, h100, STRATEGY, seq=0)
    assert str(e.value) + " (see piper --help)" == cli_error("estimate", *SCENARIO[:-2], "--seq", "0", "--strategy",
                                                             STRATEGY)
    with pytest.raises(piper.InvalidArgument) as e:
        piper.estimate(tiny, h100, STRATEGY, seq=4096)
    assert str(e.value) == cli_error("estimate", *SCENARIO[:-2], "--seq", "4096", "--strategy", STRATEGY)


def test_plan_keyword_out_of_range_is_the_flag_message():
    with pytest.raises(piper.InvalidArgument) as e:
        piper.plan("tiny-moe", "dgx-h100", global_batch=8, seq=128, top=0)
    assert str(e.value) + " (see piper --help)" == cli_error("plan", "--model", "tiny-moe", "--cluster", "dgx-h100",
                                                             "--nodes", "1", "--global-batch", "8", "--top", "0")
    with pytest.raises(piper.InvalidArgument) as e:
        piper.compile("tiny-moe", STRATEGY, seq=128, capacity_gib=-1)
    assert str(e.value) + " (see piper --help)" == cli_error("compile", "--model", "tiny-moe", "--seq", "128",
                                                             "--strategy", STRATEGY, "--capacity-gib", "-1")


def test_nothing_fits_raises_the_cli_message():
    with pytest.raises(piper.ResourceExhausted) as e:
        piper.plan("deepseek-v3", "dgx-h100", global_batch=8, simulate_top=0, threads=2)
    assert str(e.value) == cli_error("plan", "--model", "deepseek-v3", "--cluster", "dgx-h100", "--nodes", "1",
                                     "--global-batch", "8", "--simulate-top", "0", "--threads", "2")


def test_error_does_not_poison_the_next_call(tiny, h100):
    for _ in range(3):
        with pytest.raises(piper.Error):
            piper.estimate(tiny, h100, "dp=3,ep=2", seq=128)
    assert piper.estimate(tiny, h100, STRATEGY, seq=128).step_time_s > 0


def test_long_calls_release_the_gil(tiny, h100):
    # While one thread is inside piper.plan (C++), another keeps running Python: with the GIL held it could not.
    import threading
    state = {"inside": False, "done": False, "ticks": 0}

    def worker():
        state["inside"] = True
        piper.plan(tiny, h100, seq=128, global_batch=8, top=3, threads=1, simulate_top=3, local_search=4)
        state["done"] = True

    t = threading.Thread(target=worker)
    t.start()
    while not state["inside"]:
        pass
    while not state["done"]:
        state["ticks"] += 1
    t.join()
    assert state["ticks"] > 1000


def test_domain_nodes_out_of_range_is_the_flag_message(tiny, h100):
    with pytest.raises(piper.InvalidArgument) as e:
        piper.estimate(tiny, h100, STRATEGY, seq=128, domain_nodes=0)
    assert str(e.value) + " (see piper --help)" == cli_error("estimate", *SCENARIO, "--strategy", STRATEGY,
                                                             "--domain-nodes", "0")


def test_estimate_of_a_file_with_its_own_schedule_is_unimplemented():
    # examples/v_shape.json is no strategy's directive list: the closed form refuses it as the CLI does.
    from conftest import SOURCE_DIR
    path = os.path.join(SOURCE_DIR, "examples", "v_shape.json")
    cluster = piper.Cluster.preset("local-cpu", nodes=1)
    with pytest.raises(piper.Unimplemented) as e:
        piper.estimate("tiny-moe", cluster, directives=path, mesh="pp=2,vpp=2", seq=16)
    assert str(e.value) == cli_error("estimate", "--model", "tiny-moe", "--cluster", "local-cpu", "--nodes", "1",
                                     "--seq", "16", "--directives", path, "--mesh", "pp=2,vpp=2")
    sim = piper.simulate("tiny-moe", cluster, directives=path, mesh="pp=2,vpp=2", seq=16)
    assert sim.recognised is False and sim.step_time_s > 0
    built = piper.Directives.load(path, mesh="pp=2,vpp=2")
    assert piper.simulate("tiny-moe", cluster, directives=built, seq=16).step_time_s == sim.step_time_s
