"""Ray Tune sweeps: every trial's Ray worker trains with this package's trainers.

imitation's ``parallel`` script imports ray. The default suite's tests run it in
a fresh interpreter on stand-in ray modules (no Ray needed); the sweeps below
them run real Ray trials and skip where ray is not installed.
"""

import csv
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

import imitation_accum
from imitation_accum.integrations import patching

REPO = pathlib.Path(__file__).resolve().parents[2]

# Stand-in ray modules, enough for imitation's parallel script to import; its
# ray.tune.run calls the test's function (``RUN``) with the trainable.
STAND_IN_RAY = """
import sys, types

class StandIn(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return lambda *args, **kwargs: None

for name in ("ray", "ray.tune", "ray.tune.search", "ray.tune.search.optuna"):
    sys.modules[name] = StandIn(name)
sys.modules["ray"].tune = sys.modules["ray.tune"]
sys.modules["ray.tune"].search = sys.modules["ray.tune.search"]
sys.modules["ray.tune"].run = lambda trainable, **kwargs: RUN(trainable, **kwargs)
"""


def run_python(code: str, stand_in_ray: bool = True) -> str:
    """Runs ``code`` in a fresh interpreter (stand-in ray first); returns stdout."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO / "src"), str(REPO)]))
    prelude = STAND_IN_RAY if stand_in_ray else ""
    done = subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    return done.stdout


@pytest.fixture(autouse=True)
def _unpatched():
    assert not patching.is_patched()
    yield
    imitation_accum.unpatch()


def test_a_patching_trial_patches_its_process_before_the_trainable_runs():
    calls = []

    def trainable(config, reporter):
        calls.append((config, reporter, patching.is_patched()))
        return {"result": 1}

    def make_trainable(sacred_ex_name, run_name, named_configs, config_updates):
        assert (sacred_ex_name, run_name) == ("train_adversarial", "sweep")
        return trainable

    trial = patching.patching_trials(make_trainable)(
        "train_adversarial", "sweep", [], {}
    )
    assert not patching.is_patched()
    assert trial({"config_updates": {}}, "reporter") == {"result": 1}
    assert calls == [({"config_updates": {}}, "reporter", True)]


def test_patch_reaches_imitation_parallel_imported_before_or_after():
    output = run_python(
        """
        import importlib
        import sys
        import imitation_accum

        def factory():
            return sys.modules["imitation.scripts.parallel"]._ray_tune_sacred_wrapper

        def patching(wrapper):
            return wrapper.__code__.co_filename.endswith("patching.py")

        imitation_accum.patch()
        from imitation.scripts import parallel  # imported after patching
        assert patching(factory()), factory()
        original = factory().__wrapped__
        assert original.__code__.co_filename == parallel.__file__
        imitation_accum.unpatch()
        assert factory() is original
        imitation_accum.patch()  # imported before patching
        assert patching(factory()) and factory().__wrapped__ is original
        imitation_accum.unpatch()
        assert factory() is original
        del sys.modules["imitation.scripts.parallel"]
        parallel = importlib.import_module(parallel.__name__)  # again, unpatched
        assert factory().__code__.co_filename == parallel.__file__, factory()
        print("ok")
        """
    )
    assert output.strip() == "ok"


def test_this_package_s_parallel_experiment_dispatches_to_its_experiments():
    # The experiment's run swaps in package_trials over the patching trials; a
    # trial of train_preference_comparisons sees this package's experiment under
    # imitation's name while it runs; train_rl's trainable is imitation's.
    output = run_python(
        """
        import imitation_accum
        from imitation.scripts import parallel as imitation_parallel
        from imitation.scripts import train_preference_comparisons as script
        from imitation_accum.scripts import parallel
        from imitation_accum.scripts import train_preference_comparisons as ours

        original = imitation_parallel._ray_tune_sacred_wrapper
        seen = {}

        def RUN(trainable, **kwargs):
            factory = imitation_parallel._ray_tune_sacred_wrapper
            seen["package"] = factory.__code__.co_filename == parallel.__file__
            seen["patching"] = factory.__wrapped__.__code__.co_filename.endswith(
                "patching.py"
            )
            seen["imitation"] = factory.__wrapped__.__wrapped__ is original
            seen["metric"] = kwargs["metric"]
            return "analysis"

        run = parallel.parallel_ex.run(
            config_updates={
                "sacred_ex_name": "train_preference_comparisons",
                "init_kwargs": {"num_cpus": 1},
            }
        )
        assert run.status == "COMPLETED" and run.result == "analysis", run.result
        assert seen == {
            "package": True,
            "patching": True,
            "imitation": True,
            "metric": "imit_stats/monitor_return_mean",
        }, seen
        assert imitation_parallel._ray_tune_sacred_wrapper is original
        assert not imitation_accum.integrations.patching.is_patched()

        inside = []
        imitation_trainable = object()

        def make_trainable(sacred_ex_name, *args):
            if sacred_ex_name == "train_rl":
                return imitation_trainable
            def trainable(config, reporter):
                inside.append(script.train_preference_comparisons_ex)
                return {}
            return trainable

        make = parallel.package_trials(make_trainable)
        make("train_preference_comparisons", "sweep", [], {})({}, None)
        assert inside == [ours.train_preference_comparisons_ex], inside
        assert script.train_preference_comparisons_ex is not inside[0]
        assert make("train_rl", "sweep", [], {}) is imitation_trainable
        print("ok")
        """
    )
    assert output.strip() == "ok"


def test_without_ray_the_experiment_says_how_to_install_it():
    output = run_python(
        """
        import sys
        sys.modules["ray"] = None  # as if not installed
        try:
            import imitation_accum.scripts.parallel
        except ModuleNotFoundError as error:
            print(error)
        """,
        stand_in_ray=False,
    )
    assert "pip install 'imitation-accum[ray]'" in output


# --- real Ray trials (skipped without ray) -------------------------------------


def _progress_rows(root: pathlib.Path):
    rows = []
    for path in sorted(root.rglob("progress.csv")):
        if path.parent.name != "log":  # imitation's raw/ sub-logs
            continue
        with open(path) as f:
            rows.append(list(csv.DictReader(f)))
    return rows


RAY = "ray is an optional extra: pip install 'imitation-accum[ray]'"
#: One Ray CPU, one trial at a time; no dashboard.
ONE_CPU = {
    "init_kwargs": {"num_cpus": 1, "include_dashboard": False},
    "resources_per_trial": {"cpu": 1},
}
#: The package's ``fast`` run's trainer: 5 pairs in batches of 4 and 1.
TRAINER = {"batch_size": 4, "progress_bar": False, "forward_size": 4}


def final_chunks_per_step(log_root: pathlib.Path):
    """Per trial's run directory: its last ``chunks_per_step``."""
    return sorted(
        float(rows[-1]["reward/final/train/chunks_per_step"])
        for rows in _progress_rows(log_root)
    )


@pytest.mark.expensive
def test_sweep_over_minibatch_size_trains_with_this_package_trainer(tmp_path):
    tune = pytest.importorskip("ray.tune", reason=RAY)
    from imitation_accum.scripts import parallel

    search = {"minibatch_size": tune.grid_search([1, 2]), **TRAINER}
    run = parallel.parallel_ex.run(
        config_updates={
            "sacred_ex_name": "train_preference_comparisons",
            "base_named_configs": ["fast"],
            "base_config_updates": {
                "logging.log_root": str(tmp_path / "runs"),
                "logging.log_format_strs": ["csv"],
            },
            "search_space": {"config_updates": {"reward_trainer_kwargs": search}},
            "tune_run_kwargs": {"storage_path": str(tmp_path / "ray_results")},
            **ONE_CPU,
        }
    )
    assert run.status == "COMPLETED"
    # Only this package's trainer logs minibatches per step: (4 + 1) / 2 with
    # minibatch_size 1, (2 + 1) / 2 with 2.
    assert final_chunks_per_step(tmp_path / "runs") == [1.5, 2.5]


@pytest.mark.expensive
def test_imitation_parallel_under_patch_trains_with_this_package_trainer(tmp_path):
    pytest.importorskip("ray.tune", reason=RAY)
    from imitation.scripts import parallel as imitation_parallel

    fast = ["environment.fast", "rl.fast", "policy_evaluation.fast", "fast"]
    trainer = {"epochs": 1, "minibatch_size": 2, **TRAINER}
    with imitation_accum.patched():
        run = imitation_parallel.parallel_ex.run(
            config_updates={
                "sacred_ex_name": "train_preference_comparisons",
                "base_named_configs": ["cartpole", *fast],
                "base_config_updates": {
                    "logging.log_root": str(tmp_path / "runs"),
                    "logging.log_format_strs": ["csv"],
                },
                "search_space": {"config_updates": {"reward_trainer_kwargs": trainer}},
                "tune_run_kwargs": {"storage_path": str(tmp_path / "ray_results")},
                **ONE_CPU,
            }
        )
    assert run.status == "COMPLETED"
    # imitation's trainer logs no minibatches per step: the Ray worker's trainer
    # was this package's, accumulating minibatches of 2 pairs.
    (value,) = final_chunks_per_step(tmp_path / "runs")
    assert 1 < value <= 2
