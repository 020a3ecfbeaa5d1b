"""imitation's logger for a benchmark point: it writes nothing and leaves nothing.

``imitation.util.logger.configure`` without a folder makes one under the system's
temporary directory (``imitation-<timestamp>``), even with no output format, and
never removes it: a benchmark of fresh processes leaves one per point.
"""

import atexit
import shutil
import tempfile

from imitation.util import logger as imit_logger


def quiet_logger() -> imit_logger.HierarchicalLogger:
    """A logger that records values but writes no file; its folder goes at exit."""
    folder = tempfile.mkdtemp(prefix="imitation-accum-")
    atexit.register(shutil.rmtree, folder, True)
    return imit_logger.configure(folder, format_strs=[])
