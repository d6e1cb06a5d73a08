"""`cmake --install` puts a package that imports and runs outside the build tree."""
import os
import shutil
import subprocess
import sys

import pytest

from conftest import SOURCE_DIR

BINARY_DIR = os.environ.get("PIPER_BINARY_DIR", os.path.join(SOURCE_DIR, "build"))


@pytest.mark.skipif(shutil.which("cmake") is None, reason="cmake not on PATH")
def test_cmake_install_then_import(tmp_path):
    p = subprocess.run(["cmake", "--install", BINARY_DIR, "--prefix", str(tmp_path)], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    site = tmp_path / "lib" / "python3" / "dist-packages"
    assert (site / "piper" / "__init__.py").is_file()
    code = ("import piper; assert piper.__file__.startswith(%r), piper.__file__; "
            "print(piper.Strategy.parse('dp=2,ep=2').ep)" % str(site))
    env = dict(os.environ, PYTHONPATH=str(site))
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=tmp_path, env=env)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "2"
    # piper.train of the installed package runs the installed executable.
    code = "import piper.training as t; print(t.executable())"
    env = {k: v for k, v in env.items() if k != "PIPER_BIN"}
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=tmp_path, env=env)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == str(tmp_path / "bin" / "piper")
