"""opt.DistOpt over real processes and devices: 2 processes x 1 device, 2 x 2 and 1 x 4 on CPU.

Each topology runs ONE launcher subprocess (SINGA's pattern: ``NcclIdHolder()`` in the parent,
``multiprocessing`` fork children, ``DistOpt(sgd, nccl_id, local_rank, world_size)`` in each)
that trains a small CNN for a few steps under every requested dist option, in eager and graph
mode, and saves every rank's parameters. This process then checks them against

* ``plain``: single-device SGD-momentum training on the concatenated global batch (1e-5);
* ``half``, ``partialUpdate``, ``sparseTopK``, ``sparseThreshold``: a NumPy simulation of SINGA's
  rules over the ranks (per-rank gradients from singa_jax's autograd on each rank's batch).
"""
import os
import subprocess
import sys
import textwrap
import warnings

import jax
import numpy as np
import pytest

from backend_precision import two_programs_tolerance
from singa_jax import autograd, device, opt, precision, tensor

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = 3
LR, MOMENTUM = 0.05, 0.9
PER_RANK_BATCH = 4
THRESHOLD = 20      # SINGA's fusion threshold: small, so the model has several partitions
SPARS = {"sparseTopK": 0.3, "sparseThreshold": 0.05}
HALF_TOLERANCE = 2e-3  # float16 communication: see docs/distributed.md

# --- the model and data every process builds (the launcher imports this file's text) --------
COMMON = textwrap.dedent('''
    import numpy as np
    from singa_jax import autograd, layer, model

    class Net(model.Model):
        def __init__(self):
            super().__init__()
            self.conv = layer.Conv2d(3, 3, padding=1)
            self.relu = layer.ReLU()
            self.flat = layer.Flatten()
            self.fc = layer.Linear(4)
            self.loss = layer.SoftMaxCrossEntropy()

        def forward(self, x):
            return self.fc(self.flat(self.relu(self.conv(x))))

        def train_one_batch(self, x, y, option, spars):
            out = self.forward(x)
            loss = self.loss(out, y)
            if option == "plain":
                self.optimizer(loss)
            elif option == "half":
                self.optimizer.backward_and_update_half(loss)
            elif option == "partialUpdate":
                self.optimizer.backward_and_partial_update(loss, threshold=THRESHOLD)
            else:
                self.optimizer.backward_and_sparse_update(
                    loss, threshold=THRESHOLD, spars=spars, topK=option == "sparseTopK")
            return out, loss

    def global_batches(world, steps, per_rank):
        rng = np.random.RandomState(1)
        x = rng.randn(steps, world * per_rank, 1, 5, 5).astype(np.float32)
        y = rng.randint(0, 4, size=(steps, world * per_rank)).astype(np.int32)
        return x, y
''')

LAUNCHER = textwrap.dedent('''
    import multiprocessing, os, sys
    import numpy as np
    from singa_jax.singa_wrap import NcclIdHolder
    THRESHOLD, STEPS, PER_RANK, LR, MOMENTUM = {THRESHOLD}, {STEPS}, {PER_RANK}, {LR}, {MOMENTUM}
    SPARS = {SPARS!r}
    exec(open(sys.argv[1]).read())  # COMMON: Net, global_batches

    def child(rank, world, holder, runs, out_dir, mismatch):
        from singa_jax import device, opt, tensor
        results = {{}}
        for mode, option in runs:
            sgd = opt.SGD(lr=LR, momentum=MOMENTUM)
            dist = (opt.DistOpt(sgd, nccl_id=holder, local_rank=rank, world_size=world)
                    if holder is not None else opt.DistOpt(sgd))
            assert (dist.world_size, dist.global_rank) == (world, rank)
            dev = device.get_default_device()
            dev.SetRandSeed(0)
            net = Net()
            x, y = global_batches(world, STEPS, PER_RANK)
            tx = tensor.Tensor((PER_RANK, 1, 5, 5), dev)
            ty = tensor.Tensor((PER_RANK,), dev, tensor.int32)
            net.set_optimizer(dist)
            net.compile([tx], is_train=True, use_graph=mode == "graph")
            if not results:
                results["init"] = {{k: tensor.to_numpy(v) for k, v in net.get_params().items()}}
            for s in range(STEPS):
                rows = slice(rank * PER_RANK, (rank + 1) * PER_RANK)
                tx.copy_from_numpy(x[s, rows])
                ty.copy_from_numpy(y[s, rows])
                out, loss = net(tx, ty, option, SPARS.get(option, 0.0))
                assert out.shape == (PER_RANK, 4), out.shape
                assert tensor.to_numpy(loss).size == 1
            results[mode + "/" + option] = {{k: tensor.to_numpy(v)
                                            for k, v in net.get_params().items()}}
        # eager all_reduce of a value per rank (SINGA's reduce_variable)
        t = tensor.from_numpy(np.array([rank + 1.0], np.float32))
        dist.all_reduce(t.data)  # SINGA passes the CTensor
        results["reduced"] = {{"sum": tensor.to_numpy(t)}}
        if mismatch:  # a rank passing another batch size: every rank must raise, none hang
            net = Net(); net.set_optimizer(dist)
            n = PER_RANK * (rank + 1)
            tx = tensor.Tensor((n, 1, 5, 5), device.get_default_device())
            ty = tensor.Tensor((n,), device.get_default_device(), tensor.int32)
            net.compile([tx], is_train=True, use_graph=True)
            try:
                net(tx, ty, "plain", 0.0)
            except ValueError as e:
                results["mismatch"] = {{"message": np.array(str(e))}}
        if "indivisible" in os.environ.get("DIST_TEST_EXTRA", ""):
            net = Net(); net.set_optimizer(dist)
            tx = tensor.Tensor((PER_RANK + 1, 1, 5, 5), device.get_default_device())
            ty = tensor.Tensor((PER_RANK + 1,), device.get_default_device(), tensor.int32)
            net.compile([tx], is_train=True, use_graph=True)
            try:
                net(tx, ty, "plain", 0.0)
            except ValueError as e:
                results["indivisible"] = {{"message": np.array(str(e))}}
        flat = {{f"{{run}}|{{k}}": v for run, params in results.items() for k, v in params.items()}}
        np.savez(os.path.join(out_dir, f"rank{{rank}}.npz"), **flat)

    if __name__ == "__main__":
        world, out_dir = int(sys.argv[2]), sys.argv[3]
        runs = [tuple(r.split(":")) for r in sys.argv[4].split(",")]
        mismatch = sys.argv[5] == "1"
        if world == 1:  # one process: no rendezvous, DistOpt(sgd) runs as the only rank
            child(0, 1, None, runs, out_dir, mismatch)
            sys.exit(0)
        holder = NcclIdHolder()
        ctx = multiprocessing.get_context("fork")
        procs = [ctx.Process(target=child, args=(r, world, holder, runs, out_dir, mismatch))
                 for r in range(world)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(120)
        sys.exit(max(abs(p.exitcode or 0) for p in procs))
''').format(THRESHOLD=THRESHOLD, STEPS=STEPS, PER_RANK=PER_RANK_BATCH, LR=LR, MOMENTUM=MOMENTUM,
            SPARS=SPARS)

namespace = {}
exec(COMMON.replace("THRESHOLD", str(THRESHOLD)), namespace)
Net, global_batches = namespace["Net"], namespace["global_batches"]


def launch(tmp_path, world, local_devices, runs, mismatch=False, extra=""):
    common = tmp_path / "common.py"
    common.write_text(COMMON)
    script = tmp_path / "launch.py"
    script.write_text(LAUNCHER)
    path = os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, JAX_PLATFORMS="cpu", SINGA_JAX_DIST_TIMEOUT="20", PYTHONPATH=path,
               XLA_FLAGS=f"--xla_force_host_platform_device_count={local_devices}",
               DIST_TEST_EXTRA=extra)
    proc = subprocess.run([sys.executable, str(script), str(common), str(world), str(tmp_path),
                           ",".join(f"{m}:{o}" for m, o in runs), "1" if mismatch else "0"],
                          env=env, capture_output=True, text=True, timeout=150)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = []
    for rank in range(world):
        data = np.load(tmp_path / f"rank{rank}.npz")
        runs_of_rank = {}
        for key in data.files:
            run, name = key.split("|")
            runs_of_rank.setdefault(run, {})[name] = data[key]
        out.append(runs_of_rank)
    return out


# --- references ------------------------------------------------------------------------------
def _reference_net(init):
    dev = device.get_default_device()
    net = Net()
    tx = tensor.Tensor((PER_RANK_BATCH, 1, 5, 5), dev)
    net.compile([tx], is_train=True, use_graph=False)
    net.set_params({k: tensor.from_numpy(v) for k, v in init.items()})
    return net


def single_device_training(init, world):
    """Plain SGD-momentum on one device, on the concatenated global batch."""
    net = _reference_net(init)
    net.set_optimizer(opt.SGD(lr=LR, momentum=MOMENTUM))
    x, y = global_batches(world, STEPS, PER_RANK_BATCH)
    for s in range(STEPS):
        net(tensor.from_numpy(x[s]), tensor.from_numpy(y[s]), "plain", 0.0)
    return {k: tensor.to_numpy(v) for k, v in net.get_params().items()}


def rank_gradients(net, params, x, y):
    """(names in backward order, gradients) of the mean loss of one rank's batch at ``params``."""
    net.set_params({k: tensor.from_numpy(v.astype(np.float32)) for k, v in params.items()})
    autograd.training = True
    try:
        loss = net.loss(net.forward(tensor.from_numpy(x)), tensor.from_numpy(y))
        pairs = list(autograd.backward(loss))
    finally:
        autograd.training = False
    name_of = {id(p): k for k, p in net.get_params().items()}
    return [name_of[id(p)] for p, _ in pairs], [tensor.to_numpy(g) for _, g in pairs]


def partitions(sizes, threshold):
    """SINGA's fusion groups (written out again here, independently of singa_jax)."""
    groups, pending, acc = [], [], 0
    for i, n in enumerate(sizes):
        if n > threshold:
            groups.append([i])
        else:
            pending.append(i)
            acc += n
            if acc > threshold:
                groups.append(pending)
                pending, acc = [], 0
    if pending:
        groups.append(pending)
    return groups


def simulate(init, world, option):
    """Every rank's parameters after STEPS steps of SINGA's rule ``option``, in NumPy."""
    net = _reference_net(init)
    x, y = global_batches(world, STEPS, PER_RANK_BATCH)
    params = [{k: v.astype(np.float64) for k, v in init.items()} for _ in range(world)]
    moments = [{k: np.zeros_like(v) for k, v in init.items()} for _ in range(world)]
    accumulations = [None] * world
    partial = 0
    for s in range(STEPS):
        grads = []
        for r in range(world):
            rows = slice(r * PER_RANK_BATCH, (r + 1) * PER_RANK_BATCH)
            names, g = rank_gradients(net, params[r], x[s, rows], y[s, rows])
            grads.append([a.astype(np.float64) for a in g])
        groups = partitions([grads[0][i].size for i in range(len(names))], THRESHOLD)

        def sgd(r, name, g):
            moments[r][name] = MOMENTUM * moments[r][name] + g
            params[r][name] = params[r][name] - LR * moments[r][name]

        if option == "half":
            sent = [[g.astype(np.float16) for g in grads[r]] for r in range(world)]
            total = [sum(sent[r][i] for r in range(world)).astype(np.float64)
                     for i in range(len(names))]
            for r in range(world):
                for name, t in zip(names, total):
                    sgd(r, name, t / world)
        elif option == "partialUpdate":
            for r in range(world):
                for name, g in zip(names, grads[r]):
                    sgd(r, name, g)
            partial += 1
            chosen = groups[partial - 1]
            for i in chosen:
                mean = sum(params[r][names[i]] for r in range(world)) / world
                for r in range(world):
                    params[r][names[i]] = mean
            if partial == len(groups):
                partial = 0
        else:  # sparseTopK / sparseThreshold, corr=True
            spars = SPARS[option]
            if accumulations[0] is None:
                accumulations = [[np.zeros(sum(grads[0][i].size for i in grp))
                                  for grp in groups] for _ in range(world)]
            total = [np.zeros_like(g) for g in grads[0]]
            for r in range(world):
                for k, grp in enumerate(groups):
                    flat = np.concatenate([grads[r][i].reshape(-1) for i in grp])
                    flat = flat + accumulations[r][k]
                    if option == "sparseTopK":
                        keep = np.zeros(flat.size, bool)
                        keep[np.argsort(-np.abs(flat), kind="stable")[
                            :int(np.ceil(spars * flat.size))]] = True
                    else:
                        keep = np.abs(flat) >= spars
                    sent = np.where(keep, flat, 0.0)
                    accumulations[r][k] = flat - sent
                    start = 0
                    for i in grp:
                        n = grads[r][i].size
                        total[i] += sent[start:start + n].reshape(grads[r][i].shape)
                        start += n
            for r in range(world):
                for name, t in zip(names, total):
                    sgd(r, name, t / world)
    return params


def assert_params_close(got, want, tol, what):
    """``tol``: rtol = atol, or a dict(rtol=, atol=)."""
    close = tol if isinstance(tol, dict) else {"rtol": tol, "atol": tol}
    assert sorted(got) == sorted(want), what
    for k in want:
        np.testing.assert_allclose(got[k], want[k], **close, err_msg=f"{what}: {k}")


def check_runs(results, world, runs, local_devices):
    init = results[0]["init"]
    for r in range(world):  # every rank starts from the same parameters (same default seed)
        assert_params_close(results[r]["init"], init, 0, f"rank {r} init")
    # The ranks run on host devices (float32 products); this process computes the references
    # on its default device, in float32 there too (TF32 on a GPU would miss 1e-5)
    with precision.float32_matmul_precision_scope("float32"):
        return _check_runs(results, world, runs, local_devices, init)


def _check_runs(results, world, runs, local_devices, init):
    plain = single_device_training(init, world)
    moved = {k: not np.allclose(plain[k], init[k]) for k in init}
    assert all(moved.values()), moved
    for mode, option in runs:
        what = f"{world}x{local_devices} {mode}/{option}"
        if option == "plain":
            for r in range(world):
                assert_params_close(results[r][f"{mode}/{option}"], plain, 1e-5, what)
            continue
        sim = simulate(init, world, option)
        tol = HALF_TOLERANCE if option == "half" else 1e-5
        for r in range(world):
            assert_params_close(results[r][f"{mode}/{option}"], sim[r], tol, f"{what} rank {r}")
        if option == "partialUpdate" and world > 1:  # ranks really differ between averagings
            assert not np.allclose(results[0][f"{mode}/{option}"]["fc.W"],
                                   results[1][f"{mode}/{option}"]["fc.W"])
    for r in range(world):
        np.testing.assert_array_equal(results[r]["reduced"]["sum"],
                                      [world * (world + 1) / 2])


ALL_OPTIONS = ["plain", "half", "partialUpdate", "sparseTopK", "sparseThreshold"]


def test_two_processes_one_device_each(tmp_path):
    # every option eagerly across processes; in graph mode every option runs in one of the
    # three topologies (kept apart so that the process tests stay within a minute)
    runs = [("eager", o) for o in ALL_OPTIONS] + [("graph", "plain")]
    results = launch(tmp_path, 2, 1, runs, mismatch=True)
    check_runs(results, 2, runs, 1)
    for r in range(2):  # different batch sizes on the ranks: a clear error on every rank
        msg = str(results[r]["mismatch"]["message"])
        assert "differ" in msg and "rank 0" in msg and "rank 1" in msg, msg


def test_two_processes_two_devices_each(tmp_path):
    runs = [("graph", "plain"), ("graph", "half"), ("graph", "sparseThreshold")]
    check_runs(launch(tmp_path, 2, 2, runs), 2, runs, 2)


def test_one_process_four_devices(tmp_path):
    runs = [("graph", "plain"), ("graph", "partialUpdate"), ("graph", "sparseTopK")]
    results = launch(tmp_path, 1, 4, runs, extra="indivisible")
    check_runs(results, 1, runs, 4)
    msg = str(results[0]["indivisible"]["message"])
    assert "divisible by 4" in msg and "(5, 1, 5, 5)" in msg, msg


WRONG_WORLD = textwrap.dedent("""
    import multiprocessing, sys
    from singa_jax.singa_wrap import NcclIdHolder

    def child(rank, holder):
        from singa_jax import opt
        opt.DistOpt(opt.SGD(), nccl_id=holder, local_rank=rank, world_size=3)

    if __name__ == "__main__":
        holder = NcclIdHolder()
        procs = [multiprocessing.get_context("fork").Process(target=child, args=(r, holder))
                 for r in range(2)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(60)
        print("exit codes", [p.exitcode for p in procs])
""")


def test_world_size_larger_than_the_launch_fails_on_every_rank_within_the_timeout():
    env = dict(os.environ, JAX_PLATFORMS="cpu", SINGA_JAX_DIST_TIMEOUT="3",
               PYTHONPATH=os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, "-c", WRONG_WORLD], env=env, capture_output=True,
                          text=True, timeout=60)
    assert "exit codes [1, 1]" in proc.stdout, proc.stdout + proc.stderr[-3000:]
    for rank in (0, 1):
        assert f"rank {rank} of world_size 3 gave up waiting at the rendezvous" in proc.stderr
    assert "not every rank 0..2 joined" in proc.stderr


NO_BACKEND = textwrap.dedent("""
    from jax._src import xla_bridge
    import singa_jax
    from singa_jax import opt, device, tensor, layer, model
    from singa_jax.singa_wrap import NcclIdHolder
    import pickle
    holder = pickle.loads(pickle.dumps(NcclIdHolder()))
    sgd = opt.SGD(lr=0.1, momentum=0.9, weight_decay=1e-5)
    adam = opt.Adam(lr=0.01)
    assert not xla_bridge.backends_are_initialized(), "the backend started too early"
    # the state exists on first use, with the schedule's value
    assert abs(float(tensor.to_numpy(sgd.lr_value)[0]) - 0.1) < 1e-7
    assert float(tensor.to_numpy(sgd.step_counter)[0]) == 0
    assert sorted(adam.get_states()) == ["step_counter"]
    print("OK", holder.address.startswith("127.0.0.1:"))
""")


def test_import_holder_and_optimizer_start_no_backend():
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               PYTHONPATH=os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, "-c", NO_BACKEND], env=env, capture_output=True,
                          text=True, timeout=60)
    assert proc.stdout.strip() == "OK True", proc.stderr[-3000:]


def test_bad_arguments_raise_before_joining():
    with pytest.raises(ValueError, match=r"local_rank must be an int in \[0, 2\).*got 2"):
        opt.DistOpt(opt.SGD(), nccl_id="127.0.0.1:1", local_rank=2, world_size=2)
    with pytest.raises(ValueError, match="world_size must be a positive int"):
        opt.DistOpt(opt.SGD(), nccl_id="127.0.0.1:1", local_rank=0, world_size=0)
    with pytest.raises(TypeError, match="nccl_id must be a singa_wrap.NcclIdHolder"):
        opt.DistOpt(opt.SGD(), nccl_id=42, local_rank=0, world_size=2)
    with pytest.raises(ValueError, match="world_size=2 but this run has 1 process"):
        opt.DistOpt(opt.SGD(), world_size=2)
    with pytest.raises(ValueError, match="buffSize must be a positive int"):
        opt.DistOpt(opt.SGD(), buffSize=0)
    # one process, started already: a multi-process join is refused with the reason
    with pytest.raises(RuntimeError, match="backend has already started"):
        opt.DistOpt(opt.SGD(), nccl_id="127.0.0.1:1", local_rank=0, world_size=2)


def test_one_rank_in_process_matches_the_wrapped_optimizer():
    """world_size 1 here (this process): DistOpt's plain step is the wrapped optimizer's."""
    dist = opt.DistOpt(opt.SGD(lr=LR, momentum=MOMENTUM))
    assert (dist.world_size, dist.global_rank, dist.local_rank) == (1, 0, 0)
    x, y = global_batches(1, STEPS, PER_RANK_BATCH)
    init = {k: tensor.to_numpy(v) for k, v in _reference_net(
        {k: v for k, v in _init_params().items()}).get_params().items()}
    net = _reference_net(init)
    net.set_optimizer(dist)
    several = len(jax.local_devices()) > 1  # (CI: two host devices) eager uses one, says so once
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for s in range(STEPS):
            net(tensor.from_numpy(x[s]), tensor.from_numpy(y[s]), "plain", 0.0)
    told = [w for w in caught if "computes on one device per rank" in str(w.message)]
    assert len(told) == (1 if several else 0)
    got = {k: tensor.to_numpy(v) for k, v in net.get_params().items()}
    # DistOpt's step and the wrapped SGD's are two programs on this process's default device:
    # 1e-6 apart in float32, their own TF32 roundings apart on a GPU
    assert_params_close(got, single_device_training(init, 1), two_programs_tolerance(1e-6, 1e-6),
                        "in-process DistOpt")
    t = tensor.from_numpy(np.array([1.5], np.float32))
    assert dist.all_reduce(t) is t and tensor.to_numpy(t).tolist() == [1.5]
    assert dist.all_reduce(t.data) is not None and tensor.to_numpy(t).tolist() == [1.5]
    assert np.asarray(dist.all_reduce(np.array([2.5], np.float32))).tolist() == [2.5]


def _init_params():
    device.get_default_device().SetRandSeed(0)
    net = Net()
    net.compile([tensor.Tensor((PER_RANK_BATCH, 1, 5, 5))], is_train=True, use_graph=False)
    return {k: tensor.to_numpy(v) for k, v in net.get_params().items()}
