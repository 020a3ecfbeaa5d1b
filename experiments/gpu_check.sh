#!/usr/bin/env bash
# Memory planning on a CUDA GPU, self-checking, in under five minutes.
#
# 1. experiments/bench_memory.py --device cuda --check: peak memory
#    (torch.cuda.max_memory_allocated) against minibatch_size and memory_budget for
#    CnnRewardNet on 210x160x3 frames, one pass against two passes; fails unless
#    every budget holds, every step stays within its estimate, the peak is linear
#    in the chunk size and two passes cost at most 1.5x one pass.
# 2. A real CUDA out-of-memory error (PyTorch capped at 3 GiB): the trainer halves
#    the chunk and redoes the step, and the result equals an uninterrupted run
#    with the final plan; at one transition it stops with a clear error.
# 3. Two passes are exact on the GPU (TF32 off); bfloat16 and float16 (GradScaler)
#    train and agree with float32 within their precision.
#
# Usage (from anywhere; needs a CUDA GPU and the package with its dependencies,
# e.g. `pip install -e .` in a CUDA build of PyTorch):
#     experiments/gpu_check.sh [OUT_DIR]     # default: experiments/results
# Exit status 0 and "GPU CHECK PASSED" when everything holds. Results land in
# OUT_DIR/memory_cuda.{md,json,png}.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-experiments/results}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
python=${PYTHON:-python3}

"$python" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else "no CUDA GPU")'
"$python" -c 'import torch; print(torch.__version__, torch.cuda.get_device_name(0))'

start=$SECONDS
bench_status=0
"$python" experiments/bench_memory.py --device cuda --check --quick \
  --fragment-length 50 --out "$out/memory_cuda" || bench_status=$?
echo "bench: $((SECONDS - start)) s, status $bench_status"

"$python" - <<'EOF'
import copy
import sys

import gymnasium as gym
import numpy as np
import torch as th
from imitation.algorithms import preference_comparisons as pc
from imitation.rewards.reward_nets import CnnRewardNet
from imitation.util import logger as imit_logger

sys.path.insert(0, "experiments")
from bench_memory import SHAPE, make_dataset  # noqa: E402

from imitation_accum import CrossEntropyRewardTrainer  # noqa: E402

th.backends.cudnn.allow_tf32 = False
th.backends.cuda.matmul.allow_tf32 = False
th.backends.cudnn.deterministic = True
th.backends.cudnn.benchmark = False
device = th.device("cuda")
space = gym.spaces.Box(0, 255, SHAPE, np.uint8)
failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)


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


# 2. A real out-of-memory error, halved away -----------------------------------
dataset = make_dataset(4, 50)  # 400 transitions, about 7 GiB in one chunk
net = make_net()
initial = copy.deepcopy(net)
th.cuda.empty_cache()
total = th.cuda.get_device_properties(device).total_memory
th.cuda.set_per_process_memory_fraction(3 * 2**30 / total)
trainer = trainer_for(net, batch_size=4, forward_size=1000, lr=0.01)
trainer.train(dataset)
cap = trainer.planner.max_transitions
logged = trainer.logger.name_to_value
print(
    f"after out-of-memory errors: chunks of at most {cap} transitions, two passes "
    f"{logged['reward/final/train/two_pass']}"
)
check(cap is not None and cap < 400, "an out-of-memory error halved the chunk")
replay = copy.deepcopy(initial)
uninterrupted = trainer_for(replay, batch_size=4, forward_size=1000, lr=0.01)
uninterrupted._backed_off_cap = cap  # the final plan from the start
uninterrupted.train(dataset)
start = list(initial.parameters())
update = [p - q for p, q in zip(net.parameters(), start)]
expected = [p - q for p, q in zip(replay.parameters(), start)]
error = rel(update, expected)
check(error < 1e-5, f"redone step equals an uninterrupted one (rel. error {error:.2e})")
th.cuda.empty_cache()
allocated = th.cuda.memory_allocated(device)
th.cuda.set_per_process_memory_fraction((allocated + 8 * 2**20) / total)
try:
    trainer_for(make_net(), batch_size=4, forward_size=1000).train(dataset)
    check(False, "stops with a clear error at one transition")
except th.OutOfMemoryError as oom:
    check("one transition" in str(oom), "stops with a clear error at one transition")
th.cuda.set_per_process_memory_fraction(1.0)
th.cuda.empty_cache()

# 3. Two passes exact; bfloat16 and float16 ------------------------------------
dataset = make_dataset(4, 30)
reference = make_net(dropout_prob=0.0)
trainer_for(reference, batch_size=4, forward_size=1000, lr=1e-9).train(dataset)
full = grads(reference)
for kwargs in (dict(two_pass=True, forward_size=7), dict(minibatch_size=1)):
    net = make_net()
    trainer_for(net, batch_size=4, lr=1e-9, **kwargs).train(dataset)
    error = rel(grads(net), full)
    # float32 round-off of sums over 210x160 pixels: about 1e-5
    check(error < 1e-4, f"{kwargs}: full-batch gradient (rel. error {error:.2e})")
for dtype, tolerance in (("bfloat16", 3e-2), ("float16", 5e-3)):
    net = make_net()
    trainer = trainer_for(
        net, batch_size=4, minibatch_size=2, lr=1e-9, autocast_dtype=dtype
    )
    trainer.train(dataset)
    error = rel(grads(net), full)
    logged = trainer.logger.name_to_value
    scale = logged.get("reward/final/train/amp_loss_scale")
    check(error < tolerance, f"{dtype}: gradient within {tolerance} ({error:.2e}), "
          f"loss scale {scale}")
if failures:
    sys.exit(f"{len(failures)} GPU check(s) failed")
EOF
if [ "$bench_status" -ne 0 ]; then
  echo "GPU CHECK FAILED: the benchmark's targets (see above)" >&2
  exit 1
fi
echo "GPU CHECK PASSED in $((SECONDS - start)) s"
