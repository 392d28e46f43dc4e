"""Helpers shared by the singa_jax example programs (data, progress bars, checkpoints).

The examples put their parent folder (``examples/``) on ``sys.path`` and import this package as
``common``; it is not part of the installed library.
"""
