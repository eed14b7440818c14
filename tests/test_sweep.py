"""Sweeps: the grid syntax, members that reproduce their own runs, sharding over devices, the CLI's files."""

import json
import shutil
import socket
import subprocess
import sys

import jax
import numpy as np
import pytest
from conftest import with_cpu_devices

from ftw_jax import cli
from ftw_jax.lab.sweep import make_sweep, parse_grid, run_sweep
from ftw_jax.lab.train import TrainConfig, make_train
from ftw_jax.running.checkpoints import Checkpointer

pytestmark = pytest.mark.usefixtures("unchecked_key_reuse")
TINY = dict(num_iterations=6, eval_every=3, episodes_per_iteration=4, eval_episodes=4)


def test_parse_grid():
    assert parse_grid("C=4,5,8 K=1,2 kl=0.01,0.05 lr=1e-3 J=8") == {
        "C": [4, 5, 8],
        "K": [1, 2],
        "kl": [0.01, 0.05],
        "lr": [0.001],
        "J": [8],
    }
    for text, message in [("M=4", "AXIS"), ("C=4 C=5", "twice"), ("C=4.5", "ints"), ("", "empty"), ("C", "AXIS")]:
        with pytest.raises(ValueError, match=message):
            parse_grid(text)


def test_make_sweep_takes_the_maxima_and_rejects_bad_points():
    sweep = make_sweep("cartpole", parse_grid("C=4,8 K=1,3 kl=0,0.1"), seeds=[0, 1, 2], **TINY)
    assert len(sweep.members) == 2 * 2 * 2 * 3
    sizes = sweep.config.algorithm_config
    assert (sizes.batch_size, sizes.num_elites, sizes.num_batches) == (8, 3, 16)
    assert sweep.members[0] == {"N": 64, "J": 16, "C": 4, "K": 1, "kl": 0.0, "lr": 3e-3, "seed": 0}
    with pytest.raises(ValueError, match=r"grid point \{'C': 4, 'K': 5\}: num_elites \(K=5\)"):
        make_sweep("cartpole", parse_grid("C=4 K=5"), seeds=[0], **TINY)
    with pytest.raises(ValueError, match=r"grid point \{'N': 3\}: batch_size \(C=8\) must be <= pool_size \(N=3\)"):
        make_sweep("cartpole", parse_grid("N=3,64"), seeds=[0], **TINY)
    with pytest.raises(ValueError, match=r"grid point \{'N': 4, 'C': 4\}: episodes_per_iteration \(B=8\)"):
        make_sweep("cartpole", parse_grid("N=4 C=4"), seeds=[0], **{**TINY, "episodes_per_iteration": 8})
    with pytest.raises(ValueError, match=r"grid point \{'lr': 0.0\}: learning_rate must be > 0"):
        make_sweep("cartpole", parse_grid("lr=0"), seeds=[0], **TINY)
    with pytest.raises(ValueError, match="grid axis 'C' is not a setting of ppo"):
        make_sweep("cartpole", parse_grid("C=4"), seeds=[0], algorithm="ppo", **TINY)


@pytest.fixture(scope="module")
def small_sweep(tmp_path_factory):
    """A 24-member CartPole sweep, checkpointed after each of its two periods (into `checkpoints`)."""
    sweep = make_sweep("cartpole", parse_grid("C=4,8 K=1,2 kl=0,0.5"), seeds=[0, 1, 2], **TINY)
    checkpoints = tmp_path_factory.mktemp("checkpoints")
    checkpointer = Checkpointer(checkpoints, {"test": 1})
    with jax.debug_key_reuse(False):  # the checker's false positive on vmapped scans (conftest)
        results = run_sweep(sweep, checkpointer=checkpointer)
    checkpointer.close()
    return sweep, results, checkpoints


@pytest.mark.slow
def test_members_reproduce_their_own_runs(small_sweep):
    sweep, results, _ = small_sweep
    assert results["return"].shape == (len(sweep.members), 2)
    trainer = make_train(sweep.config)
    hyperparameters = sweep.hyperparameters()
    for index in (0, 5, len(sweep.members) - 1):
        member = jax.tree.map(lambda leaf: leaf[index], hyperparameters)  # noqa: B023
        _, (_, evaluation) = trainer.train(sweep.keys()[index], member)
        np.testing.assert_allclose(results["return"][index], evaluation["return"], rtol=1e-5)
    # A member at the maxima is the plain run of its config.
    top = len(sweep.members) - 1
    assert sweep.members[top] == {"N": 64, "J": 16, "C": 8, "K": 2, "kl": 0.5, "lr": 3e-3, "seed": 2}
    alone = make_train(TrainConfig.for_env("cartpole", **TINY, batch_size=8, num_elites=2, kl_coef=0.5))
    _, (_, evaluation) = alone.train(jax.random.key(2))
    np.testing.assert_allclose(results["return"][top], evaluation["return"], rtol=1e-5)
    # Different grid points differ.
    assert len({tuple(row) for row in results["return"]}) > len(sweep.members) // 2


@pytest.mark.slow
def test_a_member_with_a_smaller_pool_reproduces_its_own_run():
    # 24 pulls through pools of 8 and 16; C = 2, J·K = 4: Floyd subsets (C² <= N) and the gather path
    # (J·K < N) for both N, so the 8-slot member gives the very numbers of a run with N = 8.
    settings = dict(num_iterations=24, eval_every=12, pool_capacity=8, batch_size=2, num_batches=4, num_elites=1)
    sweep = make_sweep("bandit", parse_grid("N=8,16"), seeds=[3], **settings)
    assert sweep.config.algorithm_config.pool_capacity == 16
    results = run_sweep(sweep, metric_names=("pool_filled",))
    _, (metrics, evaluation) = make_train(TrainConfig.for_env("bandit", **settings)).train(jax.random.key(3))
    np.testing.assert_allclose(results["return"][0], evaluation["return"], rtol=1e-6)
    np.testing.assert_allclose(results["train_return"][0], metrics["return_mean"][:, -1], rtol=1e-6)
    # Per-iteration metrics on request: pools fill one pull per iteration up to their own capacity.
    np.testing.assert_array_equal(results["metrics/pool_filled"], np.minimum(np.arange(1, 25), [[8], [16]]))
    assert not np.allclose(results["return"][0], results["return"][1])


@pytest.mark.slow
def test_a_sweep_resumes_from_its_last_checkpoint(small_sweep):
    sweep, results, checkpoints = small_sweep
    assert sorted(path.name for path in checkpoints.iterdir()) == ["1", "2"]
    shutil.rmtree(checkpoints / "2")  # as if killed during the second period
    periods_run = []
    checkpointer = Checkpointer(checkpoints, {"test": 1})
    resumed = run_sweep(sweep, lambda period, row: periods_run.append(period), checkpointer=checkpointer)
    checkpointer.close()
    assert periods_run == [1]
    for name in results:
        np.testing.assert_array_equal(resumed[name], results[name])


@pytest.mark.slow
def test_two_processes_of_five_devices_give_the_one_device_results(small_sweep, tmp_path):
    """jax.distributed on loopback, each process with 5 forced CPU devices: the 24 members are sharded over
    10 devices (6 filler members, dropped) and gathered on process 0, which alone writes and reports."""
    sweep, results, _ = small_sweep
    with socket.socket() as probe:  # a free port for the coordinator
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    argv = [
        sys.executable,
        "-m",
        "ftw_jax.cli",
        "sweep",
        "--env",
        "cartpole",
        "--grid",
        "C=4,8 K=1,2 kl=0,0.5",
        "--seeds",
        "0,1,2",
        "--iterations",
        "6",
        "--eval-every",
        "3",
        "--episodes-per-iteration",
        "4",
        "--eval-episodes",
        "4",
        "--out",
        str(tmp_path),
        "--name",
        "two",
        "--coordinator",
        f"127.0.0.1:{port}",
        "--num-processes",
        "2",
        "--json",
    ]
    env = with_cpu_devices(5)
    processes = [subprocess.Popen([*argv, "--process-id", str(i)], env=env, stdout=subprocess.PIPE) for i in (0, 1)]
    outputs = [process.communicate(timeout=600)[0] for process in processes]
    assert [process.returncode for process in processes] == [0, 0]
    assert json.loads(outputs[0])["devices"] == 10 and outputs[1] == b""
    curves = np.load(tmp_path / "two" / "curves.npz")
    for name in results:
        np.testing.assert_array_equal(curves[name], results[name])


@pytest.mark.slow
def test_sweep_cli_writes_the_table_curves_and_heatmap(capsys, tmp_path):
    argv = [
        "sweep",
        "--env",
        "cartpole",
        "--grid",
        "C=4,8 K=1,2",
        "--seeds",
        "0,1",
        "--iterations",
        "6",
        "--eval-every",
        "3",
        "--episodes-per-iteration",
        "4",
        "--eval-episodes",
        "4",
        "--out",
        str(tmp_path),
        "--json",
    ]
    assert cli.main(argv) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["metric"] == "return" and len(summary["points"]) == 4
    (folder,) = tmp_path.iterdir()
    assert {p.name for p in folder.iterdir()} >= {
        "config.json",
        "results.csv",
        "curves.npz",
        "heatmap.png",
        "summary.json",
    }
    rows = (folder / "results.csv").read_text().splitlines()
    assert rows[0].startswith("N,J,C,K,kl,lr,seed,final_return") and len(rows) == 1 + 4 * 2
    curves = np.load(folder / "curves.npz")
    assert curves["return"].shape == (8, 2) and list(curves["member_C"]) == [4, 4, 4, 4, 8, 8, 8, 8]
    # TensorBoard: one run per member, named by its grid point and seed.
    assert sorted(path.name for path in (folder / "tensorboard").iterdir()) == [
        f"C={c},K={k},seed={seed}" for c in (4, 8) for k in (1, 2) for seed in (0, 1)
    ]
    means = {(p["C"], p["K"]): p["mean"] for p in summary["points"]}
    np.testing.assert_allclose(means[(4, 1)], curves["return"][:2, -1].mean())
    assert cli.main(["sweep", "--env", "cartpole", "--grid", "C=4 K=9", "--out", str(tmp_path)]) == 2
    assert "K=9" in capsys.readouterr().err


# The bandit, 30 pulls: every member's sizes keep Floyd's subsets (C² <= N = 128) and the gather path
# (J·K < N), as its own run's do, so member and standalone run draw the very same numbers.
STANDALONE = dict(num_iterations=30, eval_every=15)


@pytest.mark.slow
def test_every_member_is_its_standalone_run_in_its_training_metrics():
    """Members that differ from a base member in one setting each (C, K, β, learning rate) against runs
    launched on their own with those settings: per-iteration loss, KL and gradient norm, which every one of
    those settings moves."""
    sweep = make_sweep("bandit", parse_grid("C=3,5 K=1,2 kl=0.05,0.5 lr=0.03,0.3"), seeds=[11], **STANDALONE)
    names = ("loss", "kl", "grad_norm")
    results = run_sweep(sweep, metric_names=names)
    index = {tuple(member[axis] for axis in ("C", "K", "kl", "lr")): i for i, member in enumerate(sweep.members)}
    base = (3, 1, 0.05, 0.03)
    checked = [base, (5, 1, 0.05, 0.03), (3, 2, 0.05, 0.03), (3, 1, 0.5, 0.03), (3, 1, 0.05, 0.3)]
    for C, K, kl, lr in checked:
        config = TrainConfig.for_env("bandit", **STANDALONE, batch_size=C, num_elites=K, kl_coef=kl, learning_rate=lr)
        _, (metrics, evaluation) = make_train(config).train(jax.random.key(11))
        member = index[(C, K, kl, lr)]
        for name in names:
            np.testing.assert_allclose(
                results[f"metrics/{name}"][member],
                np.ravel(metrics[name]),
                rtol=1e-5,
                atol=1e-7,
                err_msg=f"{name} of member C={C} K={K} kl={kl} lr={lr}",
            )
        np.testing.assert_allclose(results["return"][member], evaluation["return"], rtol=1e-5)
        if (C, K, kl, lr) != base:  # the setting changed the numbers, so the comparison can tell
            assert np.abs(results["metrics/loss"][member] - results["metrics/loss"][index[base]]).max() > 1e-3


def test_distributed_joins_the_cluster_that_jax_detects(monkeypatch, tmp_path, capsys):
    """`--distributed` calls jax.distributed.initialize() with no arguments (jax reads SLURM's or Open MPI's
    variables), then acts on the process count it finds: two processes need a shared --name."""
    calls = []
    monkeypatch.setattr(jax.distributed, "initialize", lambda *args, **kwargs: calls.append((args, kwargs)))
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    assert cli.main(["sweep", "--env", "bandit", "--grid", "C=2", "--out", str(tmp_path), "--distributed"]) == 2
    assert calls == [((), {})] and "needs --name" in capsys.readouterr().err
