#!/usr/bin/env bash
# The CUDA path measured and checked in one run of at most about six minutes.
#
# 1. experiments/gpu_bench.py: one table, CnnRewardNet on 84x84x4 frames: the
#    preference step (128 pairs of 25 steps, minibatches of 16/32/128 pairs) and
#    the GAIL discriminator step (1024 rows, minibatches of 256/512/1024): a bare
#    loop over device-resident frames, the same loop copying from the host, this
#    package's default, each `acceleration` option, bf16, and all together;
#    frames/s, time per step, max_memory_allocated. Rows not started within
#    --bench-time-limit seconds (default 150) are listed as not run.
# 2. experiments/bench_memory.py --device cuda --check: peak memory
#    (torch.cuda.max_memory_allocated) against minibatch_size and memory_budget for
#    CnnRewardNet on 210x160x3 frames; fails unless every budget holds, every step
#    stays within its estimate and the peak is linear in the chunk size.
# 3. A real CUDA out-of-memory error (PyTorch capped at 3 GiB): the trainer halves
#    the chunk and redoes the step, and the result equals an uninterrupted run
#    with the final plan; at one transition it stops with a clear error.
# 4. Two passes are exact on the GPU (TF32 off); bfloat16 and float16 (GradScaler)
#    train and agree with float32 within their precision.
#
# It needs torch with CUDA and nothing else installed: the package is read from
# src/, and the pure-Python wheels of its dependencies (imitation, SB3, gymnasium,
# seals, sacred and theirs) from .wheels/ (ignored by git), which
#     experiments/gpu_check.sh --fetch-wheels
# fills on a machine with a package index; on the GPU machine they are installed
# into a temporary folder when `import imitation` fails.
#
# Usage (from anywhere):
#     experiments/gpu_check.sh [--out-dir DIR]     # default: docs/results
#     experiments/gpu_check.sh --quick   # any machine; default: output/experiments
# Exit status 0 and "GPU CHECK PASSED" when everything holds. Results land in
# DIR/gpu_bench_cuda.{md,json}, DIR/memory_cuda.{md,json,png} and
# DIR/gpu_check_cuda.md (the checks' lines).
# Without --out-dir, DIR is docs/results (the committed tables) and, with --quick,
# output/experiments (ignored by git), both at the repository root; a relative DIR
# is taken from the current directory; DIR may also come as the one positional
# argument (as before).
#
# --device cpu runs the same steps on the CPU: step 2 against the resident set
# size, step 3 with the out-of-memory error simulated (a forward hook raises
# torch.OutOfMemoryError for calls with gradient above a size), step 4 without
# float16 (CUDA only). Files: DIR/gpu_bench_cpu.*, DIR/memory_cpu.*,
# DIR/gpu_check_cpu.md.
# --quick checks that the script runs, in seconds: the table at tiny sizes
# (gpu_bench.py --quick), the benchmark's memory series at tiny sizes
# (bench_memory.py --quick --series minibatch,budget: no time target) and, on the
# CPU, steps 3 and 4 on tiny datasets; without --device it takes the CPU when
# there is no CUDA GPU. Its figures mean little.
set -euo pipefail
command="experiments/gpu_check.sh${*:+ $*}"
out=
device=
quick=0
bench_limit=150
fetch_wheels=0
while [ $# -gt 0 ]; do
  case $1 in
    --out-dir) out=$2; shift 2 ;;
    --out-dir=*) out=${1#*=}; shift ;;
    --device) device=$2; shift 2 ;;
    --device=*) device=${1#*=}; shift ;;
    --quick) quick=1; shift ;;
    --bench-time-limit) bench_limit=$2; shift 2 ;;
    --fetch-wheels) fetch_wheels=1; shift ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) echo "gpu_check.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) out=$1; shift ;;
  esac
done
case $out in
  "")  # in the repository, below; a quick run leaves the committed tables alone
    if [ "$quick" = 1 ]; then out=output/experiments; else out=docs/results; fi ;;
  /*) ;;
  *) out="$PWD/$out" ;;
esac
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
python=${PYTHON:-python3}

# Pure-Python wheels (or cp312 manylinux ones) of what torch's CUDA image lacks.
wheels=.wheels
if [ "$fetch_wheels" = 1 ]; then
  mkdir -p "$wheels"
  "$python" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$wheels" imitation==1.0.1 stable-baselines3==2.2.1 gymnasium==0.29.1 \
    farama-notifications==0.0.6 seals==0.2.1 sacred==0.8.7 docopt-ng==0.9.0 \
    jsonpickle==4.1.4 munch==4.0.0 GitPython==3.2.1 gitdb==4.0.12 smmap==5.0.3
  ls "$wheels"
  exit 0
fi
needed='import imitation, stable_baselines3, gymnasium, seals'
if ! "$python" -c "$needed" 2>/dev/null && ls "$wheels"/*.whl >/dev/null 2>&1; then
  site=${TMPDIR:-/tmp}/imitation_accum_site
  "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --upgrade --target "$site" "$wheels"/*.whl
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"

has_cuda='import torch, sys; sys.exit(0 if torch.cuda.is_available() else "no CUDA GPU")'
if [ -z "$device" ]; then
  device=cuda
  if [ "$quick" = 1 ] && ! "$python" -c "$has_cuda" 2>/dev/null; then
    device=cpu
    echo "no CUDA GPU: --quick checks on the CPU"
  fi
fi
case $device in
  cuda)
    "$python" -c "$has_cuda"
    "$python" -c 'import torch; print(torch.__version__, torch.cuda.get_device_name(0))'
    ;;
  cpu) "$python" -c 'import torch; print(torch.__version__, "cpu")' ;;
  *) echo "gpu_check.sh: --device must be cuda or cpu, not $device" >&2; exit 2 ;;
esac
mkdir -p "$out"

start=$SECONDS
table_status=0
table_args=(--device "$device" --time-limit-s "$bench_limit" --out-dir "$out")
if [ "$quick" = 1 ]; then table_args+=(--quick); fi
"$python" experiments/gpu_bench.py "${table_args[@]}" || table_status=$?
echo "table: $((SECONDS - start)) s, status $table_status"

bench_status=0
if [ "$quick" = 1 ]; then
  # Its --check leaves out the time target: the time series can go too.
  sizes=(--quick --series minibatch,budget)
else
  sizes=(--fewer-points --fragment-length 50 --series minibatch,budget)
fi
"$python" experiments/bench_memory.py --device "$device" --check "${sizes[@]}" \
  --out "$out/memory_$device" || bench_status=$?
echo "bench: $((SECONDS - start)) s, status $bench_status"

"$python" - "$device" "$quick" "$out/gpu_check_$device.md" "$command" <<'EOF'
import copy
import sys

import gymnasium as gym
import numpy as np
import torch as th
from imitation.algorithms import preference_comparisons as pc
from imitation.rewards.reward_nets import CnnRewardNet
from imitation.util import logger as imit_logger

sys.path.insert(0, "experiments")
import _results  # noqa: E402
from bench_memory import SHAPE, make_dataset  # noqa: E402

from imitation_accum import CrossEntropyRewardTrainer  # noqa: E402

_, device_name, quick, report_path, command = sys.argv
quick = quick == "1"
th.backends.cudnn.allow_tf32 = False
th.backends.cuda.matmul.allow_tf32 = False
th.backends.cudnn.deterministic = True
th.backends.cudnn.benchmark = False
device = th.device(device_name)
cuda = device.type == "cuda"
space = gym.spaces.Box(0, 255, SHAPE, np.uint8)
failures = []
lines = []


def check(ok, what):
    lines.append(("ok   " if ok else "FAIL ") + what)
    print(lines[-1])
    if not ok:
        failures.append(what)


def skip(what):
    lines.append("skip " + what)
    print(lines[-1])


class OutOfMemoryAbove:
    """On a CPU, a forward hook: OutOfMemoryError for calls with grad above limit.

    It raises after the forward, as a real error would come part-way through.
    """

    def __init__(self, limit):
        self.limit = limit

    def __call__(self, module, args, output):
        if th.is_grad_enabled() and len(args[0]) > self.limit:
            raise th.OutOfMemoryError(
                f"out of memory (simulated): {len(args[0])} transitions in one "
                f"call, more than {self.limit}"
            )


def make_net(**kwargs):
    th.manual_seed(0)
    return CnnRewardNet(space, gym.spaces.Discrete(6), **kwargs).to(device)


def trainer_for(net, **kwargs):
    kwargs.setdefault("optimizer_cls", th.optim.SGD)
    return CrossEntropyRewardTrainer(
        pc.PreferenceModel(net),
        pc.CrossEntropyRewardLoss(),
        np.random.default_rng(0),
        custom_logger=imit_logger.configure(format_strs=[]),
        progress_bar=False,
        **kwargs,
    )


def flat(tensors):
    return th.cat([t.detach().reshape(-1).double() for t in tensors])


def rel(a, b):
    a, b = flat(a), flat(b)
    return float((a - b).norm() / b.norm().clamp(min=1e-30))


def grads(net):
    return [p.grad.clone() for p in net.parameters()]


# 3. A real out-of-memory error, halved away -----------------------------------
# CUDA: 400 transitions, about 7 GiB in one chunk, PyTorch capped at 3 GiB. CPU:
# the error simulated above 8 transitions per call.
n_pairs, length = (2, 5) if quick and not cuda else (4, 50)
dataset = make_dataset(n_pairs, length)
n_transitions = 2 * n_pairs * length
net = make_net()
initial = copy.deepcopy(net)
if cuda:
    th.cuda.empty_cache()
    total = th.cuda.get_device_properties(device).total_memory
    th.cuda.set_per_process_memory_fraction(3 * 2**30 / total)
else:
    net.register_forward_hook(OutOfMemoryAbove(8))
trainer = trainer_for(net, batch_size=n_pairs, forward_size=1000, lr=0.01)
trainer.train(dataset)
cap = trainer.planner.chunk_cap
logged = trainer.logger.name_to_value
print(
    f"after out-of-memory errors: chunks of at most {cap} transitions, two passes "
    f"{logged['reward/final/train/two_pass']}"
)
check(
    cap is not None and cap < n_transitions,
    f"an out-of-memory error halved the chunk ({n_transitions} to {cap})",
)
replay = copy.deepcopy(initial)
uninterrupted = trainer_for(replay, batch_size=n_pairs, forward_size=1000, lr=0.01)
uninterrupted.planner.backed_off_cap = cap  # the final plan from the start
uninterrupted.train(dataset)
start = list(initial.parameters())
update = [p - q for p, q in zip(net.parameters(), start)]
expected = [p - q for p, q in zip(replay.parameters(), start)]
error = rel(update, expected)
check(error < 1e-5, f"redone step equals an uninterrupted one (rel. error {error:.2e})")
oom_net = make_net()
if cuda:
    th.cuda.empty_cache()
    allocated = th.cuda.memory_allocated(device)
    th.cuda.set_per_process_memory_fraction((allocated + 8 * 2**20) / total)
else:
    oom_net.register_forward_hook(OutOfMemoryAbove(0))
try:
    trainer_for(oom_net, batch_size=n_pairs, forward_size=1000).train(dataset)
    check(False, "stops with a clear error at one transition")
except th.OutOfMemoryError as oom:
    check("one transition" in str(oom), "stops with a clear error at one transition")
if cuda:
    th.cuda.set_per_process_memory_fraction(1.0)
    th.cuda.empty_cache()

# 4. Two passes exact; bfloat16 and float16 ------------------------------------
n_pairs, length, call = (2, 4, 3) if quick and not cuda else (4, 30, 7)
dataset = make_dataset(n_pairs, length)
onednn = th.backends.mkldnn.enabled
if not cuda:
    # As TF32 on CUDA (off above): oneDNN's convolutions pick their algorithm by
    # batch size, and chunked gradients then differ from the whole batch's by
    # about 1e-3 (relative); PyTorch's own CPU convolutions agree to about 1e-6.
    th.backends.mkldnn.enabled = False
reference = make_net(dropout_prob=0.0)
trainer_for(reference, batch_size=n_pairs, forward_size=1000, lr=1e-9).train(dataset)
full = grads(reference)
for kwargs in (dict(two_pass=True, forward_size=call), dict(minibatch_size=1)):
    net = make_net()
    trainer_for(net, batch_size=n_pairs, lr=1e-9, **kwargs).train(dataset)
    error = rel(grads(net), full)
    # float32 round-off of sums over 210x160 pixels: about 1e-5
    check(error < 1e-4, f"{kwargs}: full-batch gradient (rel. error {error:.2e})")
th.backends.mkldnn.enabled = onednn  # bfloat16 on a CPU needs it to be quick
for dtype, tolerance in (("bfloat16", 3e-2), ("float16", 5e-3)):
    if dtype == "float16" and not cuda:
        skip("float16: CUDA only")
        continue
    net = make_net()
    trainer = trainer_for(
        net, batch_size=n_pairs, minibatch_size=2, lr=1e-9, autocast_dtype=dtype
    )
    trainer.train(dataset)
    error = rel(grads(net), full)
    logged = trainer.logger.name_to_value
    scale = logged.get("reward/final/train/amp_loss_scale")
    check(error < tolerance, f"{dtype}: gradient within {tolerance} ({error:.2e}), "
          f"loss scale {scale}")
with open(report_path, "w") as report:
    report.write(
        f"gpu_check.sh checks 3 and 4 on {device_name}"
        f"{' (--quick: tiny datasets)' if quick and not cuda else ''}:\n\n"
    )
    report.write("".join(f"    {line}\n" for line in lines))
    report.write(
        "\n" + _results.made_by(device_name, command=command.replace("`", "'")) + "\n"
    )
print(f"wrote {report_path}")
if failures:
    sys.exit(f"{len(failures)} GPU check(s) failed")
EOF
if [ "$table_status" -ne 0 ]; then
  echo "GPU CHECK FAILED: rows of the table failed (see above)" >&2
  exit 1
fi
if [ "$bench_status" -ne 0 ]; then
  echo "GPU CHECK FAILED: the benchmark's targets (see above)" >&2
  exit 1
fi
if [ "$device" = cuda ]; then
  echo "GPU CHECK PASSED in $((SECONDS - start)) s"
else
  echo "CHECK PASSED on the CPU (no GPU figures) in $((SECONDS - start)) s"
fi
