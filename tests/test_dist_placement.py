"""Where DistOpt's state lives and what a graph-mode step moves (issue 34).

On 1 process x 4 simulated CPU devices and 2 processes x 2, a launcher trains in graph mode and
reports, after training:

* each parameter's, buffer's and optimizer slot's sharding: it spans every device of the run,
  replicated -- or, with ``DistOpt(shard_optimizer_state=True)`` (ZeRO stage 1), each slot split
  over the devices, so that a device holds total / devices of the optimizer state (measured
  from the arrays' shards);
* the compiled step's collectives (its HLO): plain data parallelism all-reduces the gradients
  only (no all-gather, no permute, no more bytes than the gradients plus the loss); ZeRO
  reduce-scatters the gradients and all-gathers the updated parameters, and all-reduces no
  gradient; every state buffer is donated (input/output aliases);
* that a steady-state step places nothing on the mesh (no transfer of state);
* a checkpoint written after training and loaded back gives the same next step as continuing.

This process checks the numbers: plain and ZeRO (plain) equal single-device training on the
global batch to 1e-5; ZeRO's ``half`` equals the NumPy simulation of SINGA's float16 rule
(2e-3, as tests/test_dist.py); the other options' numbers are checked in tests/test_dist.py
(which runs the same step over the same placement).
"""
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from test_dist import (COMMON, HALF_TOLERANCE, LR, MOMENTUM, PER_RANK_BATCH, REPO, SPARS, STEPS,
                       THRESHOLD, assert_params_close, simulate, single_device_training)
from singa_jax import precision

WORKER = textwrap.dedent('''
    import json, multiprocessing, os, sys
    import numpy as np
    THRESHOLD, STEPS, PER_RANK, LR, MOMENTUM = {THRESHOLD}, {STEPS}, {PER_RANK}, {LR}, {MOMENTUM}
    SPARS = {SPARS!r}
    exec(open(sys.argv[1]).read())  # tests/test_dist.py's COMMON: Net, global_batches

    def bn_net():
        from singa_jax import layer, model

        class BNNet(Net):  # Net with batch normalisation (buffers) and 4 conv channels
            def __init__(self):
                model.Model.__init__(self)
                self.conv = layer.Conv2d(4, 3, padding=1)
                self.bn = layer.BatchNorm2d()
                self.relu = layer.ReLU()
                self.flat = layer.Flatten()
                self.fc = layer.Linear(4)
                self.loss = layer.SoftMaxCrossEntropy()

            def forward(self, x):
                return self.fc(self.flat(self.relu(self.bn(self.conv(x)))))
        return BNNet()

    def child(rank, world, holder, runs, out_dir):
        import jax
        from singa_jax import device, opt, tensor
        from singa_jax.opt import spmd
        moved = [0]
        place = spmd._SpmdProgram.place

        def counting_place(self, a, sharding):  # counts arrays put on the mesh
            out = place(self, a, sharding)
            moved[0] += out is not a
            return out
        spmd._SpmdProgram.place = counting_place
        report, params = {{}}, {{}}
        for kind, option, zero in runs:
            sgd = opt.SGD(lr=LR, momentum=MOMENTUM)
            args = dict(nccl_id=holder, local_rank=rank, world_size=world) if holder else {{}}
            dist = opt.DistOpt(sgd, shard_optimizer_state=zero, **args)
            dev = device.get_default_device()
            dev.SetRandSeed(0)
            net = Net() if kind == "net" else bn_net()
            x, y = global_batches(world, STEPS, PER_RANK)
            tx = tensor.Tensor((PER_RANK, 1, 5, 5), dev)
            ty = tensor.Tensor((PER_RANK,), dev, tensor.int32)
            net.set_optimizer(dist)
            net.compile([tx], is_train=True, use_graph=True)
            name = f"{{kind}}/{{option}}/{{int(zero)}}"
            rows = slice(rank * PER_RANK, (rank + 1) * PER_RANK)

            def step(s):
                tx.copy_from_numpy(x[s, rows])
                ty.copy_from_numpy(y[s, rows])
                net(tx, ty, option, SPARS.get(option, 0.0))
            params[name + "/init"] = {{k: tensor.to_numpy(v) for k, v in net.get_params().items()}}
            for s in range(STEPS):
                if s == STEPS - 1:
                    moved[0] = 0  # the last step: the state is on the mesh already
                step(s)
            entry = {{"moved_last_step": moved[0], "devices": jax.device_count(), "state": {{}}}}
            slots = {{k: v for k, v in dist.get_states().items() if k != "step_counter"}}
            for group, tensors in (("model", net.get_states()), ("slot", slots)):
                for k, t in tensors.items():
                    a = t.array
                    per_device = {{}}
                    for sh in a.addressable_shards:
                        per_device[str(sh.device.id)] = int(sh.data.nbytes)
                    entry["state"][f"{{group}}:{{k}}"] = dict(
                        devices=len(a.sharding.device_set), replicated=a.sharding.is_fully_replicated,
                        nbytes=int(a.nbytes), per_device=per_device, shape=list(a.shape))
            hlo = dist._spmd.last_compiled.as_text()
            entry["collectives"] = spmd.collectives(hlo)
            alias = hlo.split("input_output_alias={{", 1)[1].split("}}, entry", 1)[0] \\
                if "input_output_alias" in hlo else ""
            entry["aliased"] = alias.count("may-alias") + alias.count("must-alias")
            entry["grad_bytes"] = sum(int(p.array.nbytes) for p in net.get_params().values())
            params[name] = {{k: tensor.to_numpy(v) for k, v in net.get_params().items()}}
            if world > 1 and zero:  # a slot split over processes cannot be read by one
                report[name] = entry  # (see docs/distributed.md)
                continue
            # checkpoint round trip: save, step, load, step again = the same step
            ckpt = os.path.join(out_dir, f"ckpt{{rank}}_{{len(report)}}.zip")
            net.save_states(ckpt, aux_states=dist.get_states())
            step(STEPS - 1)  # the last batch again
            after = {{k: tensor.to_numpy(v) for k, v in net.get_states().items()}}
            aux = net.load_states(ckpt)
            dist.set_states(aux)
            restored = {{k: tensor.to_numpy(v) for k, v in net.get_states().items()}}
            entry["restored_equals_saved"] = all(
                np.array_equal(restored[k], params[name][k]) for k in params[name])
            step(STEPS - 1)  # the last batch again
            again = {{k: tensor.to_numpy(v) for k, v in net.get_states().items()}}
            entry["resumed_step_error"] = max(float(np.abs(again[k] - after[k]).max())
                                              for k in after)
            entry["resumed_sharding_devices"] = min(
                len(t.array.sharding.device_set)
                for t in list(net.get_states().values()) + list(slots.values()))
            report[name] = entry
        with open(os.path.join(out_dir, f"report{{rank}}.json"), "w") as f:
            json.dump(report, f)
        np.savez(os.path.join(out_dir, f"params{{rank}}.npz"),
                 **{{f"{{run}}|{{k}}": v for run, ps in params.items() for k, v in ps.items()}})

    if __name__ == "__main__":
        world, out_dir = int(sys.argv[2]), sys.argv[3]
        runs = [(k, o, z == "1") for k, o, z in (r.split(":") for r in sys.argv[4].split(","))]
        if world == 1:
            child(0, 1, None, runs, out_dir)
            sys.exit(0)
        from singa_jax.singa_wrap import NcclIdHolder
        holder = NcclIdHolder()
        ctx = multiprocessing.get_context("fork")
        procs = [ctx.Process(target=child, args=(r, world, holder, runs, out_dir))
                 for r in range(world)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(240)
        sys.exit(max(abs(p.exitcode or 0) for p in procs))
''').format(THRESHOLD=THRESHOLD, STEPS=STEPS, PER_RANK=PER_RANK_BATCH, LR=LR, MOMENTUM=MOMENTUM,
            SPARS=SPARS)


def launch(tmp_path, world, local_devices, runs):
    (tmp_path / "common.py").write_text(COMMON)
    (tmp_path / "worker.py").write_text(WORKER)
    path = os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, JAX_PLATFORMS="cpu", SINGA_JAX_DIST_TIMEOUT="60", PYTHONPATH=path,
               XLA_FLAGS=f"--xla_force_host_platform_device_count={local_devices}")
    proc = subprocess.run([sys.executable, str(tmp_path / "worker.py"), str(tmp_path / "common.py"),
                           str(world), str(tmp_path),
                           ",".join(f"{k}:{o}:{int(z)}" for k, o, z in runs)],
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    reports, params = [], []
    for rank in range(world):
        with open(tmp_path / f"report{rank}.json") as f:
            reports.append(json.load(f))
        data = np.load(tmp_path / f"params{rank}.npz")
        runs_of_rank = {}
        for key in data.files:
            run, name = key.split("|")
            runs_of_rank.setdefault(run, {})[name] = data[key]
        params.append(runs_of_rank)
    return reports, params


def check_placement(entry, zero, what):
    devices = entry["devices"]
    assert entry["moved_last_step"] == 0, f"{what}: a steady-state step placed state on the mesh"
    slot_total, per_device = 0, {}
    for name, s in entry["state"].items():
        assert s["devices"] == devices, f"{what}: {name} spans {s['devices']} of {devices} devices"
        if name.startswith("slot:"):
            slot_total += s["nbytes"]
            for d, n in s["per_device"].items():
                per_device[d] = per_device.get(d, 0) + n
            if zero and any(n % devices == 0 for n in s["shape"]):
                assert not s["replicated"], f"{what}: {name} is not sharded"
                continue
        assert s["replicated"], f"{what}: {name} is not replicated"
    assert slot_total > 0 and per_device
    return slot_total, per_device


def check_collectives(entry, option, zero, what):
    kinds = {}
    for c in entry["collectives"]:
        kinds[c["kind"]] = kinds.get(c["kind"], 0) + c["bytes"]
    grads = entry["grad_bytes"]
    # besides the gradients: the loss, the logits gathered to the rank's batch, a non-finite
    # count (ZeRO), batch-norm statistics averaged over a rank's devices: small
    small = 4096
    assert "collective-permute" not in kinds and "all-to-all" not in kinds, (what, kinds)
    if zero:
        assert kinds.get("reduce-scatter", 0) > 0 and kinds.get("all-gather", 0) > 0, (what, kinds)
        # every parameter's update is split here (Net's conv.W, 3x1x3x3, stays whole on 4)
        assert kinds.get("all-reduce", 0) <= grads + small, (what, kinds)
        assert kinds["reduce-scatter"] <= grads, (what, kinds)
    elif option == "plain":
        assert set(kinds) <= {"all-reduce", "all-gather"}, (what, kinds)
        assert grads <= kinds["all-reduce"] <= grads + small, (what, kinds)
        assert kinds.get("all-gather", 0) <= small, (what, kinds)  # the logits only
    # donated: every parameter and slot buffer is an input/output alias of the step
    n_state = len(entry["state"]) + 1  # + the step counter
    assert entry["aliased"] >= n_state - 1, (what, entry["aliased"], n_state)


def check_checkpoint(entry, what):
    assert entry["restored_equals_saved"], what
    assert entry["resumed_step_error"] <= 1e-6, (what, entry["resumed_step_error"])
    assert entry["resumed_sharding_devices"] == entry["devices"], what


def check_numbers(params, world, runs, what):
    init = params[0][f"{runs[0][0]}/{runs[0][1]}/{int(runs[0][2])}/init"]
    with precision.float32_matmul_precision_scope("float32"):
        plain = single_device_training(init, world)
        sims = {}
        for kind, option, zero in runs:
            if kind != "net":
                continue
            name = f"{kind}/{option}/{int(zero)}"
            for r in range(world):
                got = params[r][name]
                if option == "plain":
                    assert_params_close(got, plain, 1e-5, f"{what} {name} rank {r}")
                else:
                    if option not in sims:
                        sims[option] = simulate(init, world, option)
                    tol = HALF_TOLERANCE if option == "half" else 1e-5
                    assert_params_close(got, sims[option][r], tol, f"{what} {name} rank {r}")


def test_one_process_four_devices_state_lives_on_the_mesh(tmp_path):
    runs = [("net", "plain", False), ("net", "sparseThreshold", False),
            ("net", "plain", True), ("net", "half", True),
            ("bn", "plain", False), ("bn", "plain", True)]
    reports, params = launch(tmp_path, 1, 4, runs)
    report = reports[0]
    measured = {}
    for kind, option, zero in runs:
        name = f"{kind}/{option}/{int(zero)}"
        entry = report[name]
        total, per_device = check_placement(entry, zero, name)
        check_collectives(entry, option, zero, name)
        if not option.startswith("sparse"):  # DistOpt's residuals are not SINGA checkpoint state
            check_checkpoint(entry, name)
        measured[name] = (total, per_device)
    check_numbers(params, 1, runs, "1x4")
    # ZeRO-1: a device holds a quarter of the optimizer state (BNNet: every slot splits on 4)
    total, per_device = measured["bn/plain/1"]
    assert sorted(per_device) == ["0", "1", "2", "3"]
    assert all(n * 4 == total for n in per_device.values()), (total, per_device)
    assert measured["bn/plain/0"][0] == total
    assert all(n == total for n in measured["bn/plain/0"][1].values())
    # ZeRO and plain: the same numbers (BN included: per device in both)
    for k, v in params[0]["bn/plain/0"].items():
        np.testing.assert_allclose(params[0]["bn/plain/1"][k], v, rtol=1e-5, atol=1e-5,
                                   err_msg=k)


def test_two_processes_two_devices_state_lives_on_the_mesh(tmp_path):
    runs = [("net", "plain", False), ("net", "plain", True), ("bn", "plain", True)]
    reports, params = launch(tmp_path, 2, 2, runs)
    for rank in range(2):
        for kind, option, zero in runs:
            name = f"{kind}/{option}/{int(zero)}"
            entry = reports[rank][name]
            assert entry["devices"] == 4
            total, per_device = check_placement(entry, zero, f"rank {rank} {name}")
            check_collectives(entry, option, zero, f"rank {rank} {name}")
            if not zero:
                check_checkpoint(entry, f"rank {rank} {name}")
            if kind == "bn" and zero:  # this rank's two devices: a quarter each
                assert len(per_device) == 2 and all(n * 4 == total for n in per_device.values())
    check_numbers(params, 2, runs, "2x2")


def test_shard_optimizer_state_argument_and_unsupported_options():
    from singa_jax import opt
    with pytest.raises(TypeError, match="shard_optimizer_state must be a bool"):
        opt.DistOpt(opt.SGD(), shard_optimizer_state="yes")
    d = opt.DistOpt(opt.SGD(), shard_optimizer_state=True)
    assert d.shard_optimizer_state is True
