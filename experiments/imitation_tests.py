"""imitation 1.0.1's own tests, run on imitation alone and under ``patch()``.

imitation's source distribution holds its tests; this runs, offline, its test
modules for preference comparisons and adversarial training and the
preference-comparison, adversarial, reward-loading and, where Ray is installed
(``pip install 'imitation-accum[ray]'``), parallel (Ray Tune) tests of its
scripts' module, twice, each in a fresh pytest process: upstream (imitation's
classes) and patched (``imitation_accum.patch()`` applied for the whole session,
and so in every Ray worker that runs a trial). It writes one table: per module,
the counts of each outcome in both runs, and every test that passes upstream but
not patched.

The tests' fixtures load two expert policies from the HuggingFace model hub,
which this machine cannot reach. This file is also the pytest plugin of both
runs (``-p imitation_tests``): it answers the hub's loader for those two models
only, with PPO policies trained here once by imitation's own ``train_rl``
experiment into ``--cache-dir`` (under a file lock), and every other model still
goes to the (offline) hub. pytest's cache, where imitation's fixtures keep the
experts' rollouts, lives there too. Both experts and the rollouts are made
before the runs start (:func:`warm_caches`), so neither run fills a cache inside
a test.

Usage::

    pip download imitation==1.0.1 --no-deps --no-binary :all: -d /tmp/sdist
    tar xzf /tmp/sdist/imitation-1.0.1.tar.gz -C /tmp/sdist
    python experiments/imitation_tests.py --imitation /tmp/sdist/imitation-1.0.1
    python experiments/imitation_tests.py --imitation DIR --quick   # a few tests
    python experiments/imitation_tests.py --imitation DIR --parallel-only  # Ray's

It writes ``imitation_tests.md`` to ``--out-dir`` (default: ``docs/results/``, or
``output/experiments/`` with ``--quick`` or ``--parallel-only``). The committed
table comes from the first command with ray installed (``pip install
'imitation-accum[ray]'``), so that its scripts' row includes the parallel tests.
"""

import argparse
import contextlib
import functools
import importlib.metadata
import os
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple
from xml.etree import ElementTree

import _results

EXPERIMENTS = Path(__file__).resolve().parent
#: Test modules of imitation's source tree, with the ``-k`` selection run of each
#: (``None``: all of it). Of the scripts' tests, the parallel ones (Ray Tune
#: sweeps of the other scripts' experiments) run only where ray is installed
#: (:func:`selections`).
MODULES: Dict[str, Any] = {
    "tests/algorithms/test_preference_comparisons.py": None,
    "tests/algorithms/test_adversarial.py": None,
    "tests/scripts/test_scripts.py": (
        "preference_comparisons or adversarial or transfer_learning"
        " or double_normalization or cnn_policy or test_parallel"
    ),
}
#: ``-k`` expression of the quick mode, which runs only the first two modules: a
#: handful of fast tests; test_adversarial.py's need the CartPole stand-in (see
#: :data:`EXPERTS`), trained on first use unless ``--cache-dir`` holds it.
QUICK = (
    "test_trainer_no_crash or test_gradient_accumulation or test_train_disc_no_crash"
)
#: The hub's models imitation's tests load -> the ``train_rl`` named config that
#: trains the stand-in and its config updates. ``seals_cartpole`` is imitation's
#: tuned PPO setting (100,000 steps). Only ``test_regression_gail_with_sac``
#: (GPU only, skipped on a CPU) takes Pendulum rollouts, which need a policy
#: that rolls out, not a good one: 2 of ``pendulum``'s 4096-step rollouts, not
#: 200,000 steps. A stand-in is trained when a test first asks for it.
EXPERTS: Dict[str, Tuple[str, Dict[str, Any]]] = {
    "HumanCompatibleAI/ppo-seals-CartPole-v0": ("seals_cartpole", {}),
    "HumanCompatibleAI/ppo-Pendulum-v1": ("pendulum", {"total_timesteps": 8192}),
}
DEFAULT_CACHE_DIR = _results.REPO_ROOT / "output" / "experiments" / "imitation_experts"
#: Environment variable by which the pytest runs learn the cache directory.
CACHE_ENV = "IMITATION_ACCUM_EXPERT_CACHE"


# Experts ----------------------------------------------------------------------


def expert_path(cache_dir: Path, repo_id: str) -> Path:
    """The stand-in for hub model ``repo_id``: a PPO ``model.zip``, trained once.

    Training runs imitation's ``train_rl`` experiment with the named config of
    :data:`EXPERTS`, seed 0, in a scratch folder of ``cache_dir``; the policy is
    then moved into place in one rename, under a file lock, so a concurrent run
    waits for it and an interrupted one leaves nothing that looks finished.
    """
    from filelock import FileLock

    named_config, updates = EXPERTS[repo_id]
    folder = cache_dir / repo_id.replace("/", "--")
    model = folder / "model.zip"
    folder.mkdir(parents=True, exist_ok=True)
    with FileLock(str(folder / "train.lock")):
        if model.is_file():
            return model
        from imitation.scripts.train_rl import train_rl_ex

        with tempfile.TemporaryDirectory(dir=folder) as scratch:
            run = train_rl_ex.run(
                named_configs=[named_config],
                config_updates=dict(
                    seed=0,
                    logging=dict(log_dir=scratch),
                    policy_save_interval=0,
                    rollout_save_final=False,
                    **updates,
                ),
            )
            if run.status != "COMPLETED":
                raise RuntimeError(f"training the stand-in for {repo_id}: {run.status}")
            os.replace(Path(scratch) / "policies" / "final" / "model.zip", model)
            (folder / "returns.txt").write_text(
                f"imitation train_rl {named_config} {updates}: {run.result}\n"
            )
    return model


def use_local_experts(cache_dir: Path) -> None:
    """Answers the hub's loader from :func:`expert_path` for :data:`EXPERTS` only.

    imitation's ``ppo-huggingface`` policies call ``huggingface_sb3.load_from_hub``
    through the module, so wrapping that one function redirects them; any other
    model goes to the real loader.
    """
    import huggingface_sb3

    hub_loader = huggingface_sb3.load_from_hub

    def load_from_hub(repo_id: str, filename: str) -> str:
        if repo_id in EXPERTS:
            return str(expert_path(cache_dir, repo_id))
        return hub_loader(repo_id, filename)

    huggingface_sb3.load_from_hub = load_from_hub


#: imitation's fixture that fills pytest's cache on first use: its folder under
#: pytest's ``cache_dir`` (``config.cache.makedir("experts")``), the environment
#: and the number of trajectories (tests/algorithms/conftest.py).
EXPERT_TRAJECTORIES = (Path("d") / "experts", "seals/CartPole-v0", 60)


def warm_caches(imitation: Path, cache_dir: Path) -> None:
    """Fills the caches both runs share before either starts, with imitation alone.

    Whichever run filled one lazily, inside a test, failed that test, upstream as
    patched: imitation's ``lazy_generate_expert_trajectories`` returns trajectories
    without ``infos`` when it generates them (``rollout.rollout`` drops them) and
    with them when it loads the cache, which ``test_trajectory_dataset_seeding``
    asserts; and a stand-in trained inside ``test_train_adversarial_sac`` ran
    ``train_rl`` as a sacred run within the test's, whose shared ``rl`` ingredient
    then held train_rl's config (PPO, 4,096 steps a round). Both runs now find
    every cache warm, as on a machine where imitation's tests ran before.
    """
    use_local_experts(cache_dir)
    for repo_id in EXPERTS:
        expert_path(cache_dir, repo_id)
    if (imitation / "tests" / "algorithms" / "conftest.py").is_file():
        import numpy as np
        import seals  # noqa: F401  (registers seals/CartPole-v0; training did)
        from imitation.testing import expert_trajectories

        folder, env_id, count = EXPERT_TRAJECTORIES
        expert_trajectories.lazy_generate_expert_trajectories(
            cache_dir / "pytest_cache" / folder, env_id, count, np.random.default_rng(0)
        )


def ray_version() -> Optional[str]:
    """The installed ray's version, or ``None`` if ray is not installed."""
    try:
        return importlib.metadata.version("ray")
    except importlib.metadata.PackageNotFoundError:
        return None


#: The module holding imitation's parallel tests, and their ``-k`` selection.
SCRIPTS = "tests/scripts/test_scripts.py"
PARALLEL = "test_parallel"


def selections(
    modules: List[str], ray: Optional[str], parallel_only: bool = False
) -> Dict[str, Optional[str]]:
    """The ``-k`` selection of each of ``modules`` (:data:`MODULES`').

    Without ray (``ray`` is ``None``) the tests that need it are left out; with
    ``parallel_only`` only imitation's parallel tests run.
    """
    if parallel_only:
        return {SCRIPTS: PARALLEL}
    chosen = {module: MODULES[module] for module in modules}
    if ray is None and chosen.get(SCRIPTS):
        chosen[SCRIPTS] = f"({chosen[SCRIPTS]}) and not parallel"
    return chosen


def stand_in_ray() -> None:
    """Puts empty ``ray`` modules in ``sys.modules`` when ray is not installed.

    imitation's scripts' test module imports ``ray.tune`` (for its parallel
    tests, deselected then) and ``imitation.scripts.parallel`` imports ray;
    without ray the whole module fails to collect. The stand-in's attributes are
    placeholders: anything that really uses ray fails.
    """
    try:
        import ray  # noqa: F401
    except ImportError:
        pass
    else:
        return

    class Placeholder(types.ModuleType):
        def __getattr__(self, name: str) -> Any:
            if name.startswith("__"):
                raise AttributeError(name)
            return lambda *args, **kwargs: None

    for name in ("ray", "ray.tune", "ray.tune.search", "ray.tune.search.optuna"):
        sys.modules[name] = Placeholder(name)
    sys.modules["ray"].tune = sys.modules["ray.tune"]  # type: ignore[attr-defined]
    sys.modules["ray.tune"].search = sys.modules["ray.tune.search"]  # type: ignore[attr-defined]


def experts_in_ray_workers() -> None:
    """Has ``ray.init`` give every Ray worker :func:`use_local_experts` too.

    imitation's parallel tests run their trials in Ray workers, which this plugin
    does not reach; an adversarial trial there generates demonstrations from the
    CartPole expert. ``ray.init`` gets a worker setup hook (Ray's
    ``runtime_env``) that answers the hub's loader there as here.
    """
    import ray

    init = ray.init

    @functools.wraps(init)
    def init_with_experts(*args: Any, **kwargs: Any) -> Any:
        runtime_env = dict(kwargs.get("runtime_env") or {})
        runtime_env.setdefault("worker_process_setup_hook", f"{__name__}.setup_worker")
        return init(*args, **{**kwargs, "runtime_env": runtime_env})

    ray.init = init_with_experts


def setup_worker() -> None:
    """A Ray worker's setup hook: the hub's loader answered as in the tests."""
    use_local_experts(Path(os.environ[CACHE_ENV]))


# The pytest plugin ------------------------------------------------------------


def pytest_addoption(parser: Any) -> None:
    """``--accum-patch``: apply ``imitation_accum.patch()`` for the session."""
    parser.addoption("--accum-patch", action="store_true", default=False)


def pytest_configure(config: Any) -> None:
    """Local experts (in Ray workers too), a stand-in ray if missing, patch()."""
    use_local_experts(Path(os.environ[CACHE_ENV]))
    if ray_version() is None:
        stand_in_ray()
    else:
        experts_in_ray_workers()
    if config.getoption("--accum-patch"):
        import imitation_accum

        imitation_accum.patch()


# The runs ---------------------------------------------------------------------


def command_line(
    chosen: Dict[str, Optional[str]],
    patched: bool,
    quick: bool,
    cache_dir: Path,
    report: Path,
) -> List[str]:
    """The pytest command line of one run: modules to ``-k`` selections."""
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "imitation_tests",
        "-o",
        "addopts=",
        "-o",
        f"cache_dir={cache_dir / 'pytest_cache'}",
        f"--junitxml={report}",
    ]
    if patched:
        command.append("--accum-patch")
    modules = list(chosen)
    if quick:
        return [*command, "-k", QUICK, *modules]
    if all(selection is None for selection in chosen.values()):
        return [*command, *modules]
    # One -k for all: each module's own selection, scoped by its file name.
    terms = [
        f"({Path(module).stem} and ({selection}))" if selection else Path(module).stem
        for module, selection in chosen.items()
    ]
    return [*command, "-k", " or ".join(terms), *modules]


Outcomes = Dict[str, str]


def run_both(
    imitation: Path,
    chosen: Dict[str, Optional[str]],
    quick: bool,
    cache_dir: Path,
    parallel_envs: bool = False,
) -> Dict[str, Tuple[Outcomes, Outcomes, float]]:
    """Runs ``chosen`` (module -> ``-k``) upstream and patched, side by side.

    Side by side because each is one process on one thread (imitation's conftest
    makes torch single-threaded): two halve the wall time on two cores.

    Without ``parallel_envs``, test_adversarial.py's trainers run on
    single-process environments only, as under imitation's coverage runs (its
    ``PARALLEL = [False] if IN_CODECOV``, keyed on ``COV_CORE_CONFIG``): the
    ``SubprocVecEnv`` half of its parametrised trainer tests starts worker
    processes per test and exercises the same discriminator code.

    Returns:
        Per mode (``upstream``, ``patched``): each test's outcome, the first line
        of each failure's or error's message, and the run's wall time in seconds.
    """
    path = [str(EXPERIMENTS), os.environ.get("PYTHONPATH", "")]
    env = dict(
        os.environ,
        HF_HUB_OFFLINE="1",
        PYTHONPATH=os.pathsep.join(p for p in path if p),
        **{CACHE_ENV: str(cache_dir)},
    )
    if not parallel_envs:
        env["COV_CORE_CONFIG"] = ""
    result: Dict[str, Tuple[Outcomes, Outcomes, float]] = {}
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as logs:
        started = {}
        for mode in ("upstream", "patched"):
            report, log = Path(tmp) / f"{mode}.xml", Path(tmp) / f"{mode}.log"
            command = command_line(chosen, mode == "patched", quick, cache_dir, report)
            process = subprocess.Popen(
                command,
                cwd=imitation,
                env=env,
                stdout=logs.enter_context(log.open("w")),
                stderr=subprocess.STDOUT,
            )
            started[mode] = (process, report, log, time.perf_counter())
        ended: Dict[str, float] = {}
        while len(ended) < len(started):
            for mode, (process, _, _, _) in started.items():
                if mode not in ended and process.poll() is not None:
                    ended[mode] = time.perf_counter()
            time.sleep(0.2)
        for mode, (process, report, log, start) in started.items():
            tail = log.read_text().splitlines()[-3:]
            print(f"{mode}:", *tail, sep="\n", flush=True)
            # pytest's exit codes 2-5: interrupted, internal or usage error, or
            # nothing collected; its counts would be empty, not a result.
            if process.returncode not in (0, 1) or not report.is_file():
                raise SystemExit(f"the {mode} run failed: {' / '.join(tail)}")
            result[mode] = (*outcomes(report), ended[mode] - start)
    return result


def outcomes(report: Path) -> Tuple[Outcomes, Outcomes]:
    """Each test's outcome and each failure's message, from a JUnit XML report.

    Returns:
        ``test id -> passed | failed | error | skipped``, and ``test id -> first
        line of its message`` for failures and errors.
    """
    result: Outcomes = {}
    messages: Outcomes = {}
    if not report.exists():
        return result, messages
    for case in ElementTree.parse(report).iter("testcase"):
        node = f"{case.get('classname')}::{case.get('name')}"
        kinds = {child.tag: child for child in case}
        for kind, outcome in (("error", "error"), ("failure", "failed")):
            if kind in kinds:
                result[node] = outcome
                message = kinds[kind].get("message") or ""
                messages[node] = (
                    message.strip().splitlines()[0][:300] if message else ""
                )
                break
        else:
            result[node] = "skipped" if "skipped" in kinds else "passed"
    return result, messages


def module_of(node: str, modules: List[str]) -> str:
    """The module of ``modules`` a JUnit test id (``tests.algorithms.x::y``) is in."""
    dotted = node.split("::", 1)[0]
    for module in modules:
        if dotted.startswith(module[: -len(".py")].replace("/", ".")):
            return module
    return "other"


def counts(results: Dict[str, str]) -> str:
    kinds = ("passed", "failed", "error", "skipped")
    return " / ".join(str(sum(v == k for v in results.values())) for k in kinds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--imitation", type=Path, required=True, help="sdist root")
    parser.add_argument("--quick", action="store_true", help="a few tests only")
    parser.add_argument(
        "--parallel-only",
        action="store_true",
        help=f"only test_scripts.py's {PARALLEL}* tests (Ray Tune sweeps; needs ray)",
    )
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=DEFAULT_CACHE_DIR,
        help="the stand-in experts and pytest's cache (default: %(default)s)",
    )
    parser.add_argument(
        "--parallel-envs",
        action="store_true",
        help="also test_adversarial.py's trainer tests on SubprocVecEnv (48 more)",
    )
    _results.add_out_dir(parser)
    args = parser.parse_args()
    if args.parallel_only and args.out_dir is None:  # a subset, as --quick
        args.out_dir = _results.default_out_dir(quick=True)
    out_dir = _results.resolve_out_dir(args)
    if not (args.imitation / "tests").is_dir():
        parser.error(f"--imitation: {args.imitation} has no tests/ folder")
    ray = ray_version()
    if args.parallel_only and ray is None:
        parser.error(
            "--parallel-only: ray is not installed (pip install 'imitation-accum[ray]')"
        )
    modules = [m for m in MODULES if (args.imitation / m).is_file()]
    if args.quick:
        modules = [m for m in modules if MODULES[m] is None]
    if args.parallel_only:
        modules = [m for m in modules if m == SCRIPTS]
    if not modules:
        parser.error(f"--imitation: {args.imitation} holds none of {list(MODULES)}")
    if ray is None:
        print(
            f"ray is not installed: {SCRIPTS}'s parallel tests are left out "
            "(pip install 'imitation-accum[ray]' runs them)",
            file=sys.stderr,
        )
    chosen = selections(modules, ray, args.parallel_only)
    cache_dir = args.cache_dir.resolve()
    warm_caches(args.imitation.resolve(), cache_dir)
    runs = run_both(
        args.imitation.resolve(), chosen, args.quick, cache_dir, args.parallel_envs
    )
    upstream, _, up_s = runs["upstream"]
    patched, reasons, patched_s = runs["patched"]
    rows: List[str] = []
    for module, selection in chosen.items():
        shown = f"`{module}`" + (f" (`-k {selection}`)" if selection else "")
        cells = [
            counts({n: o for n, o in mode.items() if module_of(n, modules) == module})
            for mode in (upstream, patched)
        ]
        rows.append(f"| {shown} | {cells[0]} | {cells[1]} |")
    regressions = [
        (node, patched.get(node, "not run"), reasons.get(node, ""))
        for node, outcome in upstream.items()
        if outcome == "passed" and patched.get(node) != "passed"
    ]
    lines = [
        "# imitation 1.0.1's tests, upstream and under `imitation_accum.patch()`",
        "",
        "Offline; the two hub experts are local stand-ins trained by imitation's "
        "`train_rl` (see `experiments/imitation_tests.py`); "
        + (
            f"imitation's parallel (Ray Tune) tests with ray {ray}, each trial's "
            "Ray worker patched"
            if ray
            else "imitation's parallel (Ray Tune) tests left out: ray is not installed"
        )
        + (
            "."
            if args.parallel_envs
            else "; test_adversarial.py's trainers on single-process environments "
            "only, as in imitation's coverage runs (without `--parallel-envs`)."
        ),
        "",
        "| module | upstream: passed / failed / error / skipped | patched: "
        "passed / failed / error / skipped |",
        "|---|---|---|",
        *rows,
        "",
        f"Wall time: upstream {up_s:.0f} s, patched {patched_s:.0f} s, one pytest "
        "process each, both at once (no xdist), on the machine named below, "
        "shared with other work.",
        "",
        f"Tests that pass upstream but not patched: {len(regressions)}",
        *[
            f"- `{node}`: {outcome}" + (f": {reason}" if reason else "")
            for node, outcome, reason in regressions
        ],
    ]
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "imitation_tests.md"
    path.write_text(_results.with_made_by("\n".join(lines)))
    print(path.read_text())


if __name__ == "__main__":
    main()
