"""Where DistOpt's state lives on the mesh and what a graph-mode step moves, read from the SPMD
program. (This tier imports singa_jax._src.)"""
import json
import os
import subprocess
import sys
import textwrap
import numpy as np
from test_dist import (COMMON, HALF_TOLERANCE, LR, MOMENTUM, PER_RANK_BATCH, REPO, SPARS, STEPS,
                       THRESHOLD, assert_params_close, simulate, single_device_training)
from singa_jax import precision



WORKER = textwrap.dedent('''
    import json, multiprocessing, os, sys
    import numpy as np
    THRESHOLD, STEPS, PER_RANK, LR, MOMENTUM = {THRESHOLD}, {STEPS}, {PER_RANK}, {LR}, {MOMENTUM}
    SPARS = {SPARS!r}
    exec(open(sys.argv[1]).read())  # tests/test_dist.py's COMMON: Net, global_batches; bn_net

    def child(rank, world, holder, runs, out_dir):
        import jax
        from singa_jax import device, opt, tensor
        from singa_jax._src.dist import spmd
        moved = [0]
        place = spmd._SpmdProgram.place

        def counting_place(self, a, sharding):  # counts arrays put on the mesh
            out = place(self, a, sharding)
            moved[0] += out is not a
            return out
        spmd._SpmdProgram.place = counting_place
        report, params = {{}}, {{}}
        for kind, option, level in runs:
            sgd = opt.SGD(lr=LR, momentum=MOMENTUM)
            args = dict(nccl_id=holder, local_rank=rank, world_size=world) if holder else {{}}
            dist = opt.DistOpt(sgd, shard_optimizer_state=level >= 1,
                               shard_parameters=level == 2, **args)
            dev = device.get_default_device()
            dev.SetRandSeed(0)
            net = Net() if kind == "net" else bn_net()
            x, y = global_batches(world, STEPS, PER_RANK)
            tx = tensor.Tensor((PER_RANK, 1, 5, 5), dev)
            ty = tensor.Tensor((PER_RANK,), dev, tensor.int32)
            net.set_optimizer(dist)
            net.compile([tx], is_train=True, use_graph=True)
            name = f"{{kind}}/{{option}}/{{level}}"
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
            param_names = set(net.get_params())
            for group, tensors in (("model", net.get_states()), ("slot", slots)):
                for k, t in tensors.items():
                    a = t.array
                    per_device = {{}}
                    for sh in a.addressable_shards:
                        per_device[str(sh.device.id)] = int(sh.data.nbytes)
                    entry["state"][f"{{group}}:{{k}}"] = dict(
                        devices=len(a.sharding.device_set), replicated=a.sharding.is_fully_replicated,
                        nbytes=int(a.nbytes), per_device=per_device, shape=list(a.shape),
                        param=group == "model" and k in param_names)
            hlo = dist._spmd.last_compiled.as_text()
            entry["collectives"] = spmd.collectives(hlo)
            alias = hlo.split("input_output_alias={{", 1)[1].split("}}, entry", 1)[0] \\
                if "input_output_alias" in hlo else ""
            entry["aliased"] = alias.count("may-alias") + alias.count("must-alias")
            entry["grad_bytes"] = sum(int(p.array.nbytes) for p in net.get_params().values())
            entry["logits_bytes"] = PER_RANK * 4 * 4 if jax.local_device_count() > 1 else 0
            # (a value split over processes is gathered: every rank reads, in the same order)
            params[name] = {{k: tensor.to_numpy(v) for k, v in net.get_params().items()}}
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
            if kind == "bn":  # evaluation after training: graph mode, eager, one-device forward
                states = {{k: tensor.to_numpy(v) for k, v in net.get_states().items()}}
                ex = tensor.from_numpy(x[0, rows])
                net.eval()
                graph_out = tensor.to_numpy(net(ex))
                net.graph(False)
                eager_out = tensor.to_numpy(net(ex))
                net.graph(True)
                net.train()
                ref = bn_net()
                ref.compile([tx], is_train=False, use_graph=False)
                ref.set_states(states)
                ref.eval()
                want = tensor.to_numpy(ref(ex))
                entry["eval_error"] = max(float(np.abs(graph_out - want).max()),
                                          float(np.abs(eager_out - want).max()))
            report[name] = entry
        if world > 1 and runs[-1][2] >= 1:  # a rank reading a value split over processes
            os.environ["SINGA_JAX_DIST_TIMEOUT"] = "3"  # alone: an error, not a hang
            if rank == 0:
                try:
                    tensor.to_numpy(next(t for t in slots.values()
                                         if not t.array.is_fully_addressable))
                    report["lone_read"] = "no error"
                except TimeoutError as e:
                    report["lone_read"] = str(e)
        with open(os.path.join(out_dir, f"report{{rank}}.json"), "w") as f:
            json.dump(report, f)
        np.savez(os.path.join(out_dir, f"params{{rank}}.npz"),
                 **{{f"{{run}}|{{k}}": v for run, ps in params.items() for k, v in ps.items()}})

    if __name__ == "__main__":
        world, out_dir = int(sys.argv[2]), sys.argv[3]
        runs = [(k, o, int(z)) for k, o, z in (r.split(":") for r in sys.argv[4].split(","))]
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


BN_NET = textwrap.dedent('''
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
''')


def launch(tmp_path, world, local_devices, runs):
    (tmp_path / "common.py").write_text(COMMON + BN_NET)
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


def check_placement(entry, level, what):
    """Every state array spans all devices; slots (level >= 1) and parameters (level 2) with
    a dimension divisible by the device count are split, the rest replicated. Returns the
    slots' and the parameters' (total bytes, bytes per device)."""
    devices = entry["devices"]
    assert entry["moved_last_step"] == 0, f"{what}: a steady-state step placed state on the mesh"
    totals = {"slot": [0, {}], "param": [0, {}]}
    for name, s in entry["state"].items():
        assert s["devices"] == devices, f"{what}: {name} spans {s['devices']} of {devices} devices"
        group = "slot" if name.startswith("slot:") else "param" if s["param"] else None
        if group is not None:
            totals[group][0] += s["nbytes"]
            for d, n in s["per_device"].items():
                totals[group][1][d] = totals[group][1].get(d, 0) + n
        split = (group == "slot" and level >= 1) or (group == "param" and level == 2)
        if split and any(n % devices == 0 for n in s["shape"]):
            assert not s["replicated"], f"{what}: {name} is not sharded"
            continue
        assert s["replicated"], f"{what}: {name} is not replicated"
    assert all(total > 0 and per_device for total, per_device in totals.values())
    return {group: tuple(v) for group, v in totals.items()}


def check_collectives(entry, option, level, what):
    kinds = {}
    for c in entry["collectives"]:
        kinds[c["kind"]] = kinds.get(c["kind"], 0) + c["bytes"]
    grads = entry["grad_bytes"]
    devices = entry["devices"]
    # the parameters whose update is split over the devices (Net's conv.W, 3x1x3x3, stays whole
    # on 4): ZeRO all-gathers them after the update, FSDP before the forward; nothing else moves
    # parameters
    split = sum(s["nbytes"] for s in entry["state"].values()
                if s["param"] and any(n % devices == 0 for n in s["shape"]))
    logits = entry["logits_bytes"]  # the rank's results gathered from its devices
    # besides the gradients: the loss, a non-finite count (ZeRO), batch-norm statistics averaged
    # over a rank's devices, the optimizer's guard report: small
    small = 4096
    assert "collective-permute" not in kinds and "all-to-all" not in kinds, (what, kinds)
    if level:
        assert 0 < kinds.get("reduce-scatter", 0) <= grads, (what, kinds)
        assert kinds.get("all-gather", 0) == split + logits, (what, kinds, split, logits)
        assert kinds.get("all-reduce", 0) <= grads - split + small, (what, kinds)
    elif option == "plain":
        assert set(kinds) <= {"all-reduce", "all-gather"}, (what, kinds)
        assert grads <= kinds["all-reduce"] <= grads + small, (what, kinds)
        assert kinds.get("all-gather", 0) == logits, (what, kinds)  # the logits only
    # donated: every parameter and slot buffer is an input/output alias of the step
    n_state = len(entry["state"]) + 1  # + the step counter
    assert entry["aliased"] >= n_state - 1, (what, entry["aliased"], n_state)


def check_checkpoint(entry, what):
    assert entry["restored_equals_saved"], what
    assert entry["resumed_step_error"] <= 1e-6, (what, entry["resumed_step_error"])
    assert entry["resumed_sharding_devices"] == entry["devices"], what
    if "eval_error" in entry:  # evaluation after training = a one-device forward
        assert entry["eval_error"] <= 1e-5, (what, entry["eval_error"])


def check_numbers(params, world, runs, what):
    init = params[0][f"{runs[0][0]}/{runs[0][1]}/{runs[0][2]}/init"]
    with precision.float32_matmul_precision_scope("float32"):
        plain = single_device_training(init, world)
        sims = {}
        for kind, option, level in runs:
            if kind != "net":
                continue
            name = f"{kind}/{option}/{level}"
            for r in range(world):
                got = params[r][name]
                if option == "plain":
                    assert_params_close(got, plain, 1e-5, f"{what} {name} rank {r}")
                else:
                    if option not in sims:
                        sims[option] = simulate(init, world, option)
                    tol = HALF_TOLERANCE if option == "half" else 1e-5
                    assert_params_close(got, sims[option][r], tol, f"{what} {name} rank {r}")


def check_quarters(measured, group, devices, what):
    """A device holds exactly total / devices of ``group`` (BNNet: every array splits on 4)."""
    total, per_device = measured[group]
    assert len(per_device) == devices and all(n * 4 == total for n in per_device.values()), \
        (what, group, total, per_device)


def test_one_process_four_devices_state_lives_on_the_mesh(tmp_path):
    runs = [("net", "plain", 0), ("net", "sparseThreshold", 0),
            ("net", "plain", 1), ("net", "half", 1), ("net", "plain", 2), ("net", "half", 2),
            ("bn", "plain", 0), ("bn", "plain", 1), ("bn", "plain", 2)]
    reports, params = launch(tmp_path, 1, 4, runs)
    report = reports[0]
    measured = {}
    for kind, option, level in runs:
        name = f"{kind}/{option}/{level}"
        entry = report[name]
        measured[name] = check_placement(entry, level, name)
        check_collectives(entry, option, level, name)
        if not option.startswith("sparse"):  # DistOpt's residuals are not SINGA checkpoint state
            check_checkpoint(entry, name)
    check_numbers(params, 1, runs, "1x4")
    # ZeRO-1: a device holds a quarter of the optimizer state; FSDP: of the parameters too
    check_quarters(measured["bn/plain/1"], "slot", 4, "ZeRO-1")
    check_quarters(measured["bn/plain/2"], "slot", 4, "FSDP")
    check_quarters(measured["bn/plain/2"], "param", 4, "FSDP")
    for group in ("slot", "param"):  # replicated: every device holds everything
        total, per_device = measured["bn/plain/0"][group]
        assert total == measured["bn/plain/2"][group][0]
        assert all(n == total for n in per_device.values())
    # sharded or not: the same numbers (BN included: per device in all)
    for level in (1, 2):
        for k, v in params[0]["bn/plain/0"].items():
            np.testing.assert_allclose(params[0][f"bn/plain/{level}"][k], v, rtol=1e-5,
                                       atol=1e-5, err_msg=f"level {level}: {k}")


def test_two_processes_two_devices_state_lives_on_the_mesh(tmp_path):
    runs = [("net", "plain", 0), ("net", "plain", 1), ("net", "plain", 2),
            ("bn", "plain", 1), ("bn", "plain", 2)]
    reports, params = launch(tmp_path, 2, 2, runs)
    for rank in range(2):
        for kind, option, level in runs:
            name = f"{kind}/{option}/{level}"
            entry = reports[rank][name]
            assert entry["devices"] == 4
            measured = check_placement(entry, level, f"rank {rank} {name}")
            check_collectives(entry, option, level, f"rank {rank} {name}")
            # values split over both processes: read, saved and loaded whole
            check_checkpoint(entry, f"rank {rank} {name}")
            if kind == "bn":  # this rank's two devices: a quarter each
                check_quarters(measured, "slot", 2, f"rank {rank} {name}")
                if level == 2:
                    check_quarters(measured, "param", 2, f"rank {rank} {name}")
    check_numbers(params, 2, runs, "2x2")
    for rank in range(2):
        for k, v in params[rank]["bn/plain/1"].items():
            np.testing.assert_allclose(params[rank]["bn/plain/2"][k], v, rtol=1e-5, atol=1e-5,
                                       err_msg=f"rank {rank} FSDP vs ZeRO-1: {k}")
    # a rank reading a split value alone: a TimeoutError naming the rank that did not read
    lone = reports[0]["lone_read"]
    assert "rank(s) [1]" in lone and "every rank must read it" in lone, lone
