"""The offline default used when no data folder is given: scikit-learn's bundled digits."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..'))
from common.digits import load_digits_images  # noqa: E402,F401


def require(path: str, dataset: str) -> str:
    """``path`` if it exists, else a FileNotFoundError saying what the folder must hold."""
    if not os.path.exists(path):
        raise FileNotFoundError(
            f"{dataset}: {path} does not exist; pass the folder holding the standard {dataset} "
            f"files, or no folder to train on scikit-learn's bundled digits")
    return path
