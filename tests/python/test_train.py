"""piper.train: `piper train --json` on local MPI ranks, as Python objects (losses, summary), with the CLI's errors."""
import json
import re
import threading

import pytest

import piper
from conftest import cli_error, cli_json, run_cli

ARGS = dict(steps=3, seq=32)
CLI_ARGS = ["--steps", "3", "--seq", "32"]


def test_train_one_rank_equals_cli(tiny):
    r = piper.train(tiny, "microbatches=2,mbs=2", **ARGS)
    cli = cli_json("train", "--model", "tiny-moe", "--strategy", "microbatches=2,mbs=2", *CLI_ARGS)
    assert r.losses == [s["loss"] for s in cli["steps"]]
    assert len(r.losses) == 3 and r.loss_first == r.losses[0] and r.loss_last == r.losses[-1]
    assert r.strategy == cli["strategy"] and r.plan_hash == cli["plan_hash"]
    assert r.to_dict()["steps"][1]["step"] == 2
    assert r.peak_memory_bytes > 0


def test_train_two_ranks_strategy_object_and_directives_agree(tiny):
    s = piper.Strategy.parse("pp=2,schedule=gpipe,microbatches=2,mbs=1")
    by_strategy = piper.train("tiny-moe", s, ranks=2, steps=2, seq=32)
    assert by_strategy.ranks == 2
    # The same strategy written as directives (the cpu-runtime target's list), trained from the builder.
    d = piper.Directives.of_strategy(tiny, s, target="cpu-runtime", seq=32)
    by_directives = piper.train(tiny, directives=d, ranks=2, steps=2, seq=32)
    assert by_directives.losses == by_strategy.losses


@pytest.mark.parametrize("strategy", ["dp=2,pq=1", "dp=3,ep=2"])
def test_bad_strategy_raises_the_cli_message(strategy):
    with pytest.raises(piper.InvalidArgument) as e:
        piper.train("tiny-moe", strategy, ranks=2, steps=1, seq=32)
    assert str(e.value) == cli_error("train", "--model", "tiny-moe", "--strategy", strategy, "--ranks", "2",
                                     "--steps", "1", "--seq", "32")


def test_bad_model_file_raises_the_cli_message(tmp_path):
    bad = tmp_path / "model.json"
    bad.write_text("{\"num_layers\": 2")
    with pytest.raises(piper.Error) as e:
        piper.train(str(bad), steps=1)
    assert str(e.value) == cli_error("train", "--model", str(bad), "--steps", "1")


def test_unverifiable_directives_raise_the_cli_message(tiny, tmp_path):
    d = piper.Directives(pp=2).split(2)
    d.place(layer=(0, 1), stage=0).place(layer=(2, 3), stage=1)
    d.place({"stage": 0}, rank=0).place({"stage": 1}, rank=1)
    d.order(0, ["0BW0", "0BW1", "0F0", "0F1"])  # backwards ordered before their own forwards: cannot run
    d.order(1, ["1F0", "1F1", "1BW0", "1BW1"])
    path = d.save(tmp_path / "bad.json")
    with pytest.raises(piper.Error) as e:
        piper.train(tiny, directives=path, mesh="pp=2", ranks=2, steps=1, seq=32, timeout=120)
    # The job's line: the one `piper train --json` reports in its error object and prints last (each rank's own
    # line comes before it).
    args = ["train", "--model", "tiny-moe", "--directives", str(path), "--mesh", "pp=2", "--ranks", "2", "--steps",
            "1", "--seq", "32"]
    def any_rank(message):  # every rank fails to compile; which one reports first varies from run to run
        return re.sub(r"rank \d+", "rank N", message)

    rc, out, err = run_cli(*args, "--json")
    assert rc != 0 and any_rank(str(e.value)) == any_rank(json.loads(out)["error"]["message"])
    _, _, err = run_cli(*args)
    assert any_rank(err.splitlines()[-1]) == any_rank("piper: error: " + str(e.value))
    assert "the 2-rank job failed" in str(e.value) and "the graph has a cycle" in str(e.value)
    with pytest.raises(piper.Error):  # the builder's list, written to a scratch file, fails the same way
        piper.train(tiny, directives=d, ranks=2, steps=1, seq=32, timeout=120)


def test_train_releases_the_gil(tiny):
    state = {"done": False, "ticks": 0}

    def worker():
        piper.train(tiny, "microbatches=2,mbs=2", **ARGS)
        state["done"] = True

    t = threading.Thread(target=worker)
    t.start()
    while not state["done"]:
        state["ticks"] += 1
    t.join()
    assert state["ticks"] > 1000


def test_missing_executable_is_not_found(monkeypatch):
    from piper import training
    monkeypatch.setenv("PIPER_BIN", "/nonexistent/piper")
    monkeypatch.setattr(training, "_build_info", None)
    monkeypatch.setattr(training.shutil, "which", lambda name: None)
    with pytest.raises(piper.NotFound, match="no piper executable"):
        piper.train("tiny-moe", steps=1)


def test_a_model_built_in_python_reaches_the_ranks(tiny):
    # A Model from a dict has no file: piper.train writes its JSON for the ranks; same weights, same losses.
    import json
    copy = piper.Model(piper._core.model_from_text(json.dumps(tiny.to_dict()), "tiny-copy", "dict"))
    assert copy._source is None
    assert piper.train(copy, "microbatches=2,mbs=2", steps=2, seq=32).losses == \
        piper.train(tiny, "microbatches=2,mbs=2", steps=2, seq=32).losses
