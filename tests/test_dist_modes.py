"""A model trained by DistOpt in graph mode, then called in the other ways.

After DistOpt's graph-mode steps the model's state lives on the mesh (global arrays over every
device). Evaluation (graph mode, which compiles a one-device program, or eager), eager
training and graph-mode training again must all work from there, on one process with two host
devices, and give the numbers of a plain optimizer training the same model on one device
(1e-5), for every sharding of DistOpt's state: replicated, ZeRO-1 (its eager training raises:
graph mode only, nothing changed) and FSDP (``shard_parameters``: whole values gathered
for the other calls). The sharded ones refuse the options that keep per-rank state.
"""
import os
import subprocess
import sys
import textwrap

from test_dist import COMMON, LR, MOMENTUM, PER_RANK_BATCH, REPO, THRESHOLD

SCRIPT = COMMON.replace("THRESHOLD", str(THRESHOLD)) + textwrap.dedent(f'''
    import warnings
    import jax
    from singa_jax import device, opt, precision, tensor

    LR, MOMENTUM, BATCH = {LR}, {MOMENTUM}, {PER_RANK_BATCH}
    x, y = global_batches(1, 6, BATCH)  # one rank: the batch split over its two devices

    def build(optimizer, graph):
        device.get_default_device().SetRandSeed(0)
        net = Net()
        tx = tensor.Tensor((BATCH, 1, 5, 5), device.get_default_device())
        net.set_optimizer(optimizer)
        net.compile([tx], is_train=True, use_graph=graph)
        return net

    def values(net):
        return {{k: tensor.to_numpy(v) for k, v in net.get_states().items()}}

    def close(got, want, what):
        if isinstance(got, dict):
            assert sorted(got) == sorted(want), what
            for k in want:
                close(got[k], want[k], f"{{what}}: {{k}}")
            return
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=what)

    def train(net, s):
        net.train()
        net(tensor.from_numpy(x[s]), tensor.from_numpy(y[s]), "plain", 0.0)

    def evaluate(net, s):
        net.eval()
        return tensor.to_numpy(net(tensor.from_numpy(x[s])))

    assert len(jax.local_devices()) == 2
    with precision.float32_matmul_precision_scope("float32"):
        for level in (0, 1, 2):  # replicated, ZeRO-1, FSDP
            what = ["replicated", "ZeRO-1", "FSDP"][level]
            dist = opt.DistOpt(opt.SGD(lr=LR, momentum=MOMENTUM),
                               shard_optimizer_state=level >= 1, shard_parameters=level == 2)
            net = build(dist, graph=True)
            ref = build(opt.SGD(lr=LR, momentum=MOMENTUM), graph=False)
            ref.set_params({{k: tensor.to_numpy(v) for k, v in net.get_params().items()}})
            for s in (0, 1):  # graph mode: one SPMD program over both devices
                train(net, s)
                train(ref, s)
            for t in net.get_params().values():
                assert len(t.array.sharding.device_set) == 2, (what, t.name, t.array.sharding)
            if level == 2:  # FSDP: a device holds half of fc.W
                w = net.get_params()["fc.W"].array
                assert all(sh.data.shape == (75, 2) for sh in w.addressable_shards), what
            close(values(net), values(ref), f"{{what}}: after graph-mode training")
            # evaluation, graph mode (a one-device program) and eager
            close(evaluate(net, 2), evaluate(ref, 2), f"{{what}}: graph-mode evaluation")
            net.graph(False)
            close(evaluate(net, 2), evaluate(ref, 2), f"{{what}}: eager evaluation")
            # eager training: one device per rank (told once); sharded state: graph mode only
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                if level == 0:
                    train(net, 3)
                    train(ref, 3)
                else:
                    before = values(net)
                    try:
                        train(net, 3)
                        raise AssertionError(f"{{what}}: eager training did not raise")
                    except RuntimeError as e:
                        assert "needs graph mode" in str(e), e
                    close(values(net), before, f"{{what}}: a refused eager step changed state")
            told = [w for w in caught if "computes on one device per rank" in str(w.message)]
            assert len(told) == (1 if level == 0 else 0), (what, [str(w.message) for w in caught])
            close(values(net), values(ref), f"{{what}}: after eager training")
            # graph-mode training again: the state goes back on the mesh
            net.graph(True)
            train(net, 4)
            train(ref, 4)
            for t in net.get_params().values():
                assert len(t.array.sharding.device_set) == 2, (what, t.name)
            close(values(net), values(ref), f"{{what}}: graph-mode training again")
            close(evaluate(net, 5), evaluate(ref, 5), f"{{what}}: graph-mode evaluation again")
            slots = {{k: tensor.to_numpy(v) for k, v in dist.get_states().items()}}
            want = {{k: tensor.to_numpy(v) for k, v in ref.optimizer.get_states().items()}}
            close(slots, want, f"{{what}}: optimizer state")
            if level:  # per-rank options keep per-rank state: refused, nothing changed
                before = values(net)
                net.train()
                try:
                    net(tensor.from_numpy(x[0]), tensor.from_numpy(y[0]), "sparseTopK", 0.3)
                    raise AssertionError(f"{{what}}: sparseTopK did not raise")
                except NotImplementedError as e:
                    assert "partial and sparse updates keep per-rank state" in str(e), e
                close(values(net), before, f"{{what}}: a refused sparse step changed state")
    print("OK")
''')


def test_eval_eager_and_graph_calls_after_distopt_graph_training():
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2",
               JAX_PLATFORMS="cpu",
               PYTHONPATH=os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("OK"), \
        proc.stdout[-2000:] + proc.stderr[-4000:]
