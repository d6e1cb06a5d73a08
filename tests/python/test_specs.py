"""piper.Model, piper.Cluster, piper.Strategy: the C++ loaders and parser from Python."""
import json
import os

import pytest

import piper
from conftest import SOURCE_DIR, cli_error, cli_json


def test_model_preset_matches_cli_info():
    m = piper.Model.preset("deepseek-v3")
    assert m.name == "deepseek-v3"
    assert m.to_dict() == cli_json("info", "--model", "deepseek-v3")["model"]


def test_model_from_hf_config_path_and_dict_agree():
    path = os.path.join(SOURCE_DIR, "tests", "data", "hf", "mixtral-8x22b", "config.json")
    from_path = piper.Model.from_hf_config(path)
    with open(path) as f:
        config = json.load(f)
    from_dict = piper.Model.from_hf_config(config, name=from_path.name)
    assert from_dict.to_dict() == from_path.to_dict()
    assert from_path.to_dict()["num_layers"] == 56
    assert from_path.to_dict() == cli_json("info", "--model", path)["model"]


def test_cluster_preset():
    c = piper.Cluster.preset("dgx-h100", nodes=2)
    assert (c.name, c.nodes, c.world_size) == ("dgx-h100", 2, 16)
    assert c.to_dict()["name"] == "dgx-h100"


def test_cluster_nodes_out_of_range_is_the_cli_message():
    with pytest.raises(piper.InvalidArgument) as e:
        piper.Cluster.preset("dgx-h100", nodes=0)
    assert str(e.value) in cli_error("estimate", "--model", "tiny-moe", "--cluster", "dgx-h100", "--nodes", "0",
                                     "--strategy", "dp=8")


def test_strategy_attributes_and_round_trip():
    s = piper.Strategy.parse("dp=8,pp=4,ep=8,schedule=1f1b,microbatches=16")
    assert (s.dp, s.pp, s.ep, s.schedule, s.microbatches) == (8, 4, 8, "1f1b", 16)
    assert piper.Strategy.parse(str(s)) == s
    assert str(piper.Strategy.parse(str(s))) == str(s)
    assert piper.Strategy(dp=8, pp=4, ep=8, schedule="1f1b", microbatches=16) == s
    assert s.replace(pp=2).pp == 2 and s.pp == 4
    assert s.to_dict()["zero"] == s.zero
    with pytest.raises(AttributeError):
        s.pp = 2
    with pytest.raises(AttributeError):
        s.no_such_key


def test_unknown_preset_is_not_found():
    with pytest.raises(piper.NotFound) as e:
        piper.Model.preset("no-such-model")
    assert isinstance(e.value, piper.Error)
    assert str(e.value) == cli_error("info", "--model", "no-such-model")
