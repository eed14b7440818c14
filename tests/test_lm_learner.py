"""The LLM learner: the episode schema and its validator, token trajectories, per-token versions, the JSONL
learner against the in-process one, versioned weights, resume."""

import dataclasses
import json
import pathlib
import re
import shutil
import threading
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from conftest import with_cpu_devices
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from ftw_jax import cli
from ftw_jax.agent.episodes import (
    check_versions,
    episode_records,
    parse_episode,
    to_trajectories,
    write_episodes,
)
from ftw_jax.agent.feed import read_episodes
from ftw_jax.agent.learner import EpisodeLearner, LearnConfig, token_trajectory_spec
from ftw_jax.algos.ftw import FTWConfig
from ftw_jax.core import diagnostics
from ftw_jax.core.elite_loss import make_loss
from ftw_jax.envs.text_search import TextSearchTask
from ftw_jax.lab.rollout import Player, rollouts
from ftw_jax.lm import load
from ftw_jax.lm.config import tiny_config
from ftw_jax.lm.load import save
from ftw_jax.policies.lm import as_policy_params
from ftw_jax.running import checkpoints, memory

ENV = TextSearchTask(step_limit=48)
MAX_LENGTH = ENV.max_steps + 1
GOOD = {
    "tokens": [1, 9, 10, 7, 30, 8],
    "spans": [{"start": 3, "end": 6, "version": 2, "logprobs": [-0.5, -1.0, -0.1]}],
    "reward": 1.0,
    "id": "a",
}


def small_config(**changes) -> LearnConfig:
    settings = dict(
        max_length=MAX_LENGTH,
        episodes_per_iteration=8,
        learning_rate=1e-3,
        kl_coef=0.1,
        algorithm_config=FTWConfig(
            pool_capacity=16, num_batches=4, batch_size=4, num_elites=1, updates_per_iteration=2, monitor_entries=4
        ),
    )
    return LearnConfig(**{**settings, **changes})


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory) -> pathlib.Path:
    """A tiny random Qwen2-shaped checkpoint over the text search task's words, with its tokenizer.json."""
    folder = tmp_path_factory.mktemp("model") / "tiny"
    config = tiny_config(ENV.vocabulary_size)
    from ftw_jax.lm.model import CausalLM

    params = CausalLM(config).init(jax.random.key(0), jnp.zeros((1, 4), jnp.int32))
    save(folder, config, params)
    ENV.tokenizer().backend.save(str(folder / "tokenizer.json"))
    return folder


@pytest.fixture(scope="module")
def engine(model_folder):
    """(learner, the model's params, 24 episodes [24, T] the tiny model played in the text search task): the
    in-process engine, its rollout compiled once for the module."""
    model, params = load(model_folder)
    learner = EpisodeLearner.build(small_config(), model.config)
    with jax.debug_key_reuse(False):  # a vmapped scan over split keys (see conftest's unchecked_key_reuse)
        player = Player(ENV, (), learner.policy, as_policy_params(params), jnp.int32(0))
        trajectories, _ = jax.jit(rollouts, static_argnums=2)(jax.random.key(0), player, 24)
    return learner, params, trajectories


def played(engine, num_episodes):
    """The engine's learner, the model's params and its first `num_episodes` episodes."""
    learner, params, trajectories = engine
    return learner, params, jax.tree.map(lambda leaf: leaf[:num_episodes], trajectories)


# ------------------------------------------------------------------------------------------ schema, validator


def test_a_good_line_parses_into_per_token_fields():
    episode = parse_episode(json.dumps(GOOD), vocab_size=64, max_length=8)
    assert episode.tokens.tolist() == GOOD["tokens"] and episode.id == "a"
    assert episode.written.tolist() == [False, False, False, True, True, True]
    np.testing.assert_array_equal(episode.logprobs, np.float32([0, 0, 0, -0.5, -1.0, -0.1]))
    assert episode.versions.tolist() == [0, 0, 0, 2, 2, 2]


@pytest.mark.parametrize(
    "change, field",
    [
        (dict(reward=None), "reward"),
        (dict(tokens=[1, 9, 99]), "tokens[2]"),
        (dict(tokens=list(range(1, 10))), "tokens"),  # longer than max_length 8
        (dict(spans=[{"start": 0, "end": 2, "version": 0, "logprobs": [-1, -1]}]), "spans[0]"),  # the first token
        (
            dict(
                spans=[
                    {"start": 3, "end": 5, "version": 0, "logprobs": [-1, -1]},
                    {"start": 4, "end": 6, "version": 0, "logprobs": [-1, -1]},
                ]
            ),
            "spans[1]",
        ),  # overlapping
        (dict(spans=[{"start": 3, "end": 6, "version": 0, "logprobs": [-1]}]), "spans[0].logprobs"),
        (dict(spans=[{"start": 3, "end": 4, "version": 0, "logprobs": [0.5]}]), "spans[0].logprobs"),
        (dict(spans=[{"start": 3, "end": 4, "version": -1, "logprobs": [-1]}]), "spans[0].version"),
        # Issue 35: numbers that become infinite in float32, and an episode with nothing the model wrote.
        (dict(reward=1e300), "reward"),
        (dict(spans=[{"start": 3, "end": 4, "version": 0, "logprobs": [-1e300]}]), "spans[0].logprobs"),
        (dict(spans=[]), "spans"),
    ],
)
def test_a_bad_field_is_named(change, field):
    with pytest.raises(ValueError, match=f"^{field.replace('[', '.').replace(']', '.')}"):
        parse_episode(json.dumps({**GOOD, **change}), vocab_size=64, max_length=8)


def test_a_bad_line_is_named_by_number_and_refused_or_skipped(tmp_path):
    path = tmp_path / "episodes.jsonl"
    path.write_text(
        "\n".join(
            [
                json.dumps(GOOD),
                "{not json",
                json.dumps({k: v for k, v in GOOD.items() if k != "reward"}),
                "",
                json.dumps(GOOD),
            ]
        )
        + "\n"
    )
    with pytest.raises(ValueError, match=r"episodes.jsonl:2: not JSON"):
        read_episodes(path, vocab_size=64, max_length=8)
    episodes, report = read_episodes(path, vocab_size=64, max_length=8, skip_bad_lines=True)
    assert len(episodes) == 2 and report.kept == 2
    assert [problem.split(": ", 1)[0][-1] for problem in report.skipped] == ["2", "3"]
    assert "reward: missing" in report.skipped[1]


# ---------------------------------------------------------------------------------------- token trajectories


@pytest.mark.slow
def test_rollout_episodes_survive_the_jsonl_round_trip(engine, tmp_path):
    _, _, trajectories = played(engine, 16)
    path = tmp_path / "episodes.jsonl"
    assert write_episodes(path, episode_records(trajectories)) == 16
    episodes, _ = read_episodes(path, vocab_size=ENV.vocabulary_size, max_length=MAX_LENGTH)
    back = to_trajectories(episodes, MAX_LENGTH)
    alive = np.asarray(trajectories.alive)
    np.testing.assert_array_equal(back.alive, alive)
    for name in ("observation", "action", "mask", "behaviour_logp", "reward"):
        np.testing.assert_array_equal(
            np.where(alive, getattr(back, name), 0),
            np.where(alive, np.asarray(getattr(trajectories, name)), 0),
            err_msg=name,
        )
    np.testing.assert_array_equal(back.episode_return, trajectories.episode_return)
    assert np.asarray(trajectories.mask).any() and not np.asarray(trajectories.mask).all()  # both kinds of token


@pytest.mark.slow
def test_changing_an_environment_tokens_target_changes_no_gradient(engine):
    """The loss mask: a step whose next token the environment wrote contributes nothing, whatever that token."""
    learner, params, trajectories = played(engine, 4)
    loss = make_loss(learner.policy.apply, learner.config.algorithm_config)
    start = as_policy_params(params)
    grads = jax.jit(lambda batch: jax.grad(lambda p: loss(p, start, 0.1, batch, jnp.ones(4))[0])(start))
    base = grads(trajectories)
    forced = np.argwhere(np.asarray(trajectories.alive & ~trajectories.mask))
    written = np.argwhere(np.asarray(trajectories.mask))
    for (row, step), expect_same in ((forced[3], True), (written[0], False)):
        action = trajectories.action.at[row, step].set((trajectories.action[row, step] + 1) % ENV.vocabulary_size)
        changed = grads(trajectories.replace(action=action))
        same = all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(base), jax.tree.leaves(changed)))
        assert same == expect_same


def test_a_resume_compares_the_files_paths_resolve_to(tmp_path, monkeypatch):
    """Issue 32: the same episodes file and model folder named relative, then absolute, are one configuration
    (a run folder written before paths were resolved included); another file is not."""
    monkeypatch.chdir(tmp_path)
    stored = {"episodes": "episodes.jsonl", "model": "models/tiny", "seed": 0}
    same = {"episodes": str(tmp_path / "episodes.jsonl"), "model": str(tmp_path / "models" / "tiny"), "seed": 0}
    assert checkpoints.config_differences(stored, same) == []
    assert checkpoints.config_differences(stored, {**same, "model": "models/other"}) == [
        f"model: {str(tmp_path / 'models' / 'tiny')!r} -> {str(tmp_path / 'models' / 'other')!r}"
    ]


@pytest.mark.parametrize(
    "text, message",
    [
        (b'{"tokens": [1, 9], "id": "\xff"}', "episodes.jsonl:2: not UTF-8 text (byte 0xff at column 27)"),
        (b'{"tokens": [1, 9], "id": "abc', "episodes.jsonl:2: not JSON (Unterminated string starting at column 26)"),
        (b'{"tokens": [1, 9', "episodes.jsonl:2: not JSON (Expecting ',' delimiter at column 17)"),
    ],
)
def test_a_line_that_is_not_utf8_or_json_is_named_with_its_column(tmp_path, text, message):
    path = tmp_path / "episodes.jsonl"
    path.write_bytes(json.dumps(GOOD).encode() + b"\n" + text + b"\n")
    with pytest.raises(ValueError, match=r"^" + re.escape(str(tmp_path / message))):
        read_episodes(path, vocab_size=64, max_length=8)


@pytest.mark.parametrize("damage", ["half", "40 bytes", "random bytes", "config.json"])
def test_a_damaged_checkpoint_is_refused_naming_its_file(model_folder, tmp_path, damage):
    folder = tmp_path / "model"
    shutil.copytree(model_folder, folder)
    weights = folder / "model.safetensors"
    data = weights.read_bytes()
    if damage == "config.json":
        (folder / "config.json").write_text('{"vocab_size": 64,\n "hidden_size": \x01}')
        expected = f"{folder / 'config.json'}:2: not JSON (Expecting value at column 17)."
    else:
        cut = {
            "half": data[: len(data) // 2],
            "40 bytes": data[:40],
            "random bytes": np.random.default_rng(0).bytes(5000),
        }
        weights.write_bytes(cut[damage])
        expected = f"{weights} is not a readable safetensors file ("
    with pytest.raises(ValueError) as refused:
        load(folder)
    assert str(refused.value).startswith(expected) and "\n" not in str(refused.value)


@pytest.mark.parametrize("dtype", [np.int32, np.int8, np.float64])
def test_a_checkpoint_of_integer_or_other_tensors_is_refused_naming_file_and_tensor(model_folder, tmp_path, dtype):
    from safetensors.numpy import load_file, save_file

    folder = tmp_path / "model"
    shutil.copytree(model_folder, folder)
    weights = folder / "model.safetensors"
    tensors = load_file(weights)
    name = "model.norm.weight"
    save_file({**tensors, name: tensors[name].astype(dtype)}, weights)  # once cast to float without a word
    with pytest.raises(ValueError) as refused:
        load(folder)
    expected = f"{weights}: tensor {name} is {np.dtype(dtype).name.replace('int', 'I').replace('float', 'F')}; "
    assert str(refused.value).startswith(expected) and "integer and quantized checkpoints are not supported" in str(
        refused.value
    )


def test_a_span_ahead_of_the_learners_version_is_refused_by_file_line_and_field(tmp_path):
    path = tmp_path / "episodes.jsonl"
    two_spans = {**GOOD, "spans": [{"start": 3, "end": 4, "version": 1, "logprobs": [-1.0]}, {**GOOD["spans"][0]}]}
    two_spans["spans"][1]["start"] = 4
    two_spans["spans"][1]["logprobs"] = [-1.0, -1.0]
    write_episodes(path, [GOOD, two_spans])
    episodes, _ = read_episodes(path, vocab_size=64, max_length=8)
    check_versions(episodes, 2, path)  # version 2 may learn what versions 1 and 2 wrote
    with pytest.raises(
        ValueError, match=r"episodes.jsonl:2: spans\[1\].version: 2 is ahead of the learner, at version 1"
    ):
        check_versions(episodes[1:], 1, path)


def test_per_token_versions_drive_staleness_and_importance_ratios():
    """An episode two hot-loaded versions wrote: staleness counts from the oldest, the ratio sums its tokens."""
    record = {
        "tokens": [1, 9, 10, 11, 12, 13, 14],
        "reward": 1.0,
        "spans": [
            {"start": 2, "end": 4, "version": 3, "logprobs": [-1.0, -2.0]},
            {"start": 5, "end": 7, "version": 5, "logprobs": [-0.5, -0.25]},
        ],
    }
    trajectory = to_trajectories([parse_episode(json.dumps(record), vocab_size=64, max_length=8)], 8)
    assert trajectory.behaviour_version[0].tolist() == [0, 3, 3, 0, 5, 5, 0]
    assert int(diagnostics.staleness(jnp.int32(7), trajectory.behaviour_version, trajectory.mask)[0]) == 4
    log_probs = jnp.array([[-9.0, -1.5, -1.5, -9.0, -1.0, -1.0, -9.0]])
    ratio = diagnostics.log_importance_ratio(log_probs, trajectory.behaviour_logp, trajectory.mask)
    np.testing.assert_allclose(ratio, [(-1.5 + 1.0) + (-1.5 + 2.0) + (-1.0 + 0.5) + (-1.0 + 0.25)])


# ---------------------------------------------------------------------------------------------- the learner


@pytest.mark.slow
def test_the_jsonl_learner_makes_the_in_process_learners_updates(engine, tmp_path):
    learner, params, trajectories = played(engine, 16)
    path = tmp_path / "episodes.jsonl"
    write_episodes(path, episode_records(trajectories))
    episodes, _ = read_episodes(path, vocab_size=ENV.vocabulary_size, max_length=MAX_LENGTH)
    from_file = to_trajectories(episodes, MAX_LENGTH)
    states = []
    for batches in (trajectories, from_file):
        state = learner.init(params)
        for iteration in range(2):
            batch = jax.tree.map(lambda leaf: leaf[iteration * 8 : (iteration + 1) * 8], batches)  # noqa: B023
            state, metrics = learner.step(state, batch, iteration)
        states.append(state)
    assert int(states[0].policy.version) == 4  # every update applied
    for a, b in zip(jax.tree.leaves(states[0].policy.params), jax.tree.leaves(states[1].policy.params)):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)
    moved = jax.tree.leaves(
        jax.tree.map(lambda a, b: jnp.max(jnp.abs(a - b)), states[0].policy.params, as_policy_params(params))
    )
    assert max(float(value) for value in moved) > 1e-4


def lm_learn(model_folder, episodes, out, *extra):
    argv = [
        "lm",
        "learn",
        "--episodes",
        str(episodes),
        "--model",
        str(model_folder),
        "--out",
        str(out),
        "--name",
        "run",
        "--max-length",
        str(MAX_LENGTH),
        "--episodes-per-iteration",
        "8",
        "--pool-capacity",
        "16",
        "--num-batches",
        "4",
        "--batch-size",
        "4",
        "--num-elites",
        "1",
        "--json",
        *extra,
    ]
    return cli.main(argv)


@pytest.mark.slow
def test_lm_learn_writes_versions_an_engine_can_load_and_resumes_exactly(engine, model_folder, tmp_path, capsys):
    _, _, trajectories = played(engine, 24)
    episodes = tmp_path / "episodes.jsonl"
    write_episodes(episodes, episode_records(trajectories))
    assert lm_learn(model_folder, episodes, tmp_path / "whole") == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["iterations"] == 3 and summary["version"] == 3
    run = tmp_path / "whole" / "run"
    assert sorted(p.name for p in (run / "weights").iterdir()) == [
        "latest.json",
        "version-000001",
        "version-000002",
        "version-000003",
    ]
    assert json.loads((run / "weights" / "latest.json").read_text())["version"] == 3
    assert (run / "weights" / "version-000003" / "tokenizer.json").is_file()
    _, whole = load(run / "weights" / "version-000003")

    # The same file cut short after 16 episodes; then the engine writes the rest and the run resumes: the same weights.
    growing = tmp_path / "growing.jsonl"
    growing.write_text("".join(episodes.read_text().splitlines(keepends=True)[:16]))
    assert lm_learn(model_folder, growing, tmp_path / "parts") == 0
    part = tmp_path / "parts" / "run"
    growing.write_text(episodes.read_text())
    assert lm_learn(model_folder, growing, tmp_path / "parts", "--resume", str(part)) == 0
    _, resumed = load(part / "weights" / "version-000003")
    for a, b in zip(jax.tree.leaves(whole), jax.tree.leaves(resumed)):
        np.testing.assert_array_equal(a, b)
    rows = [json.loads(line) for line in (part / "metrics.jsonl").read_text().splitlines()]
    assert [row["episodes"] for row in rows] == [8, 16, 24]
    # TensorBoard: each row's numbers as learn/NAME at its iteration, once each across the two processes.
    events = EventAccumulator(str(part / "tensorboard" / "learner"), size_guidance={"scalars": 0})
    events.Reload()
    assert [(point.step, point.value) for point in events.Scalars("learn/episodes")] == [(1, 8), (2, 16), (3, 24)]
    for name in ("reward_mean", "cross_entropy", "version"):
        points = events.Scalars(f"learn/{name}")
        assert [point.step for point in points] == [row["iteration"] for row in rows], name
        np.testing.assert_allclose([point.value for point in points], [row[name] for row in rows], rtol=1e-6)


@pytest.mark.slow
def test_a_resume_with_another_models_folder_is_refused_and_moves_no_checkpoint(engine, model_folder, tmp_path, capsys):
    """The model folder swapped for one of another shape: refused in one line naming an array, the checkpoints left
    as they were; the right model put back, the run resumes after its iteration."""
    _, _, trajectories = played(engine, 16)
    episodes, model = tmp_path / "episodes.jsonl", tmp_path / "model"
    write_episodes(episodes, list(episode_records(trajectories))[:8])
    shutil.copytree(model_folder, model)
    assert lm_learn(model, episodes, tmp_path) == 0
    run, _ = tmp_path / "run", capsys.readouterr()
    before = sorted((path.relative_to(run), path.stat().st_size) for path in (run / "checkpoints").rglob("*"))
    shutil.rmtree(model)
    wider = dataclasses.replace(tiny_config(ENV.vocabulary_size), hidden_size=32, intermediate_size=64)
    from ftw_jax.lm.model import CausalLM

    save(model, wider, CausalLM(wider).init(jax.random.key(1), jnp.zeros((1, 4), jnp.int32)))
    write_episodes(episodes, list(episode_records(trajectories))[8:])
    assert lm_learn(model, episodes, tmp_path, "--resume", str(run)) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: the checkpoint ") and "holds arrays of other shapes" in err and "-> (" in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    after = sorted((path.relative_to(run), path.stat().st_size) for path in (run / "checkpoints").rglob("*"))
    assert after == before and not (run / "checkpoints-unreadable").exists()
    shutil.rmtree(model)
    shutil.copytree(model_folder, model)
    assert lm_learn(model, episodes, tmp_path, "--resume", str(run)) == 0
    assert "resumed after iteration 1 (8 episodes learnt from)" in capsys.readouterr().err
    shutil.rmtree(run / "checkpoints")  # killed before its first checkpoint: the restart says it starts over
    assert lm_learn(model, episodes, tmp_path, "--resume", str(run)) == 0
    assert f"no checkpoint in {run / 'checkpoints'}: the run starts again from iteration 0" in capsys.readouterr().err


@pytest.mark.slow
def test_a_short_last_batch_is_learnt_from_and_resumed_after(engine, model_folder, tmp_path, capsys, monkeypatch):
    """12 episodes in batches of 8: the last batch has 4; a resume after more lines were written goes on from
    the 13th episode. The resume names the episodes file relative to where it runs: the same file."""
    _, _, trajectories = played(engine, 20)
    records = list(episode_records(trajectories))
    episodes = tmp_path / "episodes.jsonl"
    write_episodes(episodes, records[:12])
    assert lm_learn(model_folder, episodes, tmp_path) == 0
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["algorithm_config"]["monitor_entries"] == 4  # the LM commands' default (algos.defaults.LM_FTW)
    write_episodes(episodes, records[12:])
    monkeypatch.chdir(tmp_path)
    relative = pathlib.Path("episodes.jsonl")
    assert lm_learn(model_folder, relative, pathlib.Path("."), "--resume", "run") == 0
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["episodes"] == 20
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [row["episodes"] for row in rows] == [8, 12, 20]
    episodes.write_text("".join(episodes.read_text().splitlines(keepends=True)[:8]))  # rewritten, not appended to
    assert lm_learn(model_folder, relative, pathlib.Path("."), "--resume", "run") == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "error: episodes.jsonl now holds 8 usable episodes, fewer than the 20 this run has learnt from: an engine "
        "appends to the file, never rewrites it; resume with the whole file, or start a new run."
    )


@pytest.mark.slow
def test_lm_learn_refuses_a_bad_line_in_one_line(model_folder, tmp_path, capsys):
    episodes = tmp_path / "episodes.jsonl"
    episodes.write_text(json.dumps({**GOOD, "tokens": [1, 9, 10, 7, 30, 999]}) + "\n")
    assert lm_learn(model_folder, episodes, tmp_path) == 2
    error = capsys.readouterr().err.strip()
    assert error.count("\n") == 0 and "episodes.jsonl:1: tokens[5]: 999 is not a token id" in error
    assert not (tmp_path / "run").exists()  # nothing that blocks a retry under the same --name
    episodes.write_text(json.dumps(GOOD) + "\n")  # written by version 2, before the learner wrote any weights
    small = ("--episodes-per-iteration", "1", "--batch-size", "1")
    assert lm_learn(model_folder, episodes, tmp_path, *small) == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]  # after the progress lines
    assert error == (
        f"error: {episodes}:1: spans[0].version: 2 is ahead of the learner, at version 0 when it learns this line "
        "(an engine writes the version of the weights it played with: at most weights/latest.json's)."
    )
    assert not (tmp_path / "run").exists()
    episodes.write_text(json.dumps({**GOOD, "spans": [{**GOOD["spans"][0], "version": 0}]}) + "\n")
    made_up = ("--sampler-gap-limit", "0")  # its log-probs are no model's
    assert lm_learn(model_folder, episodes, tmp_path, *small, *made_up) == 0


@pytest.mark.parametrize("seed", ["-1", "2147483648", "99999999999999999999"])
def test_lm_learn_refuses_a_seed_out_of_range_in_one_line(model_folder, tmp_path, capsys, seed):
    episodes = tmp_path / "episodes.jsonl"
    episodes.write_text(json.dumps(GOOD) + "\n")
    assert lm_learn(model_folder, episodes, tmp_path, "--seed", seed) == 2
    error = capsys.readouterr().err.strip()
    assert error == f"error: --seed must be an int in [0, 2147483647], got {int(seed)}." and "Traceback" not in error
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("flag", [("--idle-timeout", "5"), ("--poll-seconds", "2")])
def test_lm_learn_refuses_a_flag_that_takes_effect_only_when_following(model_folder, tmp_path, capsys, flag):
    episodes = tmp_path / "episodes.jsonl"
    episodes.write_text(json.dumps(GOOD) + "\n")
    assert lm_learn(model_folder, episodes, tmp_path, *flag) == 2  # was ignored without a word (issue 35)
    error = capsys.readouterr().err.strip()
    assert error.endswith(f"takes effect only with --follow; set that too, or leave {flag[0]} out.")
    assert error.count("\n") == 0 and not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "flag, refusal",
    [  # each was a RESOURCE_EXHAUSTED traceback, an allocation failure after 100 s or the OOM killer (issue 35)
        ("--pool-capacity", "error: the run's state needs "),
        ("--max-length", "error: the run's state needs "),
        ("--num-batches", "error: one iteration of the learner needs "),
        ("--updates-per-iteration", "error: one iteration of the learner needs "),
    ],
)
@pytest.mark.usefixtures("unchecked_key_reuse")  # J = 10^9 minibatch keys: the checker's own arrays would not fit
def test_lm_learn_refuses_what_would_not_fit_in_memory_before_allocating_it(
    model_folder, tmp_path, capsys, monkeypatch, flag, refusal
):
    monkeypatch.setattr(memory, "memory_available", lambda: 16 * 2**30)  # the same refusal on any machine
    episodes = tmp_path / "episodes.jsonl"
    episodes.write_text(json.dumps({**GOOD, "spans": [{**GOOD["spans"][0], "version": 0}]}) + "\n")
    argv = ("--episodes-per-iteration", "1", "--batch-size", "1", flag, "1000000000")
    assert lm_learn(model_folder, episodes, tmp_path, *argv) == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith(refusal) and "GiB here; use a smaller " in error and flag in error, error
    assert not (tmp_path / "run").exists()  # nothing that blocks the corrected command under the same --name


MESH_SCRIPT = """
import json, pathlib, sys
import jax, numpy as np
from ftw_jax import cli, lm

folder, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
vocab = json.loads((folder / "config.json").read_text())["vocab_size"]
rng = np.random.default_rng(0)
with (out / "episodes.jsonl").open("w") as file:
    for _ in range(16):  # random episodes: a prompt of 4 tokens, then the model's 8
        tokens = rng.integers(0, vocab, 12).tolist()
        logprobs = (-rng.random(8) * 3).tolist()
        file.write(json.dumps({"tokens": tokens, "spans": [{"start": 4, "end": 12, "version": 0, "logprobs": logprobs}],
                               "reward": float(rng.integers(0, 2))}) + "\\n")
weights = {}
for name, extra in (("one", []), ("mesh", ["--mesh", "2x2"])):
    argv = ["lm", "learn", "--episodes", str(out / "episodes.jsonl"), "--model", str(folder), "--out", str(out),
            "--name", name, "--max-length", "12", "--episodes-per-iteration", "8", "--pool-capacity", "16",
            "--num-batches", "4", "--batch-size", "4", "--num-elites", "1", "--optimizer", "sgd",
            "--learning-rate", "0.5", "--sampler-gap-limit", "0", *extra]  # made-up log-probs; SGD: Adam turns
            # rounding in near-zero gradients into lr-sized steps
    assert cli.main(argv) == 0
    weights[name] = lm.load(out / name / "weights" / "version-000002")[1]
from ftw_jax.agent.learner import EpisodeLearner, LearnConfig
from ftw_jax.lm.sharding import make_mesh, shard_params
model, params = lm.load(folder)
state = EpisodeLearner.build(LearnConfig(max_length=12), model.config).init(shard_params(params, make_mesh(2, 2)))
split = lambda tree: sum(not leaf.sharding.is_fully_replicated for leaf in jax.tree.leaves(tree))  # leaves split
print(json.dumps({"devices": jax.device_count(), "difference": max(
    float(np.abs(np.asarray(a) - np.asarray(b)).max())
    for a, b in zip(jax.tree.leaves(weights["one"]), jax.tree.leaves(weights["mesh"]))),
    "split": [split(state.policy.params), split(state.policy.reference_params), split(state.policy.opt_state)]}))
"""


@pytest.mark.slow
def test_lm_learn_on_a_data_by_model_mesh_learns_what_one_device_does(tmp_path):
    import subprocess
    import sys

    env = with_cpu_devices(4)
    folder = pathlib.Path(__file__).parent / "data" / "lm" / "qwen2-untied"
    result = subprocess.run(
        [sys.executable, "-c", MESH_SCRIPT, str(folder), str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    measured = json.loads(result.stdout.strip().splitlines()[-1])
    assert measured["devices"] == 4 and measured["difference"] <= 1e-5, measured
    # The learner's init lays the reference and Adam's two moments out like the weights (XLA left them whole).
    params_split, reference_split, optimizer_split = measured["split"]
    assert params_split > 0 and reference_split == params_split and optimizer_split == 2 * params_split, measured


@pytest.mark.slow
def test_the_samplers_episodes_are_on_policy_for_the_learner(tmp_path):
    """Episodes the in-process sampler writes, through JSONL: every model token's behaviour log-prob is the one
    the learner computes for it, so at the sampling weights the importance ratio of each is 1 (log 0)."""
    from ftw_jax.agent.episodes import sample_records
    from ftw_jax.lm import SamplingConfig, make_sampler

    folder = pathlib.Path(__file__).parent / "data" / "lm" / "qwen2-untied"
    model, params = load(folder)
    prompts = jnp.array([[0, 5, 9, 2], [3, 8, 1, 7]], jnp.int32)
    mask = jnp.array([[False, True, True, True], [True] * 4])  # the first prompt left-padded
    sample = make_sampler(model, SamplingConfig(max_new_tokens=6, stop_tokens=(4,)))(
        params, jax.random.key(1), prompts, mask
    )
    path = tmp_path / "episodes.jsonl"
    write_episodes(path, sample_records(sample, [1.0, 0.0], version=0))
    episodes, _ = read_episodes(path, vocab_size=model.config.vocab_size, max_length=10)
    assert [len(episode.tokens) for episode in episodes] == [
        int(row.sum()) for row in np.asarray(sample.attention_mask)
    ]
    trajectories = to_trajectories(episodes, 10)
    learner = EpisodeLearner.build(
        LearnConfig(
            max_length=10,
            episodes_per_iteration=2,
            algorithm_config=FTWConfig(pool_capacity=2, num_batches=2, batch_size=2, num_elites=2, monitor_entries=0),
        ),
        model.config,
    )
    log_probs = jax.vmap(lambda t: jax.nn.log_softmax(learner.policy.apply(as_policy_params(params), t.observation)))(
        trajectories
    )
    chosen = np.take_along_axis(np.asarray(log_probs), trajectories.action[..., None], axis=-1)[..., 0]
    np.testing.assert_allclose(np.where(trajectories.mask, chosen, 0), trajectories.behaviour_logp, atol=2e-5)
    assert trajectories.mask.sum() == np.asarray(sample.generated).sum()
    _, metrics = learner.step(learner.init(params), trajectories, 0)
    assert abs(float(metrics["elite_log_weight_mean"][0])) < 1e-4


def sampled_episodes(model_folder, path, **sampling):
    """16 episodes the tiny model continues 16 prompts with (`lm.make_sampler`, `sampling` its settings) at
    version 0, with the log-probs of the distribution they were drawn from, as an engine reports them."""
    from ftw_jax.agent.episodes import sample_records
    from ftw_jax.lm import SamplingConfig, make_sampler

    model, params = load(model_folder)
    prompts = jax.random.randint(jax.random.key(2), (16, 4), 1, ENV.vocabulary_size)
    sample = make_sampler(model, SamplingConfig(max_new_tokens=12, **sampling))(
        params, jax.random.key(3), prompts, jnp.ones((16, 4), bool)
    )
    write_episodes(path, sample_records(sample, np.arange(16) % 3, version=0))


@pytest.mark.slow
def test_an_engine_off_the_policy_stops_the_learner_in_one_line_and_an_on_policy_one_does_not(
    model_folder, tmp_path, capsys
):
    """Episodes sampled at temperature 0.7 with top-p 0.9, with the log-probs they were drawn with (what an engine
    reports as processed log-probs): the learner stops after the first iteration naming the likely causes, exit 3,
    resumable past it with `--sampler-gap-limit 0`. The same engine at temperature 1: a gap at float32 rounding."""
    on, off = tmp_path / "on.jsonl", tmp_path / "off.jsonl"
    sampled_episodes(model_folder, on)
    sampled_episodes(model_folder, off, temperature=0.7, top_p=0.9)
    assert lm_learn(model_folder, on, tmp_path / "on") == 0
    rows = [json.loads(line) for line in (tmp_path / "on" / "run" / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["sampler_tokens"] > 0 and rows[0]["sampler_gap"] < 1e-4, rows[0]
    assert "sampler gap" in capsys.readouterr().err

    assert lm_learn(model_folder, off, tmp_path / "off") == cli.STOPPED_SKIPPING
    err = capsys.readouterr().err
    stopped = [line for line in err.splitlines() if line.startswith("stopped: ")]
    assert len(stopped) == 1 and "Traceback" not in err, err
    assert "iteration 1: the engine's log-probs are" in stopped[0] and "temperature other than 1" in stopped[0]
    assert "(add --sampler-gap-limit 0 to go on past this)" in stopped[0]
    gap = json.loads((tmp_path / "off" / "run" / "metrics.jsonl").read_text().splitlines()[0])["sampler_gap"]
    assert gap > 0.1
    run = tmp_path / "off" / "run"
    assert lm_learn(model_folder, off, tmp_path / "off", "--resume", str(run), "--sampler-gap-limit", "0") == 0
    assert json.loads(capsys.readouterr().out)["iterations"] == 2


@pytest.mark.slow
def test_a_batch_mostly_past_max_staleness_is_said_and_stops_the_learner(engine, model_folder, tmp_path, capsys):
    """An engine that never reloads: the second batch, still version 0's, is past `--max-staleness 0` when the
    learner is at version 1: counted in the progress line, then a stop in one line, resumable past it."""
    _, _, trajectories = played(engine, 16)
    episodes = tmp_path / "episodes.jsonl"
    write_episodes(episodes, episode_records(trajectories))
    assert lm_learn(model_folder, episodes, tmp_path, "--stale-share-limit", "0.3") == 2
    assert "error: --stale-share-limit 0.3 takes effect only with --max-staleness" in capsys.readouterr().err
    assert lm_learn(model_folder, episodes, tmp_path, "--max-staleness", "0") == cli.STOPPED_SKIPPING
    err = capsys.readouterr().err
    assert re.search(r"iteration +2/2 .* stale 8 ", err), err
    stopped = [line for line in err.splitlines() if line.startswith("stopped: ")]
    assert len(stopped) == 1 and "iteration 2: 8 of its 8 episodes were written more than 0 versions" in stopped[0]
    assert "(add --stale-share-limit 1 to go on past this)" in stopped[0] and "Traceback" not in err
    resume = ("--resume", str(tmp_path / "run"), "--max-staleness", "0", "--stale-share-limit", "1")
    assert lm_learn(model_folder, episodes, tmp_path, *resume) == 0


TWO_PROCESS_SCRIPT = """
import json, pathlib, sys
import numpy as np
import optax
folder, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
vocab = json.loads((folder / "config.json").read_text())["vocab_size"]
rng = np.random.default_rng(0)
with (out / "episodes.jsonl").open("w") as file:
    for _ in range(16):
        file.write(json.dumps({"tokens": rng.integers(0, vocab, 12).tolist(), "reward": float(rng.integers(0, 2)),
                               "spans": [{"start": 4, "end": 12, "version": 0,
                                          "logprobs": (-rng.random(8) * 3).tolist()}]}) + "\\n")
"""


@pytest.mark.slow
def test_lm_learn_over_two_processes_learns_what_one_does(tmp_path):
    """jax.distributed on loopback, 2 processes of 2 forced CPU devices each, the weights on a 2 x 2 mesh across
    both: the weights written equal those of one process on one device; only process 0 writes and prints."""
    import socket
    import subprocess
    import sys

    folder = pathlib.Path(__file__).parent / "data" / "lm" / "qwen2-untied"
    subprocess.run([sys.executable, "-c", TWO_PROCESS_SCRIPT, str(folder), str(tmp_path)], check=True)
    common = [
        "lm",
        "learn",
        "--episodes",
        str(tmp_path / "episodes.jsonl"),
        "--model",
        str(folder),
        "--out",
        str(tmp_path),
        "--max-length",
        "12",
        "--sampler-gap-limit",  # made-up log-probs
        "0",
        "--episodes-per-iteration",
        "8",
        "--pool-capacity",
        "16",
        "--num-batches",
        "4",
        "--batch-size",
        "4",
        "--num-elites",
        "1",
        "--optimizer",
        "sgd",
        "--learning-rate",
        "0.5",
        "--json",
    ]
    assert cli.main([*common, "--name", "one"]) == 0
    with socket.socket() as probe:  # a free port for the coordinator
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    argv = [
        sys.executable,
        "-m",
        "ftw_jax.cli",
        *common,
        "--name",
        "two",
        "--mesh",
        "2x2",
        "--coordinator",
        f"127.0.0.1:{port}",
        "--num-processes",
        "2",
    ]
    env = with_cpu_devices(2)
    processes = [
        subprocess.Popen([*argv, "--process-id", str(i)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for i in (0, 1)
    ]
    outputs = [process.communicate(timeout=600) for process in processes]
    assert [process.returncode for process in processes] == [0, 0], outputs[0][1][-3000:] + outputs[1][1][-3000:]
    assert json.loads(outputs[0][0])["devices"] == 4 and outputs[1][0] == b""
    _, one = load(tmp_path / "one" / "weights" / "version-000002")
    _, two = load(tmp_path / "two" / "weights" / "version-000002")
    for a, b in zip(jax.tree.leaves(one), jax.tree.leaves(two)):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-5)


def saved_dtypes(folder: pathlib.Path) -> tuple[set, str, str]:
    """(the dtypes in model.safetensors' header, config.json's torch_dtype, its dtype)."""
    data = (folder / "model.safetensors").read_bytes()
    header = json.loads(data[8 : 8 + int.from_bytes(data[:8], "little")])
    names = {"F32": "float32", "BF16": "bfloat16"}
    tensors = {names[entry["dtype"]] for name, entry in header.items() if name != "__metadata__"}
    config = json.loads((folder / "config.json").read_text())
    return tensors, config["torch_dtype"], config["dtype"]


@pytest.mark.slow
@pytest.mark.parametrize("param_dtype", ["float32", "bfloat16"])
def test_lm_learn_in_bfloat16_with_adam_applies_its_updates(engine, model_folder, tmp_path, capsys, param_dtype):
    """Issue 31: with bfloat16 weights every Adam step was skipped as non-finite (b2 = 0.999 became 1.0) while
    the command exited 0 and wrote version 0. bfloat16 compute with float32 master weights (the default) and
    pure bfloat16 both apply every step; the export is in the compute dtype and its config.json says so."""
    _, _, trajectories = played(engine, 16)
    episodes = tmp_path / "episodes.jsonl"
    write_episodes(episodes, episode_records(trajectories))
    extra = ("--dtype", "bfloat16", "--param-dtype", param_dtype, "--optimizer", "adam")
    assert lm_learn(model_folder, episodes, tmp_path, *extra) == 0
    assert json.loads(capsys.readouterr().out)["version"] == 2
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [(row["applied"], row["nonfinite"]) for row in rows] == [(True, False)] * 2
    _, start = load(model_folder)
    learnt_folder = tmp_path / "run" / "weights" / "version-000002"
    _, learnt = load(learnt_folder)
    assert any(not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(start), jax.tree.leaves(learnt)))
    assert saved_dtypes(learnt_folder) == ({"bfloat16"}, "bfloat16", "bfloat16")
    assert saved_dtypes(model_folder) == ({"float32"}, "float32", "float32")


@pytest.mark.slow
@pytest.mark.parametrize("param_dtype", ["float32", "bfloat16"])
def test_bfloat16_compute_applies_every_step_and_lowers_the_loss_on_a_fixed_batch(engine, model_folder, param_dtype):
    _, _, trajectories = played(engine, 8)
    model, params = load(model_folder, dtype="bfloat16", param_dtype=param_dtype)
    assert {leaf.dtype for leaf in jax.tree.leaves(params)} == {jnp.dtype(param_dtype)}
    config = small_config(dtype="bfloat16", param_dtype=param_dtype, kl_coef=0.0)
    learner = EpisodeLearner.build(config, model.config)
    state = learner.init(params)
    loss = jax.jit(make_loss(learner.policy.apply, config.algorithm_config))
    weights = jnp.ones(8)

    def cross_entropy(state):
        return float(loss(state.policy.params, state.policy.params, 0.0, trajectories, weights)[0])

    before = cross_entropy(state)
    applied = []
    for iteration in range(4):
        state, metrics = learner.step(state, trajectories, iteration)
        applied += np.asarray(metrics["applied"]).tolist()
    assert applied == [True] * 8 and int(state.policy.version) == 8
    assert {leaf.dtype for leaf in jax.tree.leaves(state.policy.params)} == {jnp.dtype(param_dtype)}
    assert cross_entropy(state) < before - 0.05, (before, cross_entropy(state))


# ------------------------------------------------------------------------------------- logits in chunks


def chunk_case(vocab_size: int, num_steps: int, num_trajectories: int, chunk: int):
    """(dense LMPolicy, the same with `chunk`, params, reference params, trajectories [M, T], weights [M])."""
    from ftw_jax.policies.lm import LMPolicy

    dense = LMPolicy(num_actions=vocab_size, config=tiny_config(vocab_size), max_length=num_steps)
    params, reference = (dense.init(jax.random.key(seed), jnp.zeros((num_steps,), jnp.int32)) for seed in (0, 1))
    keys = jax.random.split(jax.random.key(2), 3)
    shape = (num_trajectories, num_steps)
    zeros = jax.tree.map(
        lambda spec: jnp.zeros((num_trajectories, *spec.shape), spec.dtype), token_trajectory_spec(num_steps)
    )
    trajectories = zeros.replace(
        observation=jax.random.randint(keys[0], shape, 0, vocab_size),
        action=jax.random.randint(keys[1], shape, 0, vocab_size),
        mask=jax.random.bernoulli(keys[2], 0.7, shape),
        alive=jnp.ones(shape, bool),
    )
    weights = jnp.arange(num_trajectories, dtype=jnp.float32) % 3  # repeats, and an entry of weight 0
    return dense, dense.clone(logits_chunk=chunk), params, reference, trajectories, weights


@pytest.mark.parametrize("normalisation", ["token", "trajectory"])
@pytest.mark.parametrize("kl_direction", ["policy_to_reference", "reference_to_policy"])
def test_logits_in_chunks_give_the_dense_loss_and_gradient(kl_direction, normalisation):
    """Issue 31: 13 steps in chunks of 4 (the last one padded) make the loss, its terms, the importance weights
    and the gradient of the whole-sequence logits, to 1e-5 in float32; and so does the model run once over the
    batch (the learner's way) against once per sequence under `vmap`."""
    dense, chunked, params, reference, trajectories, weights = chunk_case(50, 13, 4, chunk=4)
    config = FTWConfig(kl_direction=kl_direction, normalisation=normalisation)
    assert chunked.chunked_logits().chunk == 4 and dense.chunked_logits().chunk == 0

    def loss_and_grad(policy, chunked_logits):
        loss = make_loss(policy.apply, config, chunked_logits)
        return jax.jit(jax.value_and_grad(loss, has_aux=True))(params, reference, 0.3, trajectories, weights)

    expected = loss_and_grad(dense, None)  # per sequence
    assert float(expected[0][0]) > 0
    for policy in (dense, chunked):
        got = loss_and_grad(policy, policy.chunked_logits())
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5), got, expected)


def test_the_monitor_in_chunks_measures_what_the_dense_one_does():
    from ftw_jax.core import pool as pool_lib
    from ftw_jax.core.diagnostics import make_trust_region

    dense, chunked, params, reference, trajectories, _ = chunk_case(50, 13, 4, chunk=5)
    pool = pool_lib.add(pool_lib.init(8, token_trajectory_spec(13)), trajectories)
    config = FTWConfig(pool_capacity=8, batch_size=4, num_elites=1, monitor_entries=3)
    measure = lambda policy, chunked_logits: jax.jit(  # noqa: E731
        make_trust_region(
            policy.apply, entries=config.monitor_entries, discount=config.monitor_discount, chunked=chunked_logits
        )
    )(reference, params, pool)
    expected = measure(dense, None)  # per sequence
    assert float(expected["policy_kl_mean"]) > 0
    for policy in (dense, chunked):
        got = measure(policy, policy.chunked_logits())
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), got, expected)


def test_the_learner_chunks_the_logits_of_a_real_vocabulary_by_default():
    from ftw_jax.policies.lm import logits_chunk_for

    # Sized so that one [rows, chunk, V] float32 array fits 256 MiB: 128 steps up to V = 65,536 at 8 rows.
    assert logits_chunk_for(32_768, None) == 128 and logits_chunk_for(65_536, None) == 128
    assert logits_chunk_for(151_936, None) == 32 and logits_chunk_for(151_936, None, rows=2) == 128
    assert logits_chunk_for(128_256, None, rows=16) == 32 and logits_chunk_for(128_256, None, rows=32) == 16
    assert logits_chunk_for(151_936, None, rows=10**6) == 1
    # Whole where the sequences' logits fit the budget: 8 x 256 x 32,768 float32 is 256 MiB, one more step is not.
    assert logits_chunk_for(32_768, None, steps=256) == 0 and logits_chunk_for(32_768, None, steps=257) == 128
    assert logits_chunk_for(151_936, None, rows=32, steps=13) == 0 and logits_chunk_for(151_936, None, 32, 14) == 8
    assert logits_chunk_for(32_767, None) == 0 and logits_chunk_for(151_936, 0) == 0
    assert logits_chunk_for(58, 16) == 16
    assert small_config().loss_rows == 4  # FTW's J·K elites
    assert small_config(algorithm="grpo", algorithm_config=None).loss_rows == 8  # a baseline's batch
    with pytest.raises(ValueError, match="logits_chunk must be None or an int >= 0, got -1"):
        small_config(logits_chunk=-1)


def test_the_learner_recomputes_activations_where_they_would_outweigh_the_budget():
    from ftw_jax.lm.memory import memory_estimate
    from ftw_jax.policies.lm import ACTIVATIONS_BUDGET, remat_for

    small, wide = tiny_config(58), tiny_config(151_936)
    kept = lambda config, rows, steps: memory_estimate(config, rows, steps)["activations"]  # noqa: E731
    assert kept(small, 32, 64) < ACTIVATIONS_BUDGET < kept(wide, 32, 512)  # the two sides of the rule
    assert not remat_for(small, None, 32, 64) and remat_for(wide, None, 32, 512)
    assert remat_for(small, True, 32, 64) and not remat_for(wide, False, 32, 512)  # a setting given wins
    assert remat_for(dataclasses.replace(small, remat=True), None, 32, 64)  # as does a config that asks for it
    learner = lambda **settings: EpisodeLearner.build(small_config(**settings), small)  # noqa: E731
    assert not learner().model_config.remat and learner(remat=True).model_config.remat
    assert learner(remat=True).policy.config.remat


@pytest.mark.slow
def test_logits_in_chunks_hold_one_chunk_in_memory():
    """XLA's own count of the loss-and-gradient program's temporaries: with 16,384 words, 4 sequences of 128
    steps, the dense logits and their gradient dominate (7.4 arrays of [M, T, V] float32 measured); in chunks
    of 16 steps a seventh of that is left (33 MiB, of which a chunk's arrays take 1.25 MiB per step of chunk)."""
    dense, chunked, params, reference, trajectories, weights = chunk_case(16_384, 128, 4, chunk=16)
    config = FTWConfig()

    def temporaries(policy):
        loss = jax.value_and_grad(make_loss(policy.apply, config, policy.chunked_logits()), has_aux=True)
        compiled = jax.jit(loss).lower(params, reference, 0.3, trajectories, weights).compile()
        return compiled.memory_analysis().temp_size_in_bytes

    logits_bytes = 4 * 128 * 16_384 * 4  # one float32 [M, T, V]
    dense_bytes, chunked_bytes = temporaries(dense), temporaries(chunked)
    assert dense_bytes > 2 * logits_bytes, dense_bytes
    assert chunked_bytes < dense_bytes / 5, (chunked_bytes, dense_bytes)


@pytest.mark.slow
def test_lm_learn_whose_updates_are_all_non_finite_stops_in_one_line_and_resumes(
    engine, model_folder, tmp_path, capsys, monkeypatch
):
    """Issue 31: a learner that applies none of an iteration's ready updates stops (exit 3) after that iteration,
    checkpointed, saying why and what to try; resumed with --stop-after-skipped 0 it goes on and counts them."""
    from ftw_jax.agent import learner as learner_module

    original = learner_module.make_optimizer  # every update NaN, from finite losses and gradients
    nan_updates = lambda config: optax.chain(original(config), optax.scale(jnp.nan))  # noqa: E731
    monkeypatch.setattr(learner_module, "make_optimizer", nan_updates)
    _, _, trajectories = played(engine, 24)
    episodes = tmp_path / "episodes.jsonl"
    write_episodes(episodes, episode_records(trajectories))
    assert lm_learn(model_folder, episodes, tmp_path) == 3
    err = capsys.readouterr().err
    assert "Traceback" not in err and "skipped 1/1" in err  # the progress line
    line = err.strip().splitlines()[-1]
    assert line.startswith("stopped: no update applied for 1 ready update in a row (a whole iteration;")
    assert "the learner skipped the last 1 (all non-finite)" in line and "--dtype float32" in line
    run = tmp_path / "run"
    rows = [json.loads(row) for row in (run / "metrics.jsonl").read_text().splitlines()]
    assert [(row["applied_count"], row["skipped_count"], row["nonfinite_count"]) for row in rows] == [(0, 1, 1)]
    assert lm_learn(model_folder, episodes, tmp_path, "--resume", str(run), "--stop-after-skipped", "0") == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["version"] == summary["updates_applied"] == 0
    assert summary["updates_skipped"] == summary["updates_nonfinite"] == 3


# ------------------------------------------------------------------------------------- following an engine


def append_slowly(path: pathlib.Path, lines: list[str], pause: float = 0.4) -> threading.Thread:
    """A stand-in engine: appends `lines` one at a time with pauses, the first one in two writes (a line seen half
    written must wait for its newline)."""

    def write():
        for index, line in enumerate(lines):
            time.sleep(pause)
            with path.open("a") as file:
                if index == 0:
                    file.write(line[: len(line) // 2])
                    file.flush()
                    time.sleep(pause)
                file.write(line[len(line) // 2 :] if index == 0 else line)

    thread = threading.Thread(target=write)
    thread.start()
    return thread


@pytest.mark.slow
def test_lm_learn_follow_learns_each_appended_line_once_and_resumes_exactly(engine, model_folder, tmp_path, capsys):
    """Issue 32: `--follow` learns the file's episodes, then the lines an engine appends as whole batches fill,
    each once, in file order: the weights of a run never stopped over the whole file. Stopped (here by
    --idle-timeout) and started again on the grown file, it goes on where it stopped: the same weights again."""
    _, _, trajectories = played(engine, 24)
    whole_file = tmp_path / "episodes.jsonl"
    write_episodes(whole_file, episode_records(trajectories))
    lines = whole_file.read_text().splitlines(keepends=True)
    assert lm_learn(model_folder, whole_file, tmp_path / "whole") == 0
    capsys.readouterr()
    _, expected = load(tmp_path / "whole" / "run" / "weights" / "version-000003")

    growing = tmp_path / "growing.jsonl"
    growing.write_text("".join(lines[:5]))  # fewer than a batch: the follower waits for more
    engine_thread = append_slowly(growing, lines[5:12])
    follow = ("--follow", "true", "--idle-timeout", "4", "--poll-seconds", "0.1")
    assert lm_learn(model_folder, growing, tmp_path / "followed", *follow) == 0
    engine_thread.join()
    captured = capsys.readouterr()
    summary = json.loads(captured.out)
    assert summary["episodes"] == 8 and summary["iterations"] == 1  # 12 lines: one batch, 4 waiting
    assert "stopped following: no new line for 4.0 s (--idle-timeout); 4 episodes wait" in captured.err
    run = tmp_path / "followed" / "run"
    with growing.open("a") as file:
        file.writelines(lines[12:])
    assert lm_learn(model_folder, growing, tmp_path / "followed", "--resume", str(run), *follow) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["episodes"] == 24 and summary["iterations"] == 3 and summary["version"] == 3
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [row["episodes"] for row in rows] == [8, 16, 24]
    _, followed = load(run / "weights" / "version-000003")
    for a, b in zip(jax.tree.leaves(expected), jax.tree.leaves(followed)):
        np.testing.assert_array_equal(a, b)
    assert json.loads((run / "weights" / "latest.json").read_text())["version"] == 3


def test_episode_tail_reads_whole_lines_once_and_refuses_a_shrunk_file(tmp_path):
    from ftw_jax.agent.feed import EpisodeTail

    path = tmp_path / "episodes.jsonl"
    line = json.dumps(GOOD) + "\n"
    path.write_text(line + line[:10])
    tail = EpisodeTail(path, vocab_size=64, max_length=16)
    assert len(tail.read()) == 1 and tail.read() == []  # the half line waits
    with path.open("a") as file:
        file.write(line[10:] + "\n" + line)  # its end, a blank line, one more
    assert len(tail.read()) == 2 and tail.lines == 4 and tail.report.kept == 3
    path.write_text(line)
    with pytest.raises(ValueError, match="episodes.jsonl was rewritten .* after 4 lines were read; an engine appends"):
        tail.read()
    path.write_bytes(b"\xff\n")
    with pytest.raises(ValueError, match=r"episodes.jsonl:1: not UTF-8 text \(byte 0xff at column 1\)"):
        EpisodeTail(path, vocab_size=64, max_length=16).read()


def test_stale_episodes_are_counted_against_the_bound():
    from ftw_jax.agent.episodes import parse_episode, stale_episodes

    episode = parse_episode(json.dumps(GOOD), vocab_size=64, max_length=16)  # written by version 2
    two, one = to_trajectories([episode, episode], 16), to_trajectories([episode], 16)
    assert stale_episodes(two, 5, None) == 0
    assert stale_episodes(two, 5, 3) == 0 and stale_episodes(one, 6, 3) == 1


def test_latest_json_moves_only_to_versions_a_whole_checkpoint_covers(tmp_path):
    """`LatestVersion` names a written version once a checkpoint of its iteration or a later one is whole (the
    checkpointer's `durable_step`), the newest such; without checkpoints at once."""
    from ftw_jax.agent.lm_learn import LatestVersion

    class Checkpoints:  # a checkpointer whose writes finish when the test says
        durable = None

        def durable_step(self):
            return self.durable

        def wait(self):
            self.durable = 3

    def named():
        path = tmp_path / "weights" / "latest.json"
        return json.loads(path.read_text()) if path.exists() else None

    (tmp_path / "weights").mkdir()
    checkpoints = Checkpoints()
    latest = LatestVersion(tmp_path, checkpoints)
    latest.written(1, 2)  # iteration 1 wrote version 2; its checkpoint is being written
    assert named() is None
    checkpoints.durable = 1
    latest.publish()
    assert named() == {"version": 2, "path": "version-000002"}
    latest.written(2, 4)
    latest.written(3, 6)
    checkpoints.durable = 2
    latest.publish()
    assert named()["version"] == 4
    latest.finish()  # waits for the writes in flight
    assert named()["version"] == 6
    unchecked = LatestVersion(tmp_path, None)
    unchecked.written(4, 8)
    assert named()["version"] == 8


def killed_when(process, seen: Callable[[], bool]) -> None:
    """SIGKILLs `process` as soon as `seen()` (polled every millisecond), or when it ends or 300 s pass."""
    import os
    import signal

    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and process.poll() is None and not seen():
        time.sleep(0.001)
    if process.poll() is None:
        os.kill(process.pid, signal.SIGKILL)
    process.wait()


def named_version(weights: pathlib.Path, run: pathlib.Path) -> int:
    """The version `latest.json` names (0 where there is none yet: the engine plays the starting model), checked
    whole (it loads) and covered by an intact checkpoint (iteration = version here), so a restart resumes at or
    past it."""
    if not (weights / "latest.json").exists():
        return 0
    latest = json.loads((weights / "latest.json").read_text())
    load(weights / latest["path"])
    steps = [int(path.name) for path in (run / "checkpoints").iterdir() if path.name.isdigit()]
    assert latest["version"] <= max(steps, default=0), (latest, steps)
    return latest["version"]


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ["ftw", "ppo"])
def test_a_follower_killed_at_each_point_of_a_version_never_names_an_older_one(
    algorithm, engine, model_folder, tmp_path
):
    """SIGKILL `lm learn --follow` while it writes a version (its staging folder seen), once the version is written
    (its checkpoint in flight) and once its checkpoint is in place, resuming each time: `latest.json` names a whole
    folder that loads, never one an intact checkpoint does not cover, so it never goes back across a restart; no
    partial version folder is left, and the last resume ends with the weights of a run never stopped (for PPO with
    its critic too), bit for bit."""
    import subprocess
    import sys

    _, _, trajectories = played(engine, 24)
    episodes = tmp_path / "episodes.jsonl"
    write_episodes(episodes, episode_records(trajectories))
    argv = [sys.executable, "-m", "ftw_jax.cli", "lm", "learn", "--episodes", str(episodes)]
    argv += ["--model", str(model_folder), "--out", str(tmp_path), "--max-length", str(MAX_LENGTH)]
    argv += ["--episodes-per-iteration", "8", "--pool-capacity", "16", "--num-batches", "4", "--batch-size", "4"]
    argv += ["--num-elites", "1", "--monitor-entries", "4"]
    if algorithm == "ppo":  # one step a batch: versions 1, 2, 3 as FTW's
        argv += ["--algorithm", "ppo", "--num-minibatches", "1"]
    run = tmp_path / "killed"
    weights = run / "weights"
    points = [
        lambda: weights.is_dir() and bool(list(weights.glob(".version-000002.*"))),  # version 2 being written
        lambda: (weights / "version-000002").exists(),  # written, its checkpoint maybe in flight
        lambda: (run / "checkpoints" / "3").exists(),
    ]
    named = 0
    for index, seen in enumerate(points if algorithm == "ftw" else points[:1]):
        resume = ["--resume", str(run)] if index else ["--name", "killed"]
        killed_when(subprocess.Popen([*argv, *resume, "--follow"], stderr=subprocess.DEVNULL), seen)
        now = named_version(weights, run)
        assert now >= named, f"latest.json went back from version {named} to {now}"
        named = now
        for folder in weights.glob("version-*"):
            load(folder)
    subprocess.run([*argv, "--resume", str(run)], check=True, capture_output=True)
    assert named_version(weights, run) == 3
    subprocess.run([*argv, "--name", "whole"], check=True, capture_output=True)
    _, resumed = load(weights / "version-000003")
    _, whole = load(tmp_path / "whole" / "weights" / "version-000003")
    for a, b in zip(jax.tree.leaves(resumed), jax.tree.leaves(whole)):
        np.testing.assert_array_equal(a, b)
    if algorithm == "ppo":
        critics = [stored_critic(tmp_path / name) for name in ("killed", "whole")]
        for a, b in zip(*(jax.tree.leaves(critic) for critic in critics), strict=True):
            np.testing.assert_array_equal(a, b)


def newest_record(run: pathlib.Path) -> dict:
    """The JSON record of a run's newest checkpoint."""
    step = max(int(path.name) for path in (run / "checkpoints").iterdir() if path.name.isdigit())
    return json.loads((run / "checkpoints" / str(step) / "record" / "metadata").read_text())


@pytest.mark.slow
def test_lm_learn_over_a_folder_of_worker_files_resumes_to_the_weights_of_a_run_never_stopped(
    engine, model_folder, tmp_path, capsys
):
    """A folder of one file per engine worker is learnt as its files concatenated in name order. A run that saw
    w0 whole and w1 in part, resumed once w1 has grown and w2 has joined, learns each episode once: the weights
    of a run over the same episodes in one file; its checkpoint counts the episodes learnt from each file."""
    _, _, trajectories = played(engine, 24)
    records = list(episode_records(trajectories))
    folder = tmp_path / "episodes"
    folder.mkdir()
    write_episodes(folder / "w0.jsonl", records[:10])
    write_episodes(folder / "w1.jsonl", records[10:16])
    run = tmp_path / "parts" / "run"
    assert lm_learn(model_folder, folder, tmp_path / "parts") == 0
    assert newest_record(run)["episodes_used_per_file"] == {"w0.jsonl": 10, "w1.jsonl": 6}
    write_episodes(folder / "w1.jsonl", records[16:20])
    write_episodes(folder / "w2.jsonl", records[20:])
    assert lm_learn(model_folder, folder, tmp_path / "parts", "--resume", str(run)) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["episodes"] == 24
    record = newest_record(run)
    assert record["episodes_used"] == 24
    assert record["episodes_used_per_file"] == {"w0.jsonl": 10, "w1.jsonl": 10, "w2.jsonl": 4}
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [row["episodes"] for row in rows] == [8, 16, 24]
    one_file = tmp_path / "episodes.jsonl"
    write_episodes(one_file, records)
    assert lm_learn(model_folder, one_file, tmp_path / "whole") == 0
    _, whole = load(tmp_path / "whole" / "run" / "weights" / "version-000003")
    _, resumed = load(run / "weights" / "version-000003")
    for a, b in zip(jax.tree.leaves(whole), jax.tree.leaves(resumed), strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.slow
def test_a_follower_stops_at_a_torn_line_naming_it_and_resumed_skipping_bad_lines_learns_each_intact_one_once(
    engine, model_folder, tmp_path, capsys
):
    """Two engine workers append to one file through buffers flushed when full: worker A's 8 lines and half
    its 9th, which the follower learns as one batch; then B's first line and half its second, A's rest, B's
    rest. Lines 9, 10 and 14 are torn. The follower stops at line 9 in one line naming file and line; resumed
    with --skip-bad-lines (a resume may turn it on) it learns the 21 intact episodes once each: the weights of
    a run over them alone."""
    _, _, trajectories = played(engine, 24)
    lines = [json.dumps(record) + "\n" for record in episode_records(trajectories)]
    first, second = lines[:12], lines[12:]  # worker A's and worker B's
    # Where the buffers happened to fill: A's inside its 9th line, B's inside its 2nd; these cuts tear lines that
    # cannot parse, so that no torn line passes for an episode (tests/test_episode_feed.py has one that parses).
    a_cut, b_cut = first[8].index('"spans"'), second[1].index('"reward"') + 2
    path = tmp_path / "episodes.jsonl"
    path.write_text("".join(first[:8]) + first[8][:a_cut])
    run = tmp_path / "followed" / "run"

    def the_rest():  # once the follower has learnt the 8 whole lines
        deadline = time.monotonic() + 300
        while not (run / "weights" / "version-000001").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        chunks = [second[0] + second[1][:b_cut], first[8][a_cut:] + "".join(first[9:])]
        with path.open("a") as file:
            for chunk in [*chunks, second[1][b_cut:] + "".join(second[2:])]:
                file.write(chunk)
                file.flush()

    writers = threading.Thread(target=the_rest)
    writers.start()
    follow = ("--follow", "true", "--idle-timeout", "60", "--poll-seconds", "0.1")
    assert lm_learn(model_folder, path, tmp_path / "followed", *follow) == 2
    writers.join()
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith(f"error: {path}:9: not JSON (")
    assert error.endswith("(pass --skip-bad-lines to leave such lines out).")
    assert lm_learn(model_folder, path, tmp_path / "followed", "--resume", str(run), "--skip-bad-lines") == 0
    captured = capsys.readouterr()
    summary = json.loads(captured.out.splitlines()[-1])
    assert summary["episodes"] == 21 and summary["bad_lines_skipped"] == 3 and summary["iterations"] == 3
    assert [line.split(": ")[0] for line in captured.err.splitlines() if line.startswith("skipped ")] == [
        f"skipped {path}:{line}" for line in (9, 10, 14)
    ]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [row["episodes"] for row in rows] == [8, 16, 21]
    intact = tmp_path / "intact.jsonl"
    intact.write_text("".join(first[:8] + first[9:] + second[2:]))
    assert lm_learn(model_folder, intact, tmp_path / "intact") == 0
    _, expected = load(tmp_path / "intact" / "run" / "weights" / "version-000003")
    _, resumed = load(run / "weights" / "version-000003")
    for a, b in zip(jax.tree.leaves(expected), jax.tree.leaves(resumed), strict=True):
        np.testing.assert_array_equal(a, b)


# ------------------------------------------------------------------------------------ the baselines in the learner


def test_a_batch_is_put_group_by_group_and_a_broken_group_is_named(tmp_path):
    from ftw_jax.agent.episodes import grouped, tied_group_share

    def episode(line, group, reward=0.0):
        record = {**GOOD, "reward": reward, **({} if group is None else {"group": group})}
        return dataclasses.replace(parse_episode(json.dumps(record), vocab_size=64, max_length=16), line=line)

    batch = [episode(1, "a", 1.0), episode(2, 7), episode(3, "a", 1.0), episode(4, 7, 1.0)]
    assert [e.line for e in grouped(batch, 2, "f.jsonl")] == [1, 3, 2, 4]
    assert episode(2, 7).group == "7"
    assert tied_group_share(grouped(batch, 2, "f.jsonl"), 2) == 0.5  # group a: 1, 1
    with pytest.raises(ValueError, match=r"^f.jsonl:2: group '7' has 1 episodes in a batch of 3, expected G=2"):
        grouped(batch[:3], 2, "f.jsonl")
    with pytest.raises(ValueError, match=r"^f.jsonl:5: group: missing; GRPO and RLOO"):
        grouped([*batch, episode(5, None)], 2, "f.jsonl")
    with pytest.raises(ValueError, match="group: True is not a string or an int"):
        parse_episode(json.dumps({**GOOD, "group": True}), vocab_size=64, max_length=16)


LEARNING_SETTINGS = {  # the tiny Qwen2's settings where each algorithm learns the test's reward in 20 iterations
    "ftw": dict(pool_capacity=64, num_batches=8, batch_size=8, num_elites=2, monitor_entries=0),
    "grpo": dict(group_size=4),
    "reinforce": dict(leave_one_out=4),
    "ppo": dict(),
}


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ["ftw", "grpo", "reinforce", "ppo"])
def test_each_algorithm_raises_the_reward_of_an_engines_groups(algorithm):
    """The in-process engine (`lm.make_sampler`) samples G = 4 completions of 6 tokens for each of 4 random prompts
    from the newest weights of the transformers-written tiny Qwen2, and writes them as an engine does (JSON
    records with the prompt's `group`); the reward is the share of even token ids among the completion's.
    Each algorithm, with Search-R1's settings of it (`SEARCH_R1`), lifts the reward from about a half."""
    from ftw_jax import algos
    from ftw_jax.agent.episodes import episode_of, grouped, sample_records
    from ftw_jax.algos.defaults import SEARCH_R1
    from ftw_jax.lm import SamplingConfig, make_sampler

    model, params = load(pathlib.Path(__file__).parent / "data" / "lm" / "qwen2-untied")
    vocab, prompt_length, new_tokens, group_size, prompts = model.config.vocab_size, 4, 6, 4, 4
    settings = {**SEARCH_R1.get(algorithm, {}), **LEARNING_SETTINGS[algorithm]}
    config = LearnConfig(
        algorithm=algorithm,
        max_length=prompt_length + new_tokens,
        episodes_per_iteration=group_size * prompts,
        learning_rate=1e-2,
        algorithm_config=algos.get(algorithm).config(**settings),
    )
    learner = EpisodeLearner.build(config, model.config)
    state = learner.init(params)
    sampler = jax.jit(make_sampler(model, SamplingConfig(max_new_tokens=new_tokens)))
    rng, rewards = np.random.default_rng(0), []
    for iteration in range(20):
        tokens = jnp.asarray(np.repeat(rng.integers(0, vocab, (prompts, prompt_length)), group_size, axis=0))
        sample = sampler(learner.model_params(state), jax.random.key(iteration), tokens, jnp.ones_like(tokens, bool))
        generated = np.asarray(sample.generated)
        reward = (np.asarray(sample.tokens) % 2 == 0)[generated].reshape(len(tokens), -1).mean(axis=1)
        records = sample_records(sample, reward, version=int(state.policy.version))
        episodes = [
            episode_of({**record, "group": f"{iteration}-{row // group_size}"}, vocab_size=vocab, max_length=10)
            for row, record in enumerate(records)
        ]
        if learner.learner.group_size > 1:
            episodes = grouped(episodes, group_size, "engine")
        state, metrics = learner.step(state, to_trajectories(episodes, config.max_length), iteration)
        assert np.all(np.asarray(metrics["applied"]))
        rewards.append(float(reward.mean()))
    assert np.mean(rewards[:3]) < 0.6 and np.mean(rewards[-3:]) > 0.8, rewards


def grouped_records(trajectories, group_size):
    """The engine's episodes as records, every `group_size` consecutive ones a prompt's group."""
    return [{**record, "group": row // group_size} for row, record in enumerate(episode_records(trajectories))]


BASELINE_FLAGS = {
    "grpo": ("--group-size", "4", "--updates-per-iteration", "2"),
    "reinforce": ("--leave-one-out", "4"),
}


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ["grpo", "reinforce"])
def test_grpo_and_rloo_resume_to_the_weights_of_a_run_never_stopped(algorithm, engine, model_folder, tmp_path, capsys):
    """24 grouped episodes in 3 batches; the same file cut after 16 and the run resumed on the whole file: the
    same weights, bit for bit. (PPO, with its critic: after SIGKILL, `test_a_follower_killed_while_writing...`.)"""
    _, _, trajectories = played(engine, 24)
    episodes = tmp_path / "episodes.jsonl"
    write_episodes(episodes, grouped_records(trajectories, 4))
    flags = ("--algorithm", algorithm, "--kl-coef", "0.01", *BASELINE_FLAGS[algorithm])
    assert lm_learn(model_folder, episodes, tmp_path / "whole", *flags) == 0
    assert "do(es) not apply" in capsys.readouterr().err  # lm_learn's FTW flags, named and left out
    growing = tmp_path / "growing.jsonl"
    growing.write_text("".join(episodes.read_text().splitlines(keepends=True)[:16]))
    assert lm_learn(model_folder, growing, tmp_path / "parts", *flags) == 0
    growing.write_text(episodes.read_text())
    assert lm_learn(model_folder, growing, tmp_path / "parts", *flags, "--resume", str(tmp_path / "parts" / "run")) == 0
    summary = json.loads(capsys.readouterr().out.splitlines()[-1])
    steps = {"grpo": 2, "reinforce": 1}[algorithm]
    assert summary["iterations"] == 3 and summary["version"] == 3 * steps
    whole, parts = (
        load(tmp_path / name / "run" / "weights" / f"version-{3 * steps:06d}")[1] for name in ("whole", "parts")
    )
    for a, b in zip(jax.tree.leaves(whole), jax.tree.leaves(parts)):
        np.testing.assert_array_equal(a, b)
    rows = [json.loads(line) for line in (tmp_path / "parts" / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [row["episodes"] for row in rows] == [8, 16, 24]
    assert all(0 <= row["groups_tied"] <= 1 for row in rows)


def stored_critic(run: pathlib.Path) -> dict:
    """The critic's params in the newest checkpoint of a PPO run, read without a template."""
    import orbax.checkpoint as ocp

    step = max(int(path.name) for path in (run / "checkpoints").iterdir() if path.name.isdigit())
    return ocp.StandardCheckpointer().restore((run / "checkpoints" / str(step) / "carry").absolute())["critic"][
        "params"
    ]


@pytest.mark.slow
def test_lm_learn_refuses_episodes_without_groups_for_grpo_in_one_line(engine, model_folder, tmp_path, capsys):
    _, _, trajectories = played(engine, 8)
    episodes = tmp_path / "episodes.jsonl"
    write_episodes(episodes, episode_records(trajectories))
    assert lm_learn(model_folder, episodes, tmp_path, "--algorithm", "grpo", "--group-size", "4") == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"error: {episodes}:1: group: missing; GRPO and RLOO compare each episode with the others sampled for its "
        "prompt, so every episode names it (groups of G=4)."
    )


def test_a_bool_setting_is_a_bare_flag_with_a_no_flag_and_still_takes_yes_or_no():
    parser = cli.build_parser()
    base = ["lm", "learn", "--episodes", "e.jsonl", "--model", "m"]
    assert parser.parse_args([*base, "--follow"]).follow is True
    assert parser.parse_args([*base, "--follow", "true"]).follow is True
    assert parser.parse_args([*base, "--follow", "no"]).follow is False
    assert parser.parse_args([*base, "--no-follow"]).follow is False
    assert parser.parse_args(base).follow is None  # not given: the setting's default


@pytest.mark.slow
def test_lm_learn_warns_when_every_group_was_tied(engine, model_folder, tmp_path, capsys):
    """GRPO on groups whose rewards are all equal applies its steps (only the KL moves the weights) and says
    that it had nothing to learn from."""
    _, _, trajectories = played(engine, 8)
    episodes = tmp_path / "episodes.jsonl"
    write_episodes(episodes, [{**record, "reward": 1.0} for record in grouped_records(trajectories, 4)])
    assert lm_learn(model_folder, episodes, tmp_path, "--algorithm", "grpo", "--group-size", "4") == 0
    assert "warning: every group's rewards were tied in all 1 iterations: grpo had no advantage" in (
        capsys.readouterr().err
    )
