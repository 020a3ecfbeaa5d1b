"""The command line starts the environment workers' forkserver only to run."""

import sys

import pytest

from imitation_accum.scripts import experiment
from imitation_accum.scripts.train_adversarial import train_adversarial_ex


@pytest.mark.parametrize(
    ("words", "runs"),
    [
        ([], True),
        (["with", "fast"], True),
        (["airl", "with", "fast", "total_timesteps=10"], True),
        (["airl", "with", "help=1"], True),  # a config value, not --help
        (["print_config"], False),
        (["print_config", "with", "fast"], False),
        (["print_named_configs"], False),
        (["save_config", "with", "fast"], False),
        (["--help"], False),
        (["airl", "-h"], False),
    ],
)
def test_only_a_run_of_the_experiment_starts_workers(words, runs):
    argv = ["train_adversarial.py", *words]
    assert experiment.runs_main_or_own_command(argv) is runs


def test_print_config_starts_no_forkserver(monkeypatch, capsys):
    started = []
    monkeypatch.setattr(experiment, "workers_ignore_ctrl_c", lambda: started.append(1))
    argv = ["train_adversarial.py", "print_config", "with", "fast"]
    monkeypatch.setattr(sys, "argv", argv)
    experiment.main_console(train_adversarial_ex, observe=False)
    assert started == []
    assert "demonstrations" in capsys.readouterr().out
