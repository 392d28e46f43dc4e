"""``python -m singa_jax.run``: SINGA-style scripts written here run unmodified, with ``singa``
resolving to singa_jax for that run only; ``install_as_singa()`` does the same in-process."""
import json
import importlib
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


PROBE = r'''
import json
import os
import sys

# SINGA 5.1's examples/onnx/training/train.py reaches its sibling folder this way; with a
# relative __file__ ('train.py' run from its own folder) dirname is '' and the path is '/..'
sys.path.append(os.path.dirname(__file__) + '/..')
import utils  # noqa: E402

main = sys.modules["__main__"]
print(json.dumps({
    "file": __file__, "argv": sys.argv, "path": sys.path, "name": __name__,
    "main_file": main.__file__, "main_is_this_module": main.__dict__ is globals(),
    "spec": repr(__spec__), "package": __package__, "cached": __cached__,
    "loader": type(__loader__).__name__, "builtins": repr(__builtins__),
    "utils": utils.WHERE, "cwd": os.getcwd(),
}))
'''


def _python(args, cwd):
    """``python args...`` with the environment the runner gets in _run."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               JAX_PLATFORMS="cpu")
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


@pytest.mark.parametrize("where", ["own folder", "elsewhere"])
def test_runner_gives_the_script_what_python_gives(tmp_path, where):
    """``__file__`` (absolute), ``sys.argv``, the whole ``sys.path`` (the script's folder where
    ``-m`` put the working folder), ``__main__``: the same as ``python script.py``, so
    ``os.path.dirname(__file__) + '/..'`` finds the sibling folder from any working folder."""
    (tmp_path / "onnx" / "training").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "onnx" / "utils.py").write_text("WHERE = __file__\n")
    (tmp_path / "onnx" / "training" / "train.py").write_text(PROBE)
    if where == "own folder":
        cwd, script = tmp_path / "onnx" / "training", "train.py"
    else:
        cwd, script = tmp_path / "elsewhere", os.path.join("..", "onnx", "training", "train.py")
    args = [script, "--epochs", "2", "a b"]
    direct, ran = _python(args, str(cwd)), _run(args, str(cwd))
    assert direct.returncode == 0, direct.stderr
    assert ran.returncode == 0, ran.stderr
    expected, got = json.loads(direct.stdout), json.loads(ran.stdout)
    assert os.path.isabs(got["file"]) and got["argv"] == args
    assert got == expected


MODULE_PROBE = r'''
import json
import sys

main = sys.modules["__main__"]
print(json.dumps({
    "file": __file__, "argv": sys.argv, "path": sys.path, "name": __name__,
    "main_is_this_module": main.__dict__ is globals(), "spec": [__spec__.name, __spec__.origin,
    __spec__.parent], "package": __package__, "cached": __cached__,
    "loader": type(__loader__).__name__, "parent_imported": "app" in sys.modules,
}))
sys.exit(int(sys.argv[-1]))
'''


@pytest.mark.parametrize("module", ["app.server", "app.tools", "app.missing", "app", "nosuch"])
def test_runner_runs_a_module_as_python_m_does(tmp_path, module):
    """``-m module``: ``sys.argv`` (its file first), the whole ``sys.path`` (the working folder
    first), ``__main__``, ``__spec__``, ``__package__``, the parent package imported first, a
    package's ``__main__`` run, the exit status; a missing module or a package without
    ``__main__`` fails with python's message."""
    (tmp_path / "app" / "tools").mkdir(parents=True)
    (tmp_path / "app" / "__init__.py").write_text("print('app imported')\n")
    (tmp_path / "app" / "server.py").write_text(MODULE_PROBE)
    (tmp_path / "app" / "tools" / "__init__.py").write_text("")
    (tmp_path / "app" / "tools" / "__main__.py").write_text(MODULE_PROBE)
    args = [module, "--rounds", "2", "a b", "3"]
    direct, ran = _python(["-m", *args], str(tmp_path)), _run(["-m", *args], str(tmp_path))
    assert (ran.returncode, ran.stdout, ran.stderr) == \
        (direct.returncode, direct.stdout, direct.stderr)
    if module in ("app.server", "app.tools"):
        assert direct.returncode == 3 and json.loads(direct.stdout.splitlines()[-1])["argv"][1:] \
            == args[1:]
    else:
        assert direct.returncode == 1 and "No module named" in direct.stderr


EXITS = {
    "normal end": "print('done')",
    "sys.exit(3)": "import sys\nsys.exit(3)",
    "sys.exit(msg)": "import sys\nsys.exit('stopped: no data')",
    "sys.exit(None)": "raise SystemExit",
    "exception": "def step():\n    raise ValueError('loss is nan')\n\n\nstep()",
    "chained exception": ("try:\n    {}['lr']\nexcept KeyError as e:\n"
                          "    raise RuntimeError('no lr') from e"),
    "KeyboardInterrupt": "def loop():\n    raise KeyboardInterrupt\n\n\nloop()",
    "syntax error": "def (\n",
}


@pytest.mark.parametrize("case", list(EXITS))
def test_runner_exits_as_python_does(tmp_path, case):
    """The exit status and what is printed: ``sys.exit(n)``, ``sys.exit(msg)`` (1, msg on
    stderr), an uncaught exception (1; its traceback shows the script's frames only), an
    uncaught KeyboardInterrupt (the process dies by SIGINT, as python's does), a syntax error."""
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "script.py").write_text(EXITS[case] + "\n")
    args = [os.path.join("sub", "script.py")]
    direct, ran = _python(args, str(tmp_path)), _run(args, str(tmp_path))
    assert (ran.returncode, ran.stdout, ran.stderr) == \
        (direct.returncode, direct.stdout, direct.stderr)


def test_install_as_singa_in_process(monkeypatch):
    # (set, then removed: monkeypatch then restores the variable's state however the test
    # ends, the value install_as_singa writes included)
    monkeypatch.setenv(run.CUDA_FALLBACK_ENV, "0")
    monkeypatch.delenv(run.CUDA_FALLBACK_ENV)
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
        importlib.import_module("singa_jax._src.base")  # importable as itself
        for private in ("singa._src", "singa._src.base", "singa.tensor._private"):
            with pytest.raises(ModuleNotFoundError, match="not provided by singa_jax"):
                importlib.import_module(private)  # SINGA's names map to public modules only
    finally:
        run.uninstall_singa_alias()
    assert "singa" not in sys.modules and "singa.tensor" not in sys.modules
    with pytest.raises(ImportError):
        import singa  # noqa: F401  (nothing is installed under the name)


def test_install_as_singa_refuses_a_real_singa(monkeypatch):
    monkeypatch.setitem(sys.modules, "singa", type(sys)("singa"))
    with pytest.raises(RuntimeError, match="already imported"):
        run.install_as_singa()
