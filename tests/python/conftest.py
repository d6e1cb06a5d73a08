"""Shared fixtures of the Python module's tests: run by CTest (python/CMakeLists.txt sets PYTHONPATH, PIPER_BIN
and PIPER_SOURCE_DIR), or by hand: PYTHONPATH=build/python python3 -m pytest tests/python."""
import json
import os
import subprocess
import sys

import pytest

SOURCE_DIR = os.environ.get("PIPER_SOURCE_DIR", os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))
PIPER_BIN = os.environ.get("PIPER_BIN", os.path.join(SOURCE_DIR, "build", "src", "cli", "piper"))
if "PYTHONPATH" not in os.environ:
    sys.path.insert(0, os.path.join(SOURCE_DIR, "build", "python"))


def run_cli(*args):
    """Runs the piper CLI; returns (exit code, stdout, stderr)."""
    p = subprocess.run([PIPER_BIN, *args], capture_output=True, text=True, timeout=120)
    return p.returncode, p.stdout, p.stderr


def cli_json(*args):
    rc, out, err = run_cli(*args, "--json")
    assert rc == 0, err
    return json.loads(out)


def cli_error(*args):
    """The message the CLI prints for a failing command (its stderr line after "piper: error: ")."""
    rc, _, err = run_cli(*args)
    assert rc != 0
    line = [l for l in err.splitlines() if l.startswith("piper: error: ")][0]
    return line[len("piper: error: "):]


@pytest.fixture(scope="session")
def tiny():
    import piper
    return piper.Model.preset("tiny-moe")


@pytest.fixture(scope="session")
def h100():
    import piper
    return piper.Cluster.preset("dgx-h100", nodes=1)
