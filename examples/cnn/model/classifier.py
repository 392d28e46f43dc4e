"""The classifiers' base class, shared with the MLP example (lives in examples/common)."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..'))
from common.classifier import Classifier  # noqa: E402,F401
