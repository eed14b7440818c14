"""LoRA (`ftw_jax.lm.lora`): adapters that start as the base model, merge into plain weights, train alone, and
cost less memory than the whole model; `lm learn --lora-rank`."""

import dataclasses
import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ftw_jax import cli
from ftw_jax.agent.episodes import episode_of, to_trajectories, write_episodes
from ftw_jax.agent.learner import EpisodeLearner, LearnConfig, load_for_learning
from ftw_jax.algos.ftw import FTWConfig
from ftw_jax.lm import CausalLM, load, lora, save

QWEN2 = pathlib.Path(__file__).parent / "data" / "lm" / "qwen2-untied"
TOKENS = jnp.asarray(np.random.default_rng(0).integers(0, 96, (2, 12)), jnp.int32)


def with_random_b(params: dict, seed: int = 1) -> dict:
    """Adapters whose B is no longer zero: the adapted model differs from the base."""
    keys = iter(jax.random.split(jax.random.key(seed), 64))
    return jax.tree_util.tree_map_with_path(
        lambda path, leaf: 0.05 * jax.random.normal(next(keys), leaf.shape) if path[-1].key == "lora_b" else leaf,
        params,
    )


def test_adapters_start_as_the_base_and_merge_into_its_weights(tmp_path):
    """B = 0: the adapted model's logits are the base's, exactly. With B moved: the merged weights W + (α/r) A B
    in the plain model give the adapted logits (float32, ≤ 1e-5), and so do they saved and read back."""
    model, base = load(QWEN2)
    config = dataclasses.replace(model.config, lora_rank=4, lora_alpha=8.0)
    adapted = lora.with_adapters(jax.random.key(0), config, base)
    np.testing.assert_array_equal(CausalLM(config).apply(adapted, TOKENS), model.apply(base, TOKENS))
    assert lora.adapter_count(adapted) == config.num_layers * 4 * sum(
        d_in + d_out for d_in, d_out in lora_shapes(config)
    )
    moved = with_random_b(adapted)
    logits = CausalLM(config).apply(moved, TOKENS)
    assert float(jnp.max(jnp.abs(logits - model.apply(base, TOKENS)))) > 1e-3  # the adapters change the model
    merged = lora.merged(config, moved)
    assert not lora.adapter_count(merged)
    np.testing.assert_allclose(model.apply(merged, TOKENS), logits, atol=1e-5)
    save(tmp_path / "merged", model.config, merged)
    reloaded_model, reloaded = load(tmp_path / "merged")
    np.testing.assert_allclose(reloaded_model.apply(reloaded, TOKENS), logits, atol=1e-5)


def lora_shapes(config) -> list[tuple[int, int]]:
    """(D_in, D_out) of every targeted projection of one layer."""
    d, f, q, kv = config.hidden_size, config.intermediate_size, config.num_heads, config.num_kv_heads
    h = config.head_dim
    return [(d, q * h), (d, kv * h), (d, kv * h), (q * h, d), (d, f), (d, f), (f, d)]


def learner_and_batch(lora_rank: int | None, algorithm: str = "ftw"):
    model, _ = load(QWEN2)
    ftw = FTWConfig(pool_capacity=8, num_batches=2, batch_size=4, num_elites=2, monitor_entries=0)
    config = LearnConfig(
        max_length=12,
        episodes_per_iteration=4,
        learning_rate=1e-2,
        kl_coef=0.1,
        lora_rank=lora_rank,
        algorithm=algorithm,
        algorithm_config=ftw if algorithm == "ftw" else None,
    )
    _, params = load_for_learning(QWEN2, config)
    learner = EpisodeLearner.build(config, model.config)
    rng = np.random.default_rng(2)
    records = [
        {"tokens": rng.integers(0, 96, 12).tolist(), "reward": float(row % 2),
         "spans": [{"start": 4, "end": 12, "version": 0, "logprobs": (-rng.random(8)).tolist()}]}
        for row in range(4)
    ]  # fmt: skip
    batch = to_trajectories([episode_of(r, vocab_size=96, max_length=12) for r in records], 12)
    return learner, params, batch


def test_a_lora_step_moves_the_adapters_alone_and_keeps_no_second_base():
    learner, params, batch = learner_and_batch(lora_rank=2)
    state = learner.init(params)
    assert jax.tree.leaves(state.policy.reference_params)  # the adapters, as they started...
    assert lora.adapter_count(state.policy.reference_params) == sum(
        leaf.size for leaf in jax.tree.leaves(state.policy.reference_params)
    )  # ...and nothing else: the frozen base is the params' own
    before = jax.tree.leaves(jax.tree.map(np.asarray, state.policy.params))
    new, metrics = learner.step(state, batch, 0)
    assert bool(metrics["applied"][0])
    moved = {
        jax.tree_util.keystr(path): bool(np.any(np.asarray(leaf) != old))
        for (path, leaf), old in zip(jax.tree_util.tree_flatten_with_path(new.policy.params)[0], before)
    }
    assert not any(changed for name, changed in moved.items() if "lora" not in name)  # the base, bit for bit
    assert all(changed for name, changed in moved.items() if "lora_b" in name)  # every B took a step
    assert not any(changed for name, changed in moved.items() if "lora_a" in name)  # A's gradient is 0 while B = 0
    opt_leaves = [leaf for leaf in jax.tree.leaves(new.policy.opt_state) if np.ndim(leaf)]
    assert sum(np.size(leaf) for leaf in opt_leaves) == 2 * lora.adapter_count(new.policy.params)  # Adam's m, v


def test_ppos_critic_under_lora_trains_its_adapters_and_head_on_a_frozen_copy_of_the_base():
    learner, params, batch = learner_and_batch(lora_rank=2, algorithm="ppo")
    state = learner.init(params)
    before = jax.tree.leaves(jax.tree.map(np.asarray, state.critic.params))
    new, _ = learner.step(state, batch, 0)
    moved = {
        jax.tree_util.keystr(path): bool(np.any(np.asarray(leaf) != old))
        for (path, leaf), old in zip(jax.tree_util.tree_flatten_with_path(new.critic.params)[0], before)
    }
    assert all(changed for name, changed in moved.items() if "head" in name or "lora_b" in name)
    assert not any(changed for name, changed in moved.items() if "lora" not in name and "head" not in name)


@pytest.mark.slow
def test_lora_compiles_to_less_memory_than_the_whole_model():
    """The same update at the same shape: Adam's moments and the reference for the adapters alone."""
    sizes = {}
    for rank in (None, 2):
        learner, params, batch = learner_and_batch(lora_rank=rank)
        state = learner.init(params)
        compiled = learner.jitted(state).lower(state, batch, np.int32(0)).compile().memory_analysis()
        sizes[rank] = compiled.argument_size_in_bytes + compiled.temp_size_in_bytes
    assert sizes[2] < 0.8 * sizes[None], sizes


@pytest.mark.slow
def test_lm_learn_with_lora_writes_merged_weights_and_resumes_exactly(tmp_path, capsys):
    """`lm learn --lora-rank 2 --lora-alpha 4` on the tiny Qwen2: the versions it writes are plain checkpoints
    (the adapters merged: `lm.load` reads them, and transformers, experiments/lm/lora_parity.py); a run cut after 8
    of 12 episodes and resumed writes the same weights bit for bit; a resume with another rank is refused."""
    rng = np.random.default_rng(3)
    episodes = tmp_path / "episodes.jsonl"
    records = [
        {"tokens": rng.integers(0, 96, 12).tolist(), "reward": float(row % 3),
         "spans": [{"start": 4, "end": 12, "version": 0, "logprobs": (-rng.random(8)).tolist()}]}
        for row in range(12)
    ]  # fmt: skip
    write_episodes(episodes, records)
    flags = ["--max-length", "12", "--episodes-per-iteration", "4", "--pool-capacity", "8", "--num-batches", "2"]
    flags += ["--batch-size", "4", "--num-elites", "2", "--learning-rate", "0.01", "--kl-coef", "0.1"]
    flags += ["--lora-rank", "2", "--lora-alpha", "4", "--sampler-gap-limit", "0", "--json"]  # made-up log-probs

    def learn(file, out, *extra):
        argv = ["lm", "learn", "--episodes", str(file), "--model", str(QWEN2), "--out", str(out), "--name", "run"]
        return cli.main([*argv, *flags, *extra])

    assert learn(episodes, tmp_path / "whole") == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["version"] == 3
    model, written = load(tmp_path / "whole" / "run" / "weights" / "version-000003")
    _, start = load(QWEN2)
    moved = max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(jax.tree.leaves(written), jax.tree.leaves(start)))
    assert moved > 1e-4  # the adapters, merged, changed the weights
    cut = tmp_path / "cut.jsonl"
    cut.write_text("".join(episodes.read_text().splitlines(keepends=True)[:8]))
    assert learn(cut, tmp_path / "parts") == 0
    cut.write_text(episodes.read_text())
    run = tmp_path / "parts" / "run"
    assert learn(cut, tmp_path / "parts", "--resume", str(run)) == 0
    _, resumed = load(run / "weights" / "version-000003")
    for a, b in zip(jax.tree.leaves(written), jax.tree.leaves(resumed)):
        np.testing.assert_array_equal(a, b)
    capsys.readouterr()
    flags[flags.index("--lora-rank") + 1] = "4"
    assert learn(cut, tmp_path / "parts", "--resume", str(run)) == 2
    assert "lora_rank: 2 -> 4" in capsys.readouterr().err
