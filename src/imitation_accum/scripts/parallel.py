r"""Ray Tune sweeps whose trials train with this package's trainers.

imitation's ``parallel`` experiment, with its config and named configs
(``sacred_ex_name``, ``search_space``, ``base_named_configs``,
``base_config_updates``, ``num_samples``, ``repeat``, ``init_kwargs`` for
``ray.init``, ``resources_per_trial``, ``tune_run_kwargs``). Each trial runs in a
Ray worker, which patches imitation first (:func:`imitation_accum.patch`). A trial
of ``train_preference_comparisons`` or ``train_adversarial`` runs this package's
experiment of that name (its named configs, checks and added keys), any other
imitation's own. So a search over ``reward_trainer_kwargs.minibatch_size`` or
``algorithm_kwargs.memory_budget`` reaches this package's trainers::

    python -m imitation_accum.scripts.parallel with \
        sacred_ex_name=train_preference_comparisons 'base_named_configs=["fast"]' \
        'search_space={"config_updates": {"reward_trainer_kwargs": \
            {"minibatch_size": {"grid_search": [2, 4]}}}}' \
        'init_kwargs={"num_cpus": 2}' 'resources_per_trial={"cpu": 1}'

On a Ray cluster (``ray start --head`` on one machine, ``ray start
--address=HEAD:6379`` on the others, this package installed on each), add
``'init_kwargs={"address": "auto"}'``; see docs/patching.md. Needs Ray:
``pip install 'imitation-accum[ray]'``.
"""

import contextlib
import functools
import importlib
from typing import Any, Callable, Dict, Iterator

from imitation_accum.scripts import experiment

try:
    from imitation.scripts import parallel as imitation_parallel
except ModuleNotFoundError as error:  # imitation's script imports ray
    if (error.name or "").split(".")[0] != "ray":
        raise
    raise ModuleNotFoundError(
        f"{__name__} runs Ray Tune sweeps and needs Ray: "
        "pip install 'imitation-accum[ray]'",
        name=error.name,
    ) from error

parallel_ex = experiment.derive(
    imitation_parallel.parallel_ex, doc=__doc__, run_directories=False
)
# Passed whole to Ray and to the trials' experiments, which check them: sacred's
# "Added new config entry" warnings for their entries are dropped.
parallel_ex.own_sections.extend(
    [
        "base_config_updates",
        "search_space",
        "init_kwargs",
        "resources_per_trial",
        "tune_run_kwargs",
    ]
)
#: imitation's experiments that a trial runs as this package's experiment of the
#: same name (``<name>_ex`` in ``imitation_accum.scripts.<name>``).
EXPERIMENTS = ("train_preference_comparisons", "train_adversarial")


def package_trials(make_trainable: Callable[..., Any]) -> Callable[..., Any]:
    """Wraps imitation's ``_ray_tune_sacred_wrapper`` to run this package's experiments.

    A trial of an experiment of :data:`EXPERIMENTS` runs this package's experiment
    of that name in its Ray worker; other trials are ``make_trainable``'s.

    Args:
        make_trainable: imitation's function (or one wrapping it): the trial's
            experiment name, run name, base named configs and config updates in,
            a Ray Tune function trainable ``(config, reporter)`` out.

    Returns:
        A function of the same arguments.
    """

    @functools.wraps(make_trainable)
    def make(sacred_ex_name: str, *args: Any, **kwargs: Any) -> Callable[..., Any]:
        trainable = make_trainable(sacred_ex_name, *args, **kwargs)
        if sacred_ex_name not in EXPERIMENTS:
            return trainable

        # imitation's trainable takes a Ray reporter and ignores it; current Ray
        # calls a trainable with the config alone, so the reporter is optional.
        def trial(config: Dict[str, Any], reporter: Any = None) -> Any:
            # imitation's trainable takes the experiment from its script's module
            # when it runs: that name is this package's experiment meanwhile.
            name = f"{sacred_ex_name}_ex"
            script = importlib.import_module(f"imitation.scripts.{sacred_ex_name}")
            ours = importlib.import_module(f"imitation_accum.scripts.{sacred_ex_name}")
            upstream = getattr(script, name)
            setattr(script, name, getattr(ours, name))
            try:
                return trainable(config, reporter)
            finally:
                setattr(script, name, upstream)

        return trial

    return make


@contextlib.contextmanager
def _trials_of_this_package() -> Iterator[None]:
    # imitation's parallel main builds its trainable when it runs (already
    # patching its workers: this experiment runs patched).
    make_trainable = imitation_parallel._ray_tune_sacred_wrapper
    imitation_parallel._ray_tune_sacred_wrapper = package_trials(make_trainable)
    try:
        yield
    finally:
        imitation_parallel._ray_tune_sacred_wrapper = make_trainable


@parallel_ex.pre_run_hook
def run_this_package_experiments() -> None:
    """Trials of :data:`EXPERIMENTS` run this package's experiments."""
    parallel_ex.hold_while_running(_trials_of_this_package())


def main_console() -> None:
    """The command line; runs are recorded under ``output/sacred/parallel/``."""
    experiment.main_console(parallel_ex)


if __name__ == "__main__":  # pragma: no cover
    main_console()
