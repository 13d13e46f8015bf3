"""deploy/dev.py's help: `--help`, and each command's `--help`, exit 0 and start nothing; an unknown command or
services action is an error that names the commands."""

import subprocess
import sys

import pytest

from tests.embedded_support import ROOT


def dev(*args, tmp_path):
    data = tmp_path / "data"  # a command that started anything would make its data folder here
    done = subprocess.run([sys.executable, str(ROOT / "deploy" / "dev.py"), *args], capture_output=True, text=True,
                          timeout=30, env={"PATH": "/usr/bin:/bin", "EMBED_DATA": str(data)}, cwd=ROOT)
    assert not data.exists(), f"{args} made the data folder: it started something"
    return done


@pytest.mark.parametrize("args", [["--help"], ["-h"], ["help"], ["help", "run"], ["run", "--help"], ["run", "-h"],
                                  ["test", "--help"], ["manage", "--help"], ["seed", "--help"],
                                  ["bench", "--http", "--help"], ["bench", "--tools", "--help"],
                                  ["bench", "--agents", "--help"],
                                  ["chaos", "--help"], ["services", "--help"],
                                  ["info", "--help"], ["tool-server", "--help"]])
def test_it_answers_help_with_exit_0_and_starts_nothing(args, tmp_path):
    done = dev(*args, tmp_path=tmp_path)

    assert done.returncode == 0, done.stderr
    assert "python3.11 deploy/dev.py" in done.stdout and done.stderr == ""


@pytest.mark.parametrize("args, says", [(["frobnicate"], "unknown command 'frobnicate'"),
                                        (["services", "restart"], "services takes start, stop or status")])
def test_it_refuses_an_unknown_command_naming_the_commands(args, says, tmp_path):
    done = dev(*args, tmp_path=tmp_path)

    assert done.returncode == 2 and says in done.stderr and "The commands: run, test, manage" in done.stderr


def test_it_prints_the_usage_and_exits_2_without_a_command(tmp_path):
    done = dev(tmp_path=tmp_path)

    assert done.returncode == 2 and "python3.11 deploy/dev.py run" in done.stderr


def test_it_says_how_to_sign_in_on_demand_without_starting_anything(tmp_path):
    done = dev("info", tmp_path=tmp_path)

    assert done.returncode == 0, done.stderr
    assert "Admin:     http://127.0.0.1:8000/admin/   user 'admin'" in done.stdout
    assert "MCP:       http://127.0.0.1:8000/mcp" in done.stdout
