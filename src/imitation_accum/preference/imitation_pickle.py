"""Reading a dataset that imitation's ``PreferenceDataset.save`` pickled."""

import pickle
from typing import Any

from imitation.algorithms import preference_comparisons as pc
from imitation.data import types
from imitation.util import util

from imitation_accum.preference.dataset import ImitationPreferenceDataset


class _ImitationUnpickler(pickle.Unpickler):
    # Resolves imitation's dataset class to imitation's, also under patch().
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == (pc.__name__, "PreferenceDataset"):
            return ImitationPreferenceDataset
        return super().find_class(module, name)


def load_imitation_pickle(path: types.AnyPath) -> Any:
    """Unpickles what imitation's ``PreferenceDataset.save`` wrote to ``path``.

    Loading a pickle runs any code it holds: only for files you trust. Under
    ``patch()`` too, the dataset comes back as imitation's class.

    Args:
        path: The pickle file.

    Returns:
        The unpickled object (check its type).
    """
    with open(util.parse_path(path), "rb") as file:
        return _ImitationUnpickler(file).load()
