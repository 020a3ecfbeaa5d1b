"""AIRL/GAIL refuse a bad optimizer, logger or flag at construction, naming it."""

import logging

import numpy as np
import pytest
import torch as th

from imitation_accum.scripts import train_adversarial
from tests import adversarial_setup as setup
from tests.test_adversarial_exactness import ALGOS, make_net

BATCH = 8


@pytest.fixture(scope="module")
def venv():
    return setup.make_venv("CartPole-v1")


@pytest.fixture(scope="module")
def ppo(venv):
    return setup.small_ppo(venv)


@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"custom_logger": "x"}, TypeError, r"^custom_logger must be None or an"),
        ({"disc_opt_cls": "AdamW"}, TypeError, r"^disc_opt_cls .*torch\.optim\.AdamW"),
        ({"disc_opt_cls": 5}, TypeError, r"^disc_opt_cls must be a torch\.optim"),
        (
            {"disc_opt_cls": th.optim.Adam, "disc_opt_kwargs": {"betas": 5}},
            ValueError,
            r"^disc_opt_kwargs\.betas=5 refused by Adam: TypeError",
        ),
        (
            {"disc_opt_kwargs": {"lr": -1}},
            ValueError,
            r"^disc_opt_kwargs\.lr=-1 refused by SGD: .*learning rate",
        ),
        (
            {"disc_opt_kwargs": {"lr": 0.1, "betas": (0.9, 0.99)}},
            ValueError,
            r"^disc_opt_kwargs\.betas: SGD has no argument .betas.",
        ),
    ],
)
def test_constructor_names_a_bad_optimizer_or_logger(
    algo, kwargs, error, message, venv, ppo
):
    ours_cls, _ = ALGOS[algo]
    with pytest.raises(error, match=message):
        setup.make_trainer(
            ours_cls,
            make_net(algo, venv),
            venv=venv,
            gen_algo=ppo,
            demo_batch_size=BATCH,
            **kwargs,
        )


FLAGS = [
    "allow_variable_horizon",
    "init_tensorboard",
    "init_tensorboard_graph",
    "debug_use_ground_truth",
]


@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("flag", FLAGS)
@pytest.mark.parametrize("value", ["false", "True", 1, None])
def test_constructor_refuses_a_flag_that_is_not_a_bool(algo, flag, value, venv, ppo):
    # The same check as the config hook's, so both name the argument alike.
    ours_cls, _ = ALGOS[algo]
    with pytest.raises(
        TypeError, match=rf"^{flag} must be a bool \(True or False\), got"
    ):
        setup.make_trainer(
            ours_cls,
            make_net(algo, venv),
            venv=venv,
            gen_algo=ppo,
            demo_batch_size=BATCH,
            **{flag: value},
        )


@pytest.mark.parametrize("algo", ALGOS)
def test_constructor_takes_numpy_bools_as_bools(algo, venv, ppo):
    ours_cls, _ = ALGOS[algo]
    trainer = setup.make_trainer(
        ours_cls,
        make_net(algo, venv),
        venv=venv,
        gen_algo=ppo,
        demo_batch_size=BATCH,
        allow_variable_horizon=np.True_,
        debug_use_ground_truth=np.False_,
    )
    assert trainer.allow_variable_horizon is True
    assert trainer.debug_use_ground_truth is False


@pytest.mark.parametrize("algo", ALGOS)
def test_config_hook_names_the_key_the_default_optimizer_refuses(algo):
    config = {
        "algorithm_kwargs": {"demo_batch_size": BATCH, "disc_opt_kwargs": {"lr": -1}},
        "algorithm_specific": {},
    }
    # imitation's default discriminator optimizer is Adam.
    with pytest.raises(
        ValueError,
        match=r"^algorithm_kwargs\.disc_opt_kwargs\.lr=-1 refused by Adam",
    ):
        train_adversarial.check_algorithm_kwargs(
            config, algo.lower(), logging.getLogger(__name__)
        )


@pytest.mark.parametrize(
    ("name", "value", "error", "match"),
    [
        ("max_grad_norm", -1.0, ValueError, r"^max_grad_norm must be a positive"),
        ("memory_budget", "lots", ValueError, r"^memory_budget='lots' does not parse"),
        ("demo_minibatch_size", 2.5, TypeError, r"^demo_minibatch_size must be a"),
        ("acceleration", "all", TypeError, r"^acceleration must be an Acceleration"),
    ],
)
def test_a_setting_assigned_after_construction_is_checked_by_train_disc(
    name, value, error, match, venv, ppo
):
    # The constructor's check, run again on the attributes before any update.
    trainer = setup.make_trainer(
        ALGOS["GAIL"][0],
        make_net("GAIL", venv),
        venv=venv,
        gen_algo=ppo,
        demo_batch_size=BATCH,
    )
    before = setup.flat_params(trainer._reward_net)
    setattr(trainer, name, value)
    with pytest.raises(error, match=match):
        trainer.train_disc()
    assert np.array_equal(setup.flat_params(trainer._reward_net), before)
