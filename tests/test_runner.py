"""``python -m singa_jax.run``: SINGA-style scripts written here run unmodified, with ``singa``
resolving to singa_jax for that run only; ``install_as_singa()`` does the same in-process."""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from singa_jax import run

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

TRAIN_SCRIPT = '''
import argparse
import os
import sys

import numpy as np

import singa
from singa import autograd, device, tensor
from singa import singa_wrap as singa_api
from helper import make_data          # a sibling module: the script's folder is on sys.path


class Square(autograd.Operator):
    """A custom operator on CTensors, as SINGA's guide writes them."""

    def forward(self, x):
        self.x = x
        return singa_api.Square(x)

    def backward(self, dy):
        return singa_api.MultFloat(singa_api.__mul__(dy, self.x), 2.0)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("out")
    args = parser.parse_args()
    assert sys.argv[0].endswith("train.py") and singa.__name__ == "singa_jax"
    assert os.environ.get("SINGA_JAX_CUDA_FALLBACK") == "1"
    dev = device.get_default_device()
    x_np, y_np = make_data()
    x = tensor.Tensor(data=x_np, device=dev, requires_grad=False)
    y = tensor.Tensor(data=y_np, device=dev, requires_grad=False)
    w = tensor.Tensor((4, 1), dev, requires_grad=True, stores_grad=True)
    w.gaussian(0.0, 0.1)
    autograd.training = True
    losses = []
    for _ in range(args.epochs):
        err = autograd.sub(autograd.matmul(x, w), y)
        loss = autograd.reduce_mean(Square()(err)[0])
        for p, gp in autograd.backward(loss):
            tensor.axpy(-0.05, gp, p)
        losses.append(float(tensor.to_numpy(loss).reshape(-1)[0]))
    np.save(args.out, np.array(losses))
    print("USE_CUDA", singa_api.USE_CUDA, "first", losses[0], "last", losses[-1])
'''

HELPER = '''
import numpy as np


def make_data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(32, 4)).astype(np.float32)
    return x, (x @ np.array([[1.0], [-2.0], [0.5], [3.0]], np.float32)).astype(np.float32)
'''


def _run(args, cwd):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               JAX_PLATFORMS="cpu")
    return subprocess.run([sys.executable, "-m", "singa_jax.run", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def test_runner_trains_a_singa_script(tmp_path):
    (tmp_path / "train.py").write_text(TRAIN_SCRIPT)
    (tmp_path / "helper.py").write_text(HELPER)
    out = tmp_path / "losses.npy"
    proc = _run([str(tmp_path / "train.py"), "--epochs", "30", str(out)], cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    losses = np.load(out)
    assert len(losses) == 30 and losses[-1] < 0.2 * losses[0]
    assert "USE_CUDA False" in proc.stdout or "USE_CUDA True" in proc.stdout


def test_runner_reports_missing_modules_and_script_errors(tmp_path):
    (tmp_path / "bad.py").write_text(textwrap.dedent('''
        import sys
        from singa import tensor
        print("main" if __name__ == "__main__" else __name__)
        import singa.no_such_module
    '''))
    proc = _run([str(tmp_path / "bad.py")], cwd=str(tmp_path))
    assert proc.returncode == 1 and proc.stdout.strip() == "main"
    assert "SINGA's module 'singa.no_such_module' is not provided by singa_jax" in proc.stderr
    usage = _run([], cwd=str(tmp_path))
    assert usage.returncode == 2 and "usage: python -m singa_jax.run" in usage.stdout
    missing = _run([str(tmp_path / "nope.py")], cwd=str(tmp_path))
    assert missing.returncode == 2 and "no such script" in missing.stderr


def test_install_as_singa_in_process(monkeypatch):
    monkeypatch.delenv(run.CUDA_FALLBACK_ENV, raising=False)
    assert "singa" not in sys.modules
    finder = run.install_as_singa()
    try:
        assert run.install_as_singa() is finder  # idempotent
        import singa
        from singa import tensor as singa_tensor, singa_wrap
        import singa.autograd
        from singa_jax import autograd, tensor
        assert singa is sys.modules["singa_jax"] and singa_tensor is tensor
        assert singa.autograd is autograd and singa_wrap.CTensor is not None
        assert tensor.__spec__.name == "singa_jax.tensor"  # the real modules keep their specs
        assert os.environ[run.CUDA_FALLBACK_ENV] == "1"
    finally:
        run.uninstall_singa_alias()
    assert "singa" not in sys.modules and "singa.tensor" not in sys.modules
    with pytest.raises(ImportError):
        import singa  # noqa: F401  (nothing is installed under the name)


def test_install_as_singa_refuses_a_real_singa(monkeypatch):
    monkeypatch.setitem(sys.modules, "singa", type(sys)("singa"))
    with pytest.raises(RuntimeError, match="already imported"):
        run.install_as_singa()
