"""What a reward trainer prints: a line per train() call, the budget line once."""

import numpy as np

from tests import reference as ref
from tests.test_memory import budget_for
from tests.test_preference_exactness import make_net, make_trainer


def test_a_long_phase_prints_one_line(capsys):
    # imitation's first phase runs epochs * initial_epoch_multiplier epochs.
    dataset = ref.make_dataset(np.random.default_rng(0), 4, (3,))
    trainer = make_trainer(make_net(), batch_size=4, forward_size=4, progress_bar=True)
    trainer.train(dataset, epoch_multiplier=20)
    lines = [line for line in capsys.readouterr().out.splitlines() if line]
    assert [line.split(":")[0] for line in lines] == [
        "reward model, 20 epochs of 1 step"
    ]


def test_the_budget_line_is_printed_when_it_changes(capsys):
    # An offline run calls train() once per epoch.
    dataset = ref.make_dataset(np.random.default_rng(0), 4, (5,))
    net = make_net()
    trainer = make_trainer(net, batch_size=4, memory_budget=budget_for(net, dataset, 7))
    for _ in range(3):
        trainer.train(dataset)
    assert capsys.readouterr().out.count("memory_budget:") == 1
    trainer.batch_size = 2  # a smaller largest batch: the line changes
    trainer.train(dataset)
    assert capsys.readouterr().out.count("memory_budget:") == 1
