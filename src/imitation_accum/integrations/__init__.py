"""The code that touches imitation's names: ``patch()`` and demonstrations."""
