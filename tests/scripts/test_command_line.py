"""The experiments' command lines: run directories and sacred records, as imitation."""

import json
import pathlib
import re
import subprocess
import sys

import pytest

from tests.scripts import helpers
from tests.scripts.test_train_adversarial import local_demos

TIMEOUT_S = 600


def run_command_line(cwd: pathlib.Path, module: str, *args: str) -> str:
    command = [sys.executable, "-m", f"imitation_accum.scripts.{module}", *args]
    return helpers.run_command(cwd, command, TIMEOUT_S)


def check_records(cwd: pathlib.Path, output: str, experiment: str) -> pathlib.Path:
    """One run directory, said at the start and the end, and one sacred record."""
    run_dirs = re.findall(r"Run directory: (\S+)", output)
    assert len(run_dirs) == 2 and run_dirs[0] == run_dirs[1], output[-3000:]
    run_dir = pathlib.Path(run_dirs[0])
    assert run_dir.is_relative_to(cwd / "output")
    assert (run_dir / "config.json").is_file()
    record = cwd / "output" / "sacred" / experiment / "1"
    assert f"Sacred run record: {record}" in output
    assert json.loads((record / "run.json").read_text())["status"] == "COMPLETED"
    assert (record / "config.json").is_file()
    return run_dir


def test_preference_comparisons_command_line(tmp_path):
    output = run_command_line(
        tmp_path,
        "train_preference_comparisons",
        "with",
        "fast",
        "reward_trainer_kwargs.minibatch_size=2",
        "reward_trainer_kwargs.progress_bar=False",
    )
    run_dir = check_records(tmp_path, output, "train_preference_comparisons")
    assert (run_dir / "checkpoints" / "final" / "reward_net.pt").is_file()


@pytest.mark.parametrize("algorithm", ["airl", "gail"])
def test_adversarial_command_line(tmp_path, algorithm):
    demos = local_demos(tmp_path, "seals/CartPole-v0")
    output = run_command_line(
        tmp_path,
        "train_adversarial",
        algorithm,
        "with",
        "fast",
        "demonstrations.source=local",
        f"demonstrations.path={demos['path']}",
        "algorithm_kwargs.demo_minibatch_size=3",
    )
    run_dir = check_records(tmp_path, output, "train_adversarial")
    assert (run_dir / "checkpoints" / "final" / "reward_train.pt").is_file()


@pytest.mark.parametrize(
    ("module", "arguments", "expected"),
    [
        ("train_adversarial", ["--help"], "imitation's AIRL/GAIL experiment"),
        ("train_adversarial", ["airl", "--help"], "Trains AIRL (imitation_accum.AIRL)"),
        ("train_adversarial", ["gail", "-h"], "Trains GAIL (imitation_accum.GAIL)"),
        (
            "train_preference_comparisons",
            ["--help"],
            "imitation's preference-comparisons experiment, training with this",
        ),
        ("train_reward_model", ["--help"], "Trains a reward net offline"),
        ("train_reward_model", ["print_config"], "collective_timeout_s = 600.0"),
    ],
)
def test_help_and_print_config_exit_zero(tmp_path, module, arguments, expected):
    done = subprocess.run(
        [sys.executable, "-m", f"imitation_accum.scripts.{module}", *arguments],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-2000:]
    assert expected in done.stdout
    assert "dummy" not in done.stdout and "No command found" not in done.stdout
    if arguments == ["--help"]:
        assert f"python -m imitation_accum.scripts.{module} COMMAND" in done.stdout
