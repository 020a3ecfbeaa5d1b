"""Named configs for runs on a GPU.

``gpu_bf16`` runs the preference trainer's reward net under ``torch.autocast`` in
bfloat16 (Ampere or later); the accelerator options (``acceleration``) stay as
configured, off by default, until they are measured on a device (``docs/gpu.md``).
"""

from typing import Any, Dict

import sacred

#: The preference trainer's arguments for a bfloat16 run on a GPU.
GPU_BF16: Dict[str, Any] = {
    "reward_trainer_kwargs": {"autocast_dtype": "bfloat16"},
}


def add_named_configs(ex: sacred.Experiment) -> None:
    """Adds ``gpu_bf16`` to a preference experiment."""
    ex.add_named_config("gpu_bf16", GPU_BF16)
