"""The directive builder writes exactly the JSON the C++ reads and emits (docs/directives.md)."""
import pytest

import piper
from piper import _core

# One strategy per built-in schedule on tiny-moe (4 layers, 8 experts), plus tp, ZeRO and recomputation variants.
SCHEDULES = {
    "gpipe": "pp=2,schedule=gpipe,microbatches=4",
    "1f1b": "dp=2,pp=2,ep=2,zero=1,schedule=1f1b,microbatches=4",
    "interleaved": "pp=2,vpp=2,schedule=interleaved,microbatches=4",
    "zb-h1": "pp=2,schedule=zb-h1,microbatches=4",
    "dualpipev": "pp=2,schedule=dualpipev,microbatches=4",
    "af-pipe": "dp=2,ep=2,pp=1,schedule=af-pipe,disagg=1,attn_ranks=2,ffn_ranks=2,microbatches=2,mbs=1",
}
VARIANTS = ["tp=2,pp=2,sp=1,schedule=1f1b,microbatches=4", "dp=2,ep=2,zero=3,recompute=full,microbatches=2"]


def test_every_built_in_schedule_is_covered():
    # (schedules registered from Python by other tests are not built-ins)
    assert sorted(SCHEDULES) == sorted(set(_core.schedule_names()) - set(piper.python_schedules()))


@pytest.mark.parametrize("strategy", list(SCHEDULES.values()) + VARIANTS)
@pytest.mark.parametrize("target", ["megatron", "cpu-runtime"])
def test_builder_json_equals_the_cpp_emitter(tiny, strategy, target):
    emitted = _core.strategy_directives(tiny._spec, {"strategy": strategy, "seq": 128, "target": target})
    built = piper.Directives.of_strategy(tiny, strategy, target=target, seq=128)
    assert built.to_list() == emitted["directives"]
    # The C++ reader reads the builder's JSON and writes it back unchanged.
    assert built.check() == built.to_list()


@pytest.mark.parametrize("strategy", list(SCHEDULES.values()))
def test_builder_directives_compile_and_simulate_as_the_strategy(tiny, h100, strategy):
    built = piper.Directives.of_strategy(tiny, strategy, seq=128)
    by_strategy = piper.compile(tiny, strategy, seq=128)
    by_builder = built.compile(tiny, seq=128)
    assert by_builder.instructions == by_strategy.instructions
    assert by_builder.templates == by_strategy.templates
    world = by_strategy.world_size
    cluster = piper.Cluster.preset("local-cpu", nodes=1) if world != 8 else h100
    if cluster.world_size == world:
        sim = built.simulate(tiny, cluster, seq=128)
        assert sim.recognised
        assert sim.step_time_s == piper.simulate(tiny, cluster, strategy, seq=128).step_time_s


def test_hand_written_gpipe_equals_the_cpp_emitter(tiny):
    # GPipe on 2 pipeline ranks, written with the builder's methods from scratch (no C++ output read).
    d = piper.Directives(pp=2)
    d.split(2)
    d.place(layer=(0, 1), stage=0).place(layer=(2, 3), stage=1)
    for s in range(2):
        d.place({"stage": s}, rank=s)  # the filter's stage is a dict key; stage= is the directive's field
    for r in range(2):
        d.order(r, [piper.action(r, "F", m) for m in range(2)] + [piper.action(r, "BW", m) for m in range(2)])
    emitted = _core.strategy_directives(tiny._spec, {"strategy": "pp=2,schedule=gpipe,microbatches=2",
                                                     "seq": 128})["directives"]
    assert d.to_list() == emitted
    report = d.compile(tiny, seq=128)
    assert report.instructions == piper.compile(tiny, "pp=2,schedule=gpipe,microbatches=2", seq=128).instructions


def test_filters_and_slots_are_written_as_the_cpp_writes_them():
    d = piper.Directives(mesh="pp=2")
    d.order(0, [{"stage": 0, "mb": 3, "pass": "F"}, [piper.action(0, "F", 1), {"stage": (0, 1), "pass": "B"}]])
    d.shard(part="experts", axis="ep", algorithm="halo")
    assert d.to_list() == [
        {"directive": "order", "rank": 0, "stream": "compute", "slots": ["0F3", ["0F1", {"stage": "0-1", "pass": "B"}]]},
        {"directive": "shard", "filter": {"part": "experts"}, "axis": "ep", "algorithm": "halo",
         "sequence_parallel": False}]
    assert d.check() == d.to_list()


def test_unverifiable_directives_raise_the_cli_message(tiny, tmp_path):
    from conftest import cli_error
    # Rank 0 runs microbatch 1's forward before microbatch 0's backward needs... an order that deadlocks: each rank
    # waits for the other (rank 0's backward of mb 0 before its forward of mb 0 was consumed by rank 1).
    d = piper.Directives(pp=2)
    d.split(1)
    d.place(layer=(0, 1), stage=0).place(layer=(2, 3), stage=1)
    d.place(part="embed", stage=0).place(part="head", stage=1)
    d.place(stage=0, rank=0).place(stage=1, rank=1)
    d.order(0, ["0BW0", "0F0"])
    d.order(1, ["1F0", "1BW0"])
    path = d.save(tmp_path / "deadlock.json")
    with pytest.raises(piper.Error) as e:
        d.compile(tiny, seq=128)
    expected = cli_error("compile", "--model", "tiny-moe", "--seq", "128", "--directives", str(path), "--mesh", "pp=2")
    assert str(e.value) == expected.replace(str(path), "<python directives>")


def test_bad_directive_field_raises_the_reader_message():
    d = piper.Directives(pp=1).split(0)
    with pytest.raises(piper.InvalidArgument) as e:
        d.check()
    assert "microbatches" in str(e.value)
