"""Mutation testing: plant one known bug at a time in a copy of the package and check that the tests catch it.

    python tests/mutations.py                 # every mutation (about 15 minutes on 2 CPU cores)
    python tests/mutations.py kl-swapped ...  # only these
    python tests/mutations.py --list          # names and what each breaks

For each mutation the repository's `ftw_jax/`, `tests/`, `experiments/` and `pyproject.toml` are copied to a
temporary folder, one exact piece of source is replaced (it must occur exactly once, so a mutation that no
longer applies is an error, not a silent pass), and the tests named for it run there (`python -m pytest -x`,
the copy first on the import path, subprocesses included). A mutation is *killed* when those tests fail and
*survives* when they pass. The named tests are first run once on the unmutated copy: they must pass there,
or nothing is learned. The script prints a table and exits non-zero if any mutation survived or could not be applied.

Run it before a release and after changing a test that pins one of these claims; it is too slow for every
CI run. A new claim gets a new entry: the smallest edit that breaks it, and the tests that should notice.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time
from typing import NamedTuple

ROOT = pathlib.Path(__file__).resolve().parents[1]


REFERENCE_TESTS = "tests/test_reference_options.py"


@dataclasses.dataclass(frozen=True)
class Mutation:
    name: str
    breaks: str  # the claim the mutation breaks, in a few words
    path: str  # relative to the repository root
    before: str  # exact source text, found exactly once
    after: str
    tests: tuple[str, ...]  # pytest arguments: node ids, files, -k expressions

    def apply(self, root: pathlib.Path) -> None:
        file = root / self.path
        text = file.read_text()
        if text.count(self.before) != 1:
            raise LookupError(f"{self.path}: the text to mutate occurs {text.count(self.before)} times, not once")
        file.write_text(text.replace(self.before, self.after))


class Outcome(NamedTuple):
    mutation: Mutation
    verdict: str  # "killed", "SURVIVED", "TIMEOUT", "NOT APPLIED" or "ERROR (...)"
    seconds: float
    detail: str  # the first failing test, or why there is none


UPDATE_TESTS = ("tests/test_update.py",)
BASELINE_TESTS = (
    "tests/test_policy_gradient.py",
    "-k",
    "by_hand or clips or written_out or advantages or nan_gradient",
)
RESUME_TESTS = ("tests/test_checkpoints.py",)
SWEEP_TESTS = ("tests/test_sweep.py", "-k", "standalone or reproduce or resumes")
SKIP_TESTS = ("tests/test_skipped_updates.py", "-m", "not slow")

# `MemberRun.periods` hands a period to its caller (who writes its rows), then checkpoints it.
_YIELD = (
    "            yield metrics, evaluation  # the caller writes the period's logs before the checkpoint counts it\n"
)
_SAVE = (
    '            record = {"history": rows_record(self.history), "seconds": self.seconds}\n'
    "            save_then_stop(self.checkpointer, period + 1, self.carry, record, last=period + 1 == last, "
    "stop=stop)\n"
)
YIELD_THEN_SAVE, SAVE_THEN_YIELD = _YIELD + _SAVE, _SAVE + _YIELD

MUTATIONS = (
    # Non-finite and skipped steps (one `apply_if_finite` serves FTW, the baselines and PPO's critic).
    Mutation(
        "finite-checks-loss-only",
        "a NaN gradient with a finite loss is applied",
        "ftw_jax/core/state.py",
        "finite = jnp.isfinite(loss) & all_finite(grads) & all_finite(updates)",
        "finite = jnp.isfinite(loss)",
        (*UPDATE_TESTS, *BASELINE_TESTS[:1]),
    ),
    Mutation(
        "finite-ignores-updates",
        "a non-finite optimizer update from finite gradients is applied",
        "ftw_jax/core/state.py",
        "finite = jnp.isfinite(loss) & all_finite(grads) & all_finite(updates)",
        "finite = jnp.isfinite(loss) & all_finite(grads)",
        UPDATE_TESTS,
    ),
    Mutation(
        "skipped-step-advances-optimizer",
        "the optimizer state moves on a skipped step",
        "ftw_jax/core/state.py",
        "params, opt_state = jax.lax.cond(applied, step, lambda state: state, (params, opt_state))",
        "params, opt_state = params, step((params, opt_state))[1]",
        UPDATE_TESTS,
    ),
    Mutation(
        "skipped-step-counts-a-version",
        "a skipped step counts as a policy version",
        "ftw_jax/core/state.py",
        "version=self.version + applied.astype(jnp.int32)",
        "version=self.version + 1",
        UPDATE_TESTS,
    ),
    Mutation(
        "baseline-applies-nan-step",
        "a baseline step with a NaN gradient is applied as a zero gradient",
        "ftw_jax/algos/policy_gradient.py",
        "new_state, applied, _ = state.apply_if_finite(grads, loss)",
        "new_state, applied, _ = state.apply_if_finite(jax.tree.map(jnp.nan_to_num, grads), loss)",
        BASELINE_TESTS,
    ),
    Mutation(
        "critic-unchecked-step",
        "a critic step with a NaN gradient is applied",
        "ftw_jax/algos/ppo.py",
        "params, opt_state, _, _ = apply_if_finite(optimizer, critic.params, critic.opt_state, grads, loss)",
        "updates, opt_state = optimizer.update(grads, critic.opt_state, critic.params)\n"
        "        params = optax.apply_updates(critic.params, updates)",
        BASELINE_TESTS,
    ),
    # Skipped updates stop a run (issue 31): counted once ready, in a row, checkpointed, resumable.
    Mutation(
        "skips-count-not-ready",
        "updates before the pool is ready count as skipped (and stop a run at its start)",
        "ftw_jax/running/skips.py",
        "    skipped = ready & ~applied",
        "    skipped = ~applied",
        SKIP_TESTS,
    ),
    Mutation(
        "skips-run-not-carried",
        "skipped updates in a row start again at every iteration",
        "ftw_jax/running/skips.py",
        "+ np.where(np.asarray(applied)[..., index] == 0, in_a_row, 0)",
        "+ 0",
        SKIP_TESTS,
    ),
    Mutation(
        "skips-never-stop",
        "a run that applies no update goes on and exits 0",
        "ftw_jax/running/checkpoints.py",
        "    if stop is not None:\n        raise stop",
        "    if False:\n        raise stop",
        SKIP_TESTS,
    ),
    Mutation(
        "skips-stop-unsaved",
        "a stop between --checkpoint-every periods leaves no checkpoint of where it stopped",
        "ftw_jax/running/checkpoints.py",
        "final=last or stop is not None)",
        "final=last)",
        SKIP_TESTS,
    ),
    Mutation(
        "checkpoint-before-rows",
        "a period is checkpointed before its rows are written: a kill in between loses them for good",
        "ftw_jax/running/loop.py",
        YIELD_THEN_SAVE,
        SAVE_THEN_YIELD,
        ("tests/test_faults.py", "-k", "checkpointed_only"),
    ),
    Mutation(
        "rows-lost-on-resume",
        "a resume from a checkpoint whose rows were cut since goes on without them",
        "ftw_jax/running/run_files.py",
        "    if missing:",
        "    if False:",
        ("tests/test_faults.py", "-k", "cut_behind"),
    ),
    Mutation(
        "skips-run-lost-on-resume",
        "a resumed run forgets the updates it skipped before",
        "ftw_jax/running/loop.py",
        "{**skips.no_skips(self.num_members), **row}",
        "{**row, **skips.no_skips(self.num_members)}",
        SKIP_TESTS,
    ),
    Mutation(
        "skips-uncounted",
        "the summary and progress lines count no skipped update",
        "ftw_jax/running/skips.py",
        '"updates_skipped": before["updates_skipped"] + counts["skipped_count"].sum(axis=-1),',
        '"updates_skipped": before["updates_skipped"],',
        SKIP_TESTS,
    ),
    Mutation(
        "skips-limit-fingerprinted",
        "a stopped run cannot be resumed with --stop-after-skipped 0",
        "ftw_jax/running/checkpoints.py",
        '        "stop_after_skipped",\n',
        "",
        SKIP_TESTS,
    ),
    Mutation(
        "skips-stop-exits-zero",
        "a stopped run exits 0",
        "ftw_jax/cli/command.py",
        "        return STOPPED_SKIPPING",
        "        return 0",
        SKIP_TESTS,
    ),
    Mutation(
        "skips-tuning-stops",
        "compare stops for a tuning configuration that diverges",
        "ftw_jax/lab/compare.py",
        'stops=phase == "report",',
        "stops=True,",
        ("tests/test_skipped_updates.py", "-k", "compare"),
    ),
    Mutation(
        "skips-lm-learn-never-stops",
        "lm learn goes on when an iteration applies no update",
        "ftw_jax/agent/lm_learn.py",
        "save_then_stop(checkpointer, iteration, state, record, last=last, stop=stop)",
        "save_then_stop(checkpointer, iteration, state, record, last=last, stop=None)",
        ("tests/test_lm_learner.py", "-k", "non_finite_stops"),
    ),
    Mutation(
        "skips-lm-learn-run-lost-on-resume",
        "lm learn forgets on resume the updates it skipped",
        "ftw_jax/agent/lm_learn.py",
        '**record.get("skipped", {})}',
        "}",
        ("tests/test_lm_learner.py", "-k", "non_finite_stops"),
    ),
    # Resume, checkpoints, sweeps and comparisons.
    Mutation(
        "resume-restarts",
        "--resume silently starts again from iteration 0 (train, sweep, compare)",
        "ftw_jax/running/loop.py",
        "restored = checkpointer.restore(self.carry) if checkpointer else None",
        "restored = None",
        (*RESUME_TESTS, *SWEEP_TESTS),
    ),
    Mutation(
        "resume-fresh-optimizer",
        "the optimizer state is not restored",
        "ftw_jax/running/checkpoints.py",
        "            return step, with_keys_like(template, stored), record",
        "            carry = with_keys_like(template, stored)\n"
        "            policy = carry.learner.policy.replace(opt_state=template.learner.policy.opt_state)\n"
        "            carry = carry.replace(learner=carry.learner.replace(policy=policy))\n"
        "            return step, carry, record",
        RESUME_TESTS,
    ),
    Mutation(
        "checkpoint-every-ignored",
        "--checkpoint-every saves every period anyway (train and compare alike)",
        "ftw_jax/running/checkpoints.py",
        "Checkpointer(directory, fingerprint, every=self.every, keep=self.keep)",
        "Checkpointer(directory, fingerprint, every=1, keep=self.keep)",
        RESUME_TESTS,
    ),
    Mutation(
        "compare-resume-restarts",
        "compare --resume finds none of its phases' checkpoints",
        "ftw_jax/lab/compare.py",
        'checkpoint_folder / f"{algorithm}-{phase}"',
        'checkpoint_folder / f"{algorithm}-{phase}-{id(sweep)}"',
        ("tests/test_compare.py",),
    ),
    Mutation(
        "resume-forgets-seconds",
        "a resumed run reports only this process's seconds",
        "ftw_jax/running/loop.py",
        'self.seconds_before = float(record.get("seconds", 0.0))',
        "self.seconds_before = 0.0",
        ("tests/test_checkpoints.py", "-k", "restored_finished"),
    ),
    Mutation(
        "finished-run-compiles",
        "a run restored finished compiles its program again",
        "ftw_jax/running/loop.py",
        "if len(self.history) >= last:  # restored finished",
        "if False:  # restored finished",
        ("tests/test_checkpoints.py", "-k", "restored_finished"),
    ),
    # The causal LM (ftw_jax.lm).
    Mutation(
        "llama3-rope-ignored",
        "Llama 3's rope scaling is read but not applied",
        "ftw_jax/lm/config.py",
        "        if self.rope_scaling is None:\n            return frequencies",
        "        if True:\n            return frequencies",
        ("tests/test_lm.py",),
    ),
    Mutation(
        "cache-writes-slot-zero",
        "the KV cache overwrites its first slot at every decoding step",
        "ftw_jax/lm/model.py",
        "start = (0, cache_index, 0, 0)",
        "start = (0, 0, 0, 0)",
        ("tests/test_lm.py", "-k", "cache"),
    ),
    Mutation(
        "sampler-behaviour-is-plain",
        "the behaviour log-prob ignores temperature, top-k and top-p",
        "ftw_jax/lm/sampler.py",
        "jnp.where(active, pick(log_probs), 0.0)",
        'jnp.where(active, pick(jax.nn.log_softmax(state["logits"])), 0.0)',
        ("tests/test_lm_sampler.py",),
    ),
    Mutation(
        "nucleus-from-candidates-any-row",
        "top-p alone keeps the candidates' nucleus when one row's mass reaches top_p, not every row's",
        "ftw_jax/lm/sampler.py",
        "jnp.all(mass[..., -1] >= top_p)",
        "jnp.any(mass[..., -1] >= top_p)",
        ("tests/test_lm_sampler.py",),
    ),
    Mutation(
        "lm-policy-acts-at-position-zero",
        "the search LM acts with every token at rotary position 0",
        "ftw_jax/policies/lm.py",
        "positions = jnp.reshape(position, (1, 1)).astype(jnp.int32)",
        "positions = jnp.zeros((1, 1), jnp.int32)",
        ("tests/test_search.py", "-k", "cache"),
    ),
    # The LLM-agent learner (ftw_jax.agent.episodes, ftw_jax.agent.learner) and the text search agent.
    Mutation(
        "episode-mask-all-tokens",
        "JSONL episodes train on the environment's tokens too",
        "ftw_jax/agent/episodes.py",
        "= episode.written[1:], episode.logprobs[1:], episode.versions[1:]",
        "= True, episode.logprobs[1:], episode.versions[1:]",
        ("tests/test_lm_learner.py", "-k", "round_trip or in_process"),
    ),
    Mutation(
        "episode-one-version",
        "every token of an episode gets its last span's policy version",
        "ftw_jax/agent/episodes.py",
        "= episode.written[1:], episode.logprobs[1:], episode.versions[1:]",
        "= episode.written[1:], episode.logprobs[1:], episode.versions.max()",
        ("tests/test_lm_learner.py", "-k", "versions"),
    ),
    Mutation(
        "logprob-count-unchecked",
        "a span with too few log-probs is not named as the bad field",
        "ftw_jax/agent/episodes.py",
        "if not isinstance(values, list) or len(values) != end - start:",
        "if not isinstance(values, list):",
        ("tests/test_lm_learner.py", "-k", "bad_field"),
    ),
    Mutation(
        "learn-resume-rereads",
        "lm learn --resume learns from the episodes it already used again",
        "ftw_jax/agent/lm_learn.py",
        'used = record["episodes_used"]',
        "used = 0",
        ("tests/test_lm_learner.py", "-k", "resume"),
    ),
    Mutation(
        "answer-length-unchecked",
        "an answer that merely ends with the right word scores 1",
        "ftw_jax/envs/text_search.py",
        "            & (content == lengths[state.answer])\n",
        "",
        ("tests/test_text_search.py", "-k", "exact_answer"),
    ),
    # Sokoban's held-out test levels: held out by room, and each played once per evaluation.
    Mutation(
        "held-out-starts-not-rooms",
        "a training reset may draw a test level's room with another player start (only exact test levels redrawn)",
        "ftw_jax/envs/sokoban.py",
        "jnp.asarray(held_out_rooms(layout)) == room_hash(level)",
        "jnp.asarray(jax.vmap(level_hash)(held_out_levels(layout))) == level_hash(level)",
        ("tests/test_sokoban.py", "-k", "test_levels_room"),
    ),
    Mutation(
        "evaluation-draws-test-levels-at-random",
        "an evaluation draws its test levels with replacement instead of playing each once",
        "ftw_jax/lab/train.py",
        "num_episodes=config.eval_episodes, episode_params=episode_params",
        "num_episodes=config.eval_episodes",
        ("tests/test_sokoban.py", "-k", "each_test_level_once"),
    ),
    Mutation(
        "start-weights-compiled-in",
        "the members start from weights compiled in, not the ones given",
        "ftw_jax/running/loop.py",
        "self.trainer.init(jax.random.wrap_key_data(data), h, start)",
        "self.trainer.init(jax.random.wrap_key_data(data), h)",
        ("tests/test_text_search.py", "-k", "argument_of_the_compiled_init"),
    ),
    # The update's speed paths must not change its maths.
    Mutation(
        "stepwise-token-weights-only",
        "the stepwise loss averages per token under every normalisation",
        "ftw_jax/core/elite_loss.py",
        "            (step_coefficients(config, step_weights), trajectories.observation, trajectories.action)",
        "            (step_weights / jnp.maximum(jnp.sum(step_weights), 1e-12), trajectories.observation, "
        "trajectories.action)",
        ("tests/test_update.py", "-k", "stepwise"),
    ),
    Mutation(
        "stepwise-first-chunk-only",
        "the stepwise losses stop after their first chunk",
        "ftw_jax/core/stepwise.py",
        "lambda carry: carry[0] * chunk < num_counted",
        "lambda carry: carry[0] < 1",
        ("tests/test_stepwise.py", "tests/test_update.py", "tests/test_policy_gradient.py", "-k", "stepwise or markov"),
    ),
    Mutation(
        "stepwise-unused-inputs-reach-the-gradient",
        "NaN inputs of never-kept entries and padding reach the stepwise losses",
        "ftw_jax/core/stepwise.py",
        "steps = jnp.where(in_chunk, jax.lax.dynamic_slice(order, (start,), (chunk,)), order[0])",
        "steps = jax.lax.dynamic_slice(order, (start,), (chunk,))",
        ("tests/test_stepwise.py", "tests/test_update.py", "tests/test_policy_gradient.py", "-k", "stepwise or markov"),
    ),
    Mutation(
        "stepwise-ignores-mask",
        "the stepwise loss weighs every step, the policy's or not",
        "ftw_jax/core/elite_loss.py",
        "step_weights = weights[:, None] * trajectories.mask  # [M, T]",
        "step_weights = weights[:, None] * jnp.ones_like(trajectories.mask)  # [M, T]",
        ("tests/test_update.py", "-k", "stepwise"),
    ),
    Mutation(
        "diagnostics-flag-batched",
        "FTW's learner asks for the diagnostics with a flag vmap batches",
        "ftw_jax/algos/ftw.py",
        "u == last if last else True",
        "(policy.version >= 0) & (u == last) if last else True",
        ("tests/test_update.py", "-k", "once_per_batch"),
    ),
    # Sweep members.
    Mutation(
        "sweep-ignores-member-lr",
        "every sweep member trains at the program's learning rate",
        "ftw_jax/lab/train.py",
        "learner=learner.init(params_key, observation, hyperparameters, *starting)",
        "learner=learner.init(params_key, observation, hyperparameters.replace("
        "learning_rate=config.hyperparameters().learning_rate), *starting)",
        SWEEP_TESTS,
    ),
    Mutation(
        "sweep-ignores-member-kl",
        "every sweep member trains at the program's β",
        "ftw_jax/lab/train.py",
        "learner=learner.init(params_key, observation, hyperparameters, *starting)",
        "learner=learner.init(params_key, observation, hyperparameters.replace("
        "kl_coef=config.hyperparameters().kl_coef), *starting)",
        SWEEP_TESTS,
    ),
    Mutation(
        "sweep-ignores-member-sizes",
        "every sweep member selects with the program's J, C, K",
        "ftw_jax/algos/ftw.py",
        "update(policy, pool, key, hyperparameters.algorithm.sizes, u == last if last else True)",
        "update(policy, pool, key, None, u == last if last else True)",
        SWEEP_TESTS,
    ),
    # FTW's loss.
    Mutation(
        "kl-swapped",
        "FTW's KL(π ‖ π_ref) computed as KL(π_ref ‖ π)",
        "ftw_jax/core/elite_loss.py",
        "kl = losses.categorical_kl(logits, reference_logits, mask)",
        "kl = losses.categorical_kl(reference_logits, logits, mask)",
        UPDATE_TESTS,
    ),
    Mutation(
        "kl-directions-exchanged",
        "each KL direction option computes the other one",
        "ftw_jax/core/elite_loss.py",
        'if config.kl_direction == "policy_to_reference":',
        'if config.kl_direction == "reference_to_policy":',
        UPDATE_TESTS,
    ),
    Mutation(
        "kl-dropped",
        "FTW's loss without its KL term",
        "ftw_jax/core/elite_loss.py",
        'return terms["cross_entropy"] + kl_coef * terms["kl"], (terms, log_weights, kept_steps)',
        'return terms["cross_entropy"], (terms, log_weights, kept_steps)',
        UPDATE_TESTS,
    ),
    # Baselines.
    Mutation(
        "baseline-kl-sign",
        "the baselines reward moving away from the reference",
        "ftw_jax/algos/policy_gradient.py",
        'return terms["surrogate"] + kl_coef * terms["kl"] - entropy_coef',
        'return terms["surrogate"] - kl_coef * terms["kl"] - entropy_coef',
        BASELINE_TESTS,
    ),
    Mutation(
        "grpo-batch-mean",
        "GRPO's advantages centred on the batch, not the group",
        "ftw_jax/algos/grpo.py",
        "return group_advantages(returns, config.group_size, normalise=config.normalise_advantages)",
        "return returns - jnp.mean(returns)",
        BASELINE_TESTS,
    ),
    Mutation(
        "grpo-unclipped",
        "GRPO's ratio never clipped",
        "ftw_jax/algos/grpo.py",
        "clip_epsilon=config.clip_epsilon,",
        "clip_epsilon=1e9,",
        BASELINE_TESTS,
    ),
    Mutation(
        "ppo-k3-kl",
        "PPO's KL replaced by GRPO's k3 estimate",
        "ftw_jax/algos/ppo.py",
        'kl_estimate=None if config.kl_in_reward else "exact",',
        'kl_estimate=None if config.kl_in_reward else "k3",',
        BASELINE_TESTS,
    ),
    # Task filtering.
    Mutation(
        "filtered-tasks-unused",
        "the kept tasks never reach training",
        "ftw_jax/lab/train.py",
        "reset_keys = jnp.repeat(groups, group_size, axis=0)",
        "reset_keys = None",
        ("tests/test_probes.py",),
    ),
    Mutation(
        "keep-always-solved-tasks",
        "tasks solved by every probe are kept",
        "ftw_jax/lab/probes.py",
        "return (successes > 0) & (successes < num_probes)",
        "return successes > 0",
        ("tests/test_probes.py",),
    ),
    # Environments and processes.
    Mutation(
        "gymnax-ignores-truncation",
        "a gymnax episode cut by its time limit does not end",
        "ftw_jax/envs/gymnax_adapter.py",
        "return obs, state, reward, terminated | truncated, info",
        "return obs, state, reward, terminated, info",
        ("tests/test_envs.py",),
    ),
    Mutation(
        "distributed-not-initialised",
        "--distributed does not join the cluster",
        "ftw_jax/cli/cluster.py",
        "    elif args.distributed:\n        jax.distributed.initialize()",
        "    elif args.distributed:\n        pass",
        ("tests/test_sweep.py", "-k", "distributed"),
    ),
    # The core: selection, occupancy, masks.
    Mutation(
        "floyd-with-replacement",
        "minibatches drawn with replacement (Floyd's path)",
        "ftw_jax/core/selection.py",
        "position = jnp.where(jnp.any(kept == draws[i]), tops[i], draws[i])",
        "position = draws[i]",
        ("tests/test_selection.py",),
    ),
    Mutation(
        "keys-with-replacement",
        "minibatches drawn with replacement (random-keys path)",
        "ftw_jax/core/selection.py",
        "_, candidates = jax.lax.top_k(draw, max_batch_size)",
        "candidates = jax.random.randint(key, (max_batch_size,), 0, valid.shape[0])",
        ("tests/test_selection.py",),
    ),
    Mutation(
        "selection-keeps-worst",
        "the K worst of a minibatch kept",
        "ftw_jax/core/selection.py",
        "-jnp.where(is_nan, 0.0, candidate_returns)",
        "jnp.where(is_nan, 0.0, candidate_returns)",
        ("tests/test_selection.py",),
    ),
    Mutation(
        "masked-k-off-by-one",
        "K + 1 elites kept below the maxima",
        "ftw_jax/core/selection.py",
        "(jnp.arange(max_elites) >= num_elites)",
        "(jnp.arange(max_elites) > num_elites)",
        ("tests/test_selection.py",),
    ),
    Mutation(
        "occupancy-rank-off-by-one",
        "Eq. 5 with binom(r, k − 1) for binom(r − 1, k − 1)",
        "ftw_jax/core/occupancy.py",
        "_log_binomial(ranks - 1, ks - 1, xp)",
        "_log_binomial(ranks, ks - 1, xp)",
        ("tests/test_occupancy.py",),
    ),
    Mutation(
        "log-likelihood-ignores-mask",
        "padding steps enter the cross-entropy",
        "ftw_jax/core/losses.py",
        "return jnp.where(mask, jnp.where(in_range, chosen, jnp.nan), 0.0)",
        "return jnp.where(in_range, chosen, jnp.nan)",
        ("tests/test_losses.py", *UPDATE_TESTS),
    ),
    Mutation(
        "unused-inputs-reach-the-gradient",
        "NaN inputs of never-kept entries and padding skip the update",
        "ftw_jax/core/elite_loss.py",
        "        trajectories = without_unused_observations(trajectories, weights)\n        per_step = step_losses(",
        "        per_step = step_losses(",
        UPDATE_TESTS,
    ),
    Mutation(
        "empty-elites-applied",
        "elites without a step of the policy's own count as an update",
        "ftw_jax/core/update.py",
        "ready & (kept_steps > 0))",
        "ready & jnp.any(selection.filled))",
        UPDATE_TESTS,
    ),
    Mutation(
        "bad-action-wraps",
        "action −1 is trained as action A − 1",
        "ftw_jax/core/losses.py",
        "jnp.where(in_range, chosen, jnp.nan)",
        "chosen",
        ("tests/test_losses.py", *UPDATE_TESTS),
    ),
    Mutation(
        "update-ignores-mask",
        "the update weighs every step, the policy's or not",
        "ftw_jax/core/elite_loss.py",
        "step_weights = weights[:, None] * trajectories.mask\n        terms =",
        "step_weights = weights[:, None] * jnp.ones_like(trajectories.mask)\n        terms =",
        UPDATE_TESTS,
    ),
    Mutation(
        "pool-overwrites-newest",
        "the pool overwrites its newest entries, not its oldest",
        "ftw_jax/core/pool.py",
        "insert_index=(pool.insert_index + batch_size) % ring,",
        "insert_index=pool.insert_index,",
        ("tests/test_pool.py",),
    ),
    # Issue 16: the baselines as their references run them.
    Mutation(
        "entropy-bonus-sign",
        "the entropy bonus is a penalty",
        "ftw_jax/algos/policy_gradient.py",
        '- entropy_coef * terms["entropy"]',
        '+ entropy_coef * terms["entropy"]',
        (REFERENCE_TESTS,),
    ),
    Mutation(
        "minibatches-not-a-partition",
        "a PPO epoch draws minibatches with repeats",
        "ftw_jax/algos/ppo.py",
        "jax.random.permutation(key, batch_size)",
        "jax.random.randint(key, (batch_size,), 0, batch_size)",
        (REFERENCE_TESTS,),
    ),
    Mutation(
        "value-clip-ignored",
        "PPO's critic clipping has no effect",
        "ftw_jax/algos/ppo.py",
        "squared = jnp.maximum(squared, (clipped - targets) ** 2)",
        "squared = squared",
        (REFERENCE_TESTS,),
    ),
    Mutation(
        "grpo-exact-kl-is-k3",
        "GRPO's exact option still uses k3",
        "ftw_jax/algos/grpo.py",
        "kl_estimate=config.kl_estimate,",
        'kl_estimate="k3",',
        (REFERENCE_TESTS,),
    ),
    Mutation(
        "clip-after-optimizer",
        "the gradient is clipped after Adam, not before",
        "ftw_jax/algos/learner_settings.py",
        "optax.chain(optax.clip_by_global_norm(config.max_grad_norm), optimizer)",
        "optax.chain(optimizer, optax.clip_by_global_norm(config.max_grad_norm))",
        (REFERENCE_TESTS,),
    ),
    Mutation(
        "anneal-policy-only",
        "annealing misses the critic's optimizer",
        "ftw_jax/lab/train.py",
        "state = with_learning_rate(state, learning_rate)",
        "state = state.replace(policy=state.policy.replace(opt_state=with_learning_rate(state.policy.opt_state, "
        "learning_rate)))",
        (REFERENCE_TESTS,),
    ),
    Mutation(
        "kl-horizon-ignored",
        "β decays over the whole run whatever its horizon",
        "ftw_jax/lab/train.py",
        "horizon = config.kl_decay_iterations or config.num_iterations",
        "horizon = config.num_iterations",
        (REFERENCE_TESTS,),
    ),
    # Issue 31: bfloat16 that learns, exports that say their dtype, logits in chunks.
    Mutation(
        "hyperparameters-in-parameter-dtype",
        "Adam's b2 = 0.999 rounds to 1.0 in bfloat16 and every step is skipped",
        "ftw_jax/algos/learner_settings.py",
        "optax.inject_hyperparams(getattr(optax, config.optimizer), hyperparam_dtype=jnp.float32)",
        "optax.inject_hyperparams(getattr(optax, config.optimizer))",
        (REFERENCE_TESTS + "::test_bfloat16_parameters_take_the_steps_float32_hyperparameters_give",),
    ),
    Mutation(
        "master-weights-in-compute-dtype",
        "float32 master weights are kept in the compute dtype (bfloat16)",
        "ftw_jax/lm/model.py",
        "param_dtype=jnp.dtype(config.weights_dtype),",
        "param_dtype=jnp.dtype(config.dtype),",
        ("tests/test_lm.py::test_float32_master_weights_compute_exactly_as_bfloat16_weights",),
    ),
    Mutation(
        "export-dtype-from-given-config",
        "an export's config.json keeps the starting checkpoint's dtype fields",
        "ftw_jax/lm/load.py",
        'config_json = {**(config_json or hf_config(config)), "torch_dtype": saved_dtypes.pop()}',
        'config_json = {"torch_dtype": saved_dtypes.pop(), **(config_json or hf_config(config))}',
        ("tests/test_lm.py::test_a_saved_folder_says_the_dtype_it_holds",),
    ),
    Mutation(
        "chunked-reference-with-policy-params",
        "the chunked loss's reference logits come from the policy's params",
        "ftw_jax/core/losses.py",
        "head(reference_params, reference_features)",
        "head(params, reference_features)",
        ("tests/test_lm_learner.py::test_logits_in_chunks_give_the_dense_loss_and_gradient",),
    ),
    Mutation(
        "chunks-not-recomputed",
        "each chunk's logits are kept for the backward pass instead of recomputed",
        "ftw_jax/core/losses.py",
        "jax.lax.map(lambda chunks: jax.checkpoint(fn)(*chunks),",
        "jax.lax.map(lambda chunks: fn(*chunks),",
        ("tests/test_lm_learner.py::test_logits_in_chunks_hold_one_chunk_in_memory",),
    ),
    Mutation(
        "learner-state-laid-out-by-xla",
        "lm learn's init leaves the reference and Adam's moments whole on every device of a mesh",
        "ftw_jax/agent/learner.py",
        "out_shardings=_state_shardings(init, model_params)",
        "out_shardings=None",
        ("tests/test_lm_learner.py::test_lm_learn_on_a_data_by_model_mesh_learns_what_one_device_does",),
    ),
    Mutation(
        "learner-state-not-donated",
        "lm learn's update keeps its input state beside the new one",
        "ftw_jax/agent/learner.py",
        "donate_argnums=0 if donate else ()",
        "donate_argnums=()",
        ("tests/test_lm_memory.py::test_a_donated_state_and_a_bfloat16_reference_shrink_the_compiled_update",),
    ),
    # Issue 32: the learner following an engine's file.
    Mutation(
        "follow-learns-short-batches",
        "lm learn --follow learns a batch before B episodes are there (not what a run never stopped learns)",
        "ftw_jax/agent/feed.py",
        "if self.follow and len(self.pending) < self.batch_size:",
        "if self.follow and not self.pending:",
        ("tests/test_lm_learner.py::test_lm_learn_follow_learns_each_appended_line_once_and_resumes_exactly",),
    ),
    Mutation(
        "tail-reads-half-lines",
        "a line the engine is still writing is parsed (and refused) before its newline",
        "ftw_jax/agent/feed.py",
        'end = len(data) if complete else data.rfind(b"\\n") + 1',
        "end = len(data)",
        ("tests/test_lm_learner.py::test_episode_tail_reads_whole_lines_once_and_refuses_a_shrunk_file",),
    ),
    # lm learn's input problems (issue 32, part 4).
    Mutation(
        "resume-compares-path-strings",
        "a resume naming the same episodes file relative, then absolute, is refused",
        "ftw_jax/running/checkpoints.py",
        "return str(pathlib.Path(path).resolve()) if path else path",
        "return path",
        ("tests/test_lm_learner.py::test_a_resume_compares_the_files_paths_resolve_to",),
    ),
    Mutation(
        "refused-run-folder-kept",
        "a run refused for bad input leaves a folder that refuses the retry",
        "ftw_jax/running/run_files.py",
        "                cleanup.push(functools.partial(_discard_if_refused, folder, created))",
        "                pass",
        ("tests/test_bad_input.py::test_a_run_refused_before_its_first_checkpoint_leaves_nothing_that_blocks_a_retry",),
    ),
    Mutation(
        "refused-run-removes-users-folder",
        "a refused run removes the empty folder the user made for it",
        "ftw_jax/running/run_files.py",
        "        created = not folder.exists()  # an empty folder of the user's stays",
        "        created = True",
        ("tests/test_bad_input.py::test_a_run_refused_before_its_first_checkpoint_leaves_nothing_that_blocks_a_retry",),
    ),
    Mutation(
        "shrunk-episodes-file-resumed",
        "a resume from a file now shorter than what was learnt exits 0 and learns nothing",
        "ftw_jax/agent/feed.py",
        "            if count - read[name] > (1 if self.follow else 0):",
        "            if False:",
        ("tests/test_lm_learner.py::test_a_short_last_batch_is_learnt_from_and_resumed_after",),
    ),
    Mutation(
        "worker-files-unordered",
        "a folder's files are read in the order they were found, not by name (a resume is no longer exact)",
        "ftw_jax/agent/feed.py",
        "self.tails = dict(sorted(self.tails.items()))",
        "self.tails = dict(reversed(self.tails.items()))",
        ("tests/test_episode_feed.py", "-k", "name_order"),
    ),
    Mutation(
        "worker-files-resumed-as-one",
        "lm learn --resume over a folder forgets how many episodes of each file it learnt, and learns them again",
        "ftw_jax/agent/lm_learn.py",
        'return done, state, used, skipped, record.get("episodes_used_per_file")',
        "return done, state, used, skipped, {}",
        ("tests/test_lm_learner.py", "-k", "folder_of_worker_files"),
    ),
    Mutation(
        "replaced-episodes-file-read-on",
        "a followed file replaced by another is read on from the old offset (its first lines skipped)",
        "ftw_jax/agent/feed.py",
        "        if identity != self.identity:",
        "        if False:",
        ("tests/test_episode_feed.py", "-k", "no_longer_the_one_read"),
    ),
    Mutation(
        "skip-bad-lines-fingerprinted",
        "a follower stopped at a torn line cannot be resumed with --skip-bad-lines",
        "ftw_jax/running/checkpoints.py",
        '        "skip_bad_lines",\n',
        "",
        ("tests/test_lm_learner.py", "-k", "torn_line"),
    ),
    Mutation(
        "version-ahead-accepted",
        "a span written by a version ahead of the learner is learnt (negative staleness)",
        "ftw_jax/agent/episodes.py",
        "            if version > learner_version:",
        "            if version > learner_version + 1:",
        ("tests/test_lm_learner.py::test_a_span_ahead_of_the_learners_version_is_refused_by_file_line_and_field",),
    ),
    Mutation(
        "damaged-safetensors-traceback",
        "a truncated model.safetensors gives a traceback naming no file",
        "ftw_jax/lm/load.py",
        "    except SafetensorError as error:",
        "    except OSError as error:",
        ("tests/test_lm_learner.py", "-k", "damaged"),
    ),
    Mutation(
        "episode-json-error-at-at",
        "a JSON error in an episodes line reads 'starting at at column'",
        "ftw_jax/agent/episodes.py",
        "error.msg.removesuffix(' at')",
        "error.msg",
        ("tests/test_lm_learner.py", "-k", "not_utf8_or_json"),
    ),
    Mutation(
        "episode-line-not-utf8-accepted",
        "an episodes line that is not UTF-8 is read with replacement characters",
        "ftw_jax/agent/feed.py",
        'raw.decode("utf-8")',
        'raw.decode("utf-8", "replace")',
        ("tests/test_lm_learner.py", "-k", "not_utf8_or_json"),
    ),
    # Memory refused before it is allocated, nothing left behind, the skip's cause named (issue 35).
    Mutation(
        "lm-step-memory-unchecked",
        "lm learn --num-batches 1e9 is not refused before it allocates",
        "ftw_jax/agent/learner.py",
        "            check_working_memory(\n                program.memory_analysis(),",
        "            (lambda *_, **__: None)(\n                program.memory_analysis(),",
        ("tests/test_lm_learner.py", "-k", "would_not_fit_in_memory and num-batches"),
    ),
    Mutation(
        "empty-checkpoint-folders-kept",
        "a refused compare leaves its empty checkpoint folders and blocks the corrected command",
        "ftw_jax/running/run_files.py",
        "any(not path.is_dir() for path in below)",
        "bool(below)",
        ("tests/test_bad_input.py", "-k", "refused_compare_or_sweep"),
    ),
    Mutation(
        "observation-nonfinite-unflagged",
        "a NaN observation the loss reads skips the step without naming the cause",
        "ftw_jax/core/update.py",
        "    return jnp.any(jnp.stack(flags)) if flags else jnp.zeros((), bool)",
        "    return jnp.zeros((), bool)",
        ("tests/test_update.py", "-k", "non_finite_steps_never_reach or cannot_reach_the_loss"),
    ),
    Mutation(
        "articles-before-punctuation",
        "exact match strips the articles before the punctuation, not after as SQuAD's script does",
        "ftw_jax/envs/retrieval_qa/answers.py",
        'text = text.lower().translate(_PUNCTUATION)\n    return " ".join(_ARTICLES.sub(" ", text).split())',
        'text = _ARTICLES.sub(" ", text.lower())\n    return " ".join(text.translate(_PUNCTUATION).split())',
        ("tests/test_retrieval_qa.py", "-k", "normalised"),
    ),
    Mutation(
        "last-turn-search-answered",
        "the last turn's search gets passages and the episode goes on past its turns",
        "ftw_jax/agent/retrieval_qa/task.py",
        'if action == "answer" or last:',
        'if action == "answer":',
        ("tests/test_retrieval_qa.py", "-k", "turn_loop"),
    ),
    Mutation(
        "unmatched-passages-returned",
        "a query that shares no term with any passage still gets passages",
        "ftw_jax/agent/retrieval_qa/retriever.py",
        "for i, score in zip(row, row_scores) if score > 0",
        "for i, score in zip(row, row_scores)",
        ("tests/test_retrieval_qa.py", "-k", "bm25s_called_directly"),
    ),
    Mutation(
        "stop-sequence-ignored",
        "a turn runs on past `</search>` written as the stop sequence's tokens",
        "ftw_jax/lm/sampler.py",
        'written.update(recent=recent, done=written["done"] | (active & jnp.any(jnp.stack(ends), axis=0)))',
        "written.update(recent=recent)",
        ("tests/test_retrieval_qa.py", "-k", "stop_sequence_is_written"),
    ),
    # Issue 54: beside a real engine, on a real cluster.
    Mutation(
        "weights-private",
        "a version's folder and files keep the temporary folder's private modes (0700 / 0600)",
        "ftw_jax/lm/load.py",
        "        readable_as_umask_allows(staging)\n",
        "",
        ("tests/test_lm.py", "-k", "umask"),
    ),
    Mutation(
        "flags-abbreviated",
        "a prefix of a flag is taken for the flag (`--seed 5` as `--seeds 5`)",
        "ftw_jax/cli/command.py",
        'super().__init__(*args, **{"allow_abbrev": False, **kwargs})',
        "super().__init__(*args, **kwargs)",
        ("tests/test_bad_input.py", "-k", "abbreviation"),
    ),
    # Issue 53: the baselines in the LM learner, LoRA.
    Mutation(
        "rloo-without-its-factor",
        "RLOO's baseline is the group's mean with the episode in it",
        "ftw_jax/algos/reinforce.py",
        "return group_size / (group_size - 1) * group_advantages(returns, group_size, normalise=False)",
        "return group_advantages(returns, group_size, normalise=False)",
        ("tests/test_policy_gradient.py", "-k", "leave_one_out"),
    ),
    Mutation(
        "kl-in-reward-paid-backwards",
        "PPO's KL in the rewards rewards moving away from the reference",
        "ftw_jax/algos/ppo.py",
        "return batch.reward - kl_coef * kl,",
        "return batch.reward + kl_coef * kl,",
        ("tests/test_policy_gradient.py", "-k", "kl_in_the_rewards"),
    ),
    Mutation(
        "groups-left-in-file-order",
        "GRPO's groups are read as consecutive episodes whatever their group",
        "ftw_jax/agent/episodes.py",
        "return [episode for members in groups.values() for episode in members]",
        "return episodes",
        ("tests/test_lm_learner.py", "-k", "group_by_group"),
    ),
    Mutation(
        "lora-base-trained",
        "a LoRA step moves the pretrained weights",
        "ftw_jax/policies/lm.py",
        'return any(getattr(entry, "key", None) == "lm" for entry in path) and not lora.is_adapter(path)',
        "return False",
        ("tests/test_lora.py", "-k", "adapters_alone"),
    ),
    Mutation(
        "lora-merged-unscaled",
        "the exported weights leave out the adapters' alpha / r",
        "ftw_jax/lm/lora.py",
        "combined = kernel.astype(jnp.float32) + config.lora_scale * delta",
        "combined = kernel.astype(jnp.float32) + delta",
        ("tests/test_lora.py", "-k", "merge"),
    ),
    Mutation(
        "resume-shapes-unchecked",
        "a resume with another model's folder moves the run's checkpoints aside",
        "ftw_jax/running/checkpoints.py",
        "            self._check_same_shapes(step, template)\n",
        "",
        ("tests/test_lm_learner.py", "-k", "another_models"),
    ),
    Mutation(
        "sampler-gap-unchecked",
        "an engine that samples from another distribution than the policy's goes unnoticed",
        "ftw_jax/agent/lm_learn.py",
        "if limit and gap is not None and not gap <= limit:",
        "if False:",
        ("tests/test_lm_learner.py", "-k", "off_the_policy"),
    ),
    Mutation(
        "sampler-gap-of-stale-episodes",
        "the sampler gap measures episodes of older versions, whose log-probs differ by learning",
        "ftw_jax/core/diagnostics.py",
        "own = (weights > 0) & (staleness(version, behaviour_version, mask) == 0)",
        "own = weights > 0",
        ("tests/test_lm_learner.py", "-k", "off_the_policy or past_max_staleness"),
    ),
    Mutation(
        "sampler-limit-fingerprinted",
        "a run stopped for its sampler gap cannot be resumed with --sampler-gap-limit 0",
        "ftw_jax/running/checkpoints.py",
        '        "sampler_gap_limit",\n',
        "",
        ("tests/test_lm_learner.py", "-k", "off_the_policy"),
    ),
    Mutation(
        "stale-share-unchecked",
        "an engine that never reloads the weights fills the pool with episodes it never selects, unsaid",
        "ftw_jax/agent/lm_learn.py",
        "    if stale > share * total:",
        "    if False:",
        ("tests/test_lm_learner.py", "-k", "past_max_staleness"),
    ),
    Mutation(
        "latest-before-its-checkpoint",
        "weights/latest.json names a version no whole checkpoint covers: a restart goes back to an older one",
        "ftw_jax/agent/lm_learn.py",
        "if self.checkpointer is None or (durable or 0) >= pair[0]]",
        "]",
        ("tests/test_lm_learner.py", "-k", "latest_json_moves or killed_at_each"),
    ),
    Mutation(
        "verdict-unadjusted",
        "a table of several baselines judges each at 5% alone, not at 5% for the table (Holm)",
        "ftw_jax/lab/comparison_tables.py",
        'row[f"{name}_verdict"] = verdict(mine, theirs, row[f"{name}_margin"], p_value=float(p_value))',
        'row[f"{name}_verdict"] = verdict(mine, theirs, row[f"{name}_margin"])',
        ("tests/test_compare.py", "-k", "holm"),
    ),
    Mutation(
        "orbax-errors-logged",
        "a checkpoint write that fails (a full disk) prints Orbax's threads' tracebacks before the one line",
        "ftw_jax/cli/command.py",
        "    return not (record.levelno >= logging.ERROR and (orbax in record.pathname or orbax in",
        "    return True or not (record.levelno >= logging.ERROR and (orbax in record.pathname or orbax in",
        ("tests/test_faults.py", "-k", "full_disk"),
    ),
    Mutation(
        "durable-step-in-flight",
        "a checkpoint still being written counts as whole",
        "ftw_jax/running/checkpoints.py",
        "steps = self._saved[:-1] if self._manager.is_saving_in_progress() else self._saved",
        "steps = self._saved",
        ("tests/test_checkpoints.py", "-k", "durable"),
    ),
    Mutation(
        "reference-drawn-twice",
        "the random search may draw the reference recipe's point again, so the reference runs twice",
        "ftw_jax/lab/tuning.py",
        "points = [point for point in points if _valid(point) and point != exclude]",
        "points = [point for point in points if _valid(point)]",
        ("tests/test_tuning.py", "-k", "reference_recipe"),
    ),
    Mutation(
        "solved-strictly-above",
        "a seed exactly at the solved threshold is not counted as solved",
        "ftw_jax/lab/comparison_tables.py",
        "mine, theirs = int((reference >= SOLVED_AT).sum()), int((other >= SOLVED_AT).sum())",
        "mine, theirs = int((reference > SOLVED_AT).sum()), int((other >= SOLVED_AT).sum())",
        ("tests/test_compare.py", "-k", "split"),
    ),
    Mutation(
        "tensorboard-no-purge",
        "a resumed run's TensorBoard curve shows the points a killed process wrote past the checkpoint twice",
        "ftw_jax/running/metric_writers.py",
        "self._purge.update({run: int(step) + 1 for run, step in zip(runs, purge_after)})",
        "pass",
        ("tests/test_metric_writers.py", "-k", "resume"),
    ),
    Mutation(
        "tensorboard-compare-no-purge",
        "a comparison's phase run again shows its first process's points in TensorBoard beside the new ones",
        "ftw_jax/cli/outputs.py",
        "        board.resume(runs, period.starts_after)",
        "        pass",
        ("tests/test_compare.py", "-k", "cli_resume_runs_only"),
    ),
    Mutation(
        "seed-groups-rows-out-of-order",
        "merged seed groups give a seed's evaluations to another seed",
        "ftw_jax/lab/reports/seed_groups.py",
        "[value for _, record in records for value in",
        "[value for _, record in records[::-1] for value in",
        ("tests/test_seed_groups.py",),
    ),
)


def copy_repository(destination: pathlib.Path) -> None:
    for name in ("ftw_jax", "tests", "experiments"):  # some tests run an experiment's script
        shutil.copytree(ROOT / name, destination / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", destination / "pyproject.toml")


def run_tests(root: pathlib.Path, tests: tuple[str, ...], timeout: float) -> tuple[int | None, str]:
    """Runs the tests in `root` with `root` imported first: (pytest's exit code, None on timeout; the first
    failing test, or the output's last lines when none failed)."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    command = [sys.executable, "-m", "pytest", "-x", "-q", "-rf", "-p", "no:cacheprovider", "-o", "addopts=", *tests]
    try:
        done = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, "timed out"
    lines = (done.stdout + done.stderr).strip().splitlines()
    failed = [line.split()[1] for line in lines if line.startswith("FAILED ")]
    return done.returncode, failed[0] if failed else "\n".join(lines[-3:])


def check_imports_copy(root: pathlib.Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(root)}
    found = subprocess.run(
        [sys.executable, "-c", "import ftw_jax; print(ftw_jax.__file__)"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    if not pathlib.Path(found).is_relative_to(root):
        raise RuntimeError(
            f"the copy in {root} is not what gets imported ({found}); is ftw_jax installed non-editable?"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="mutations to run (default: all)")
    parser.add_argument("--list", action="store_true", help="list the mutations and exit")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per test run (default 900)")
    args = parser.parse_args(argv)
    if args.list:
        for mutation in MUTATIONS:
            print(f"{mutation.name:32} {mutation.breaks}  [{mutation.path}]")
        return 0
    unknown = set(args.names) - {mutation.name for mutation in MUTATIONS}
    if unknown:
        parser.error(f"unknown mutation(s) {sorted(unknown)}; --list shows them")
    chosen = [mutation for mutation in MUTATIONS if not args.names or mutation.name in args.names]

    started = time.perf_counter()
    outcomes: list[Outcome] = []
    with tempfile.TemporaryDirectory(prefix="ftw-mutations-") as scratch:
        clean = pathlib.Path(scratch) / "clean"
        copy_repository(clean)
        check_imports_copy(clean)
        for tests in dict.fromkeys(mutation.tests for mutation in chosen):  # each distinct set once
            code, tail = run_tests(clean, tests, args.timeout)
            if code != 0:
                print(f"the tests {' '.join(tests)} fail without any mutation (exit {code}):\n{tail}", file=sys.stderr)
                return 2
        for mutation in chosen:
            root = pathlib.Path(scratch) / mutation.name
            copy_repository(root)
            began = time.perf_counter()
            try:
                mutation.apply(root)
            except LookupError as error:
                outcome = Outcome(mutation, "NOT APPLIED", 0.0, str(error))
            else:
                code, detail = run_tests(root, mutation.tests, args.timeout)
                verdict = {0: "SURVIVED", 1: "killed", None: "TIMEOUT"}.get(code, f"ERROR (pytest exit {code})")
                outcome = Outcome(mutation, verdict, time.perf_counter() - began, detail)
            shutil.rmtree(root)
            outcomes.append(outcome)
            last_line = outcome.detail.splitlines()[-1] if outcome.detail else ""
            print(
                f"{mutation.name:32} {outcome.verdict:12} {outcome.seconds:6.1f} s  {last_line}",
                file=sys.stderr,
                flush=True,
            )

    print("\n| mutation | breaks | verdict | seconds | killed by |\n|---|---|---|---:|---|")
    for mutation, verdict, seconds, detail in outcomes:
        killer = detail.split("::")[-1] if verdict == "killed" else ""
        print(f"| {mutation.name} | {mutation.breaks} | {verdict} | {seconds:.0f} | {killer} |")
    killed = sum(outcome.verdict == "killed" for outcome in outcomes)
    print(f"\n{killed} of {len(outcomes)} killed in {time.perf_counter() - started:.0f} s (baseline runs included)")
    for outcome in outcomes:
        if outcome.verdict != "killed":
            print(f"\n{outcome.mutation.name}: {outcome.verdict}\n{outcome.detail}")
    return 0 if killed == len(outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
