"""ftw_jax's LM learner step against Tunix's GRPO step, on the same Qwen2-shaped model and the same tokens.

    python experiments/lm/lm_vs_tunix.py                    # 4 layers, hidden 512, vocabulary 32,768, 8 x 256 tokens
    python experiments/lm/lm_vs_tunix.py --layers 2 --hidden 128 --vocab 4096 --batch 4 --length 64 --repeats 3

Tunix (google-tunix) lives in its own virtual environment, `--tunix-venv` (default runs/tunix-venv; made with
`python3.11 -m venv runs/tunix-venv && runs/tunix-venv/bin/pip install google-tunix==0.1.7`): it is never a
dependency of the project; its worker never imports ftw_jax, nor ftw_jax's worker Tunix. This process (ftw_jax's
environment) draws a random-weight Qwen2 model of the given shape (every tensor, biases and norm scales
included, perturbed off its initial value, so that a missing bias would show), saves it as a Hugging Face folder
with `--batch` rows of `--length` random tokens (the first `--prompt` of each row the prompt, the rest the
completion) and 0/1 rewards, then runs one worker process per side, alternating ftw_jax, Tunix, ftw_jax, Tunix
for `--rounds` rounds so that the machine's load falls on both alike. Each worker loads the saved weights,
times each measure's first call (compile and run) and then the median of `--repeats` calls; the table gives the
median over rounds. Measured on the same B sequences of L tokens:

- forward log-probs: the log-probs of the completion tokens, no gradient (ftw_jax: `CausalLM.apply` on the
  L − 1 tokens that predict, a log-softmax; Tunix: `rl.common.compute_per_token_logps` with `stop_gradient`, as
  its rollout computes the reference's, on all L tokens). A check that the two models cost the same; the
  log-probs of the completion tokens under the initial weights, from each side, show they compute the same model
  (printed: their means and the largest difference of one token's, a few 1e-6 in float32; bfloat16 compute
  rounds at different places on the two sides, about 1e-2).
- ftw_jax FTW step: `EpisodeLearner.step` with the FTW update keeping J·K = B sequences (N = B, J = B, C = 2,
  K = 1, one update per batch), so its loss runs on the same B sequences of L tokens as GRPO's: the batch put
  into the pool, the selection, cross-entropy on the kept model tokens plus β·KL to the initial model (exact,
  from the reference's logits: the reference's forward pass is inside the step), an Adam step, and the
  trust-region monitor's two forward passes over 4 pool entries (`lm learn`'s default), then over 16 (the
  FTW update's own default) and with the monitor off. `LearnConfig`'s defaults otherwise: from a vocabulary of
  32,768 up the loss makes the logits a chunk of tokens at a time, and the layers recompute their activations
  in the backward pass where the kept ones would pass 256 MiB (`policies.lm.remat_for`: on at these shapes;
  "no remat" rows keep them).
- ftw_jax GRPO step: `EpisodeLearner.step` with GRPO (group size min(8, B), one step, ε 0.2, k3 KL with
  β 0.04 against the initial model, inside the step), the like-for-like algorithm.
- Tunix GRPO step incl. reference: what one Tunix GRPO iteration runs on the device once the completions and
  their rewards exist. Its `GRPOLearner` computes the reference's per-token log-probs in one jitted call
  (`compute_per_token_logps` on a second copy of the weights, what `RLCluster.get_ref_per_token_logps` calls),
  then its trainer's jitted train step: `rl.trainer.Trainer` (a `PeftTrainer`) with Tunix's registered "grpo"
  policy loss, `nnx.value_and_grad`, the global gradient norm and `nnx.Optimizer.update`, the optimizer state
  donated, called through `jit_train_and_eval_step` as its training loop does. `GRPOConfig` defaults but
  β 0.04, ε 0.2, one iteration (so the old log-probs are the policy's own, stop-gradient), num_generations
  the group size (its KL estimate, `kl_loss_mode`, the default log-ratio); the loss computes Tunix's metrics
  too, the full-vocabulary entropy among them. Not included on either side: sampling, rewards, group
  advantages (Tunix's on the host, ftw_jax's inside its step, a few B-element operations), metrics logging and
  checkpoints.

Both sides use `optax.adam` at learning rate 1e-5 with no clipping, float32 weights and compute (or bfloat16
compute over float32 weights with `--dtype bfloat16`), and the JAX versions of their environments (the same
release here). The ratio column is each row's median over Tunix's GRPO step (the forward rows: over Tunix's
forward); below 1, the row is faster. Compile is the first call's seconds less the median call's (Tunix's step
reuses the reference call its forward row compiled). On a shared machine, read the ratios within one run.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
LEARNING_RATE = 1e-5
BETA = 0.04
EPSILON = 0.2
PAD_ID = 0  # Tunix masks this id out: the random tokens are drawn from 1..V-1
EOS_ID = 1  # Tunix's `process_ids` takes an EOS id but does not use it without packing
FTW_MEASURES = (
    "forward",
    "ftw",
    "ftw_monitor_16",
    "ftw_no_monitor",
    "ftw_no_monitor_no_remat",
    "grpo",
    "grpo_no_remat",
)
TUNIX_MEASURES = ("forward", "grpo")
ROWS = (  # (label, side, measure, the Tunix measure its ratio is over)
    ("forward log-probs, ftw_jax", "ftw", "forward", "forward"),
    ("forward log-probs, Tunix", "tunix", "forward", "forward"),
    ("ftw_jax FTW step (lm learn's monitor: 4 entries)", "ftw", "ftw", "grpo"),
    ("ftw_jax FTW step, monitor on 16 entries", "ftw", "ftw_monitor_16", "grpo"),
    ("ftw_jax FTW step, monitor off", "ftw", "ftw_no_monitor", "grpo"),
    ("ftw_jax FTW step, monitor off, no remat", "ftw", "ftw_no_monitor_no_remat", "grpo"),
    ("ftw_jax GRPO step", "ftw", "grpo", "grpo"),
    ("ftw_jax GRPO step, no remat", "ftw", "grpo_no_remat", "grpo"),
    ("Tunix GRPO step incl. reference", "tunix", "grpo", "grpo"),
)


def timed(call, repeats: int) -> tuple[dict, object]:
    """({"seconds": median of `repeats` calls, "compile": the first call's seconds less that median}, what the first
    call returned); `call()` waits for its result."""
    started = time.perf_counter()
    first_result = call()
    first = time.perf_counter() - started
    seconds = []
    for _ in range(repeats):
        started = time.perf_counter()
        call()
        seconds.append(time.perf_counter() - started)
    median = statistics.median(seconds)
    return {"seconds": median, "compile": first - median}, first_result


def group_size(batch: int) -> int:
    """GRPO's group: 8 episodes per prompt (TRL's, and ftw_jax's reference), or the whole batch if smaller."""
    size = min(8, batch)
    if batch % size:
        raise SystemExit(f"error: --batch ({batch}) must be a multiple of 8 or at most 8 (GRPO's groups of 8).")
    return size


# ------------------------------------------------------------------------------------------------- ftw_jax


def ftw_worker(folder: pathlib.Path) -> dict:
    """ftw_jax's side, in ftw_jax's environment."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from ftw_jax.agent.learner import EpisodeLearner, LearnConfig
    from ftw_jax.algos.defaults import LM_FTW
    from ftw_jax.algos.ftw import FTWConfig
    from ftw_jax.algos.grpo import GRPOConfig
    from ftw_jax.core.pool import Trajectory
    from ftw_jax.lm import load

    setup = json.loads((folder / "setup.json").read_text())
    data = np.load(folder / "batch.npz")
    tokens, rewards, prompt, repeats = data["tokens"], data["rewards"], setup["prompt"], setup["repeats"]
    batch, length = tokens.shape
    dtype = setup["dtype"]
    model, params = load(folder / "model", dtype=dtype, param_dtype="float32")
    observation, action = jnp.asarray(tokens[:, :-1]), jnp.asarray(tokens[:, 1:])

    @jax.jit
    def forward(params, observation, action):  # the completion tokens' log-probs [B, L - P]
        logits = model.apply(params, observation)[:, prompt - 1 :].astype(jnp.float32)
        return jnp.take_along_axis(jax.nn.log_softmax(logits), action[:, prompt - 1 :, None], axis=-1)[..., 0]

    results = {}
    results["forward"], completion_logp = timed(
        lambda: jax.block_until_ready(forward(params, observation, action)), repeats
    )
    results["logp"] = np.asarray(completion_logp, np.float64).tolist()

    steps = length - 1
    model_step = np.arange(steps)[None, :] >= prompt - 1  # step t writes token t + 1: the completion's
    behaviour_logp = np.zeros((batch, steps), np.float32)
    behaviour_logp[:, prompt - 1 :] = np.asarray(completion_logp)  # on-policy: the ratios start at 1
    reward = np.zeros((batch, steps), np.float32)
    reward[:, -1] = rewards
    trajectories = Trajectory(
        observation=np.asarray(tokens[:, :-1]),
        action=np.asarray(tokens[:, 1:]),
        mask=np.broadcast_to(model_step, (batch, steps)).copy(),
        behaviour_logp=behaviour_logp,
        behaviour_version=np.zeros((batch, steps), np.int32),
        episode_return=np.asarray(rewards, np.float32),
        reward=reward,
        alive=np.ones((batch, steps), bool),
    )
    ftw = dict(pool_capacity=batch, num_batches=batch, batch_size=min(2, batch), num_elites=1, updates_per_iteration=1)
    grpo = GRPOConfig(group_size=group_size(batch), updates_per_iteration=1, clip_epsilon=EPSILON)
    algorithms = {  # (algorithm, its config, remat: None the learner's choice)
        "ftw": ("ftw", FTWConfig(**ftw, **LM_FTW), None),
        "ftw_monitor_16": ("ftw", FTWConfig(**ftw, monitor_entries=16), None),
        "ftw_no_monitor": ("ftw", FTWConfig(**ftw, monitor_entries=0), None),
        "ftw_no_monitor_no_remat": ("ftw", FTWConfig(**ftw, monitor_entries=0), False),
        "grpo": ("grpo", grpo, None),
        "grpo_no_remat": ("grpo", grpo, False),
    }
    for measure, (algorithm, algorithm_config, remat) in algorithms.items():
        config = LearnConfig(
            algorithm=algorithm,
            algorithm_config=algorithm_config,
            remat=remat,
            max_length=length,
            episodes_per_iteration=batch,
            kl_coef=BETA,
            learning_rate=LEARNING_RATE,
            dtype=dtype,
        )
        results[measure] = time_learner(EpisodeLearner.build(config, model.config), params, trajectories, repeats)
    return results


def time_learner(learner, params: dict, trajectories, repeats: int) -> dict:
    """`timed` of `learner.step` on the same batch, each call on the state the last one returned (it is donated)."""
    import jax

    state, iteration = learner.init(params), 0

    def step():
        nonlocal state, iteration
        state, metrics = learner.step(state, trajectories, iteration)
        jax.block_until_ready((state, metrics))
        iteration += 1

    return timed(step, repeats)[0]


# --------------------------------------------------------------------------------------------------- Tunix


def tunix_worker(folder: pathlib.Path) -> dict:
    """Tunix's side, in Tunix's environment (no ftw_jax there)."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax
    from flax import nnx
    from tunix.models.qwen2 import model as qwen2_model
    from tunix.models.qwen2 import params as qwen2_params
    from tunix.rl import common, function_registry
    from tunix.rl import trainer as rl_trainer
    from tunix.rl.grpo import grpo_learner
    from tunix.sft import peft_trainer

    setup = json.loads((folder / "setup.json").read_text())
    hf = json.loads((folder / "model" / "config.json").read_text())
    data = np.load(folder / "batch.npz")
    tokens, rewards, prompt, repeats = data["tokens"], data["rewards"], setup["prompt"], setup["repeats"]
    batch = tokens.shape[0]
    config = qwen2_model.ModelConfig(
        num_layers=hf["num_hidden_layers"],
        vocab_size=hf["vocab_size"],
        embed_dim=hf["hidden_size"],
        hidden_dim=hf["intermediate_size"],
        num_heads=hf["num_attention_heads"],
        head_dim=hf["head_dim"],
        num_kv_heads=hf["num_key_value_heads"],
        rope_theta=int(hf["rope_theta"]),
        norm_eps=hf["rms_norm_eps"],
        use_tied_embedding=hf["tie_word_embeddings"],
        dtype=jnp.dtype(setup["dtype"]),
        param_dtype=jnp.float32,
    )
    policy = qwen2_params.create_model_from_safe_tensors(str(folder / "model"), config)
    reference = qwen2_params.create_model_from_safe_tensors(str(folder / "model"), config)
    prompt_ids, completion_ids = jnp.asarray(tokens[:, :prompt]), jnp.asarray(tokens[:, prompt:])
    reference_graph, reference_state = nnx.split(reference)

    def reference_logps():  # as the rollout worker's `get_ref_per_token_logps`
        return common.compute_per_token_logps(
            reference_graph,
            reference_state,
            prompt_tokens=prompt_ids,
            completion_tokens=completion_ids,
            pad_id=PAD_ID,
            eos_id=EOS_ID,
            stop_gradient=True,
            temperature=1.0,
        )

    results = {}
    results["forward"], logp = timed(lambda: jax.block_until_ready(reference_logps()), repeats)
    results["logp"] = np.asarray(logp, np.float64).tolist()

    algo_config = grpo_learner.GRPOConfig(
        num_generations=group_size(batch), num_iterations=1, beta=BETA, epsilon=EPSILON
    )
    algo_config.temperature = 1.0  # `GRPOLearner.__init__` sets it from the rollout config
    policy_loss = function_registry.get_policy_loss_fn(algo_config.policy_loss_fn)
    trainer = rl_trainer.Trainer(
        policy,
        optax.adam(LEARNING_RATE),
        peft_trainer.TrainingConfig(eval_every_n_steps=10**9),
        custom_checkpoint_metadata_fn=dict,
    )
    # As `GRPOLearner.__init__` sets its actor trainer up.
    trainer.with_loss_fn(
        lambda model, train_example, algo_config: policy_loss(
            model, train_example, algo_config=algo_config, pad_id=PAD_ID, eos_id=EOS_ID
        ),
        has_aux=True,
    )
    trainer.with_gen_model_input_fn(lambda example: {"train_example": example, "algo_config": algo_config})
    # Without a mesh, `jit_train_and_eval_step` skips `_shard_optimizer`, and Adam's fresh step count is an
    # uncommitted array: the second call, with the committed count the first returned, would compile again.
    # Committing the optimizer state first is what `_shard_optimizer` does on a mesh.
    optimizer_state = nnx.state(trainer.optimizer, nnx.optimizer.OptState)
    nnx.update(trainer.optimizer, jax.device_put(optimizer_state, jax.devices()[0]))
    train_step, _ = trainer.jit_train_and_eval_step(cache_nnx_graph=True)
    advantages = function_registry.get_advantage_estimator(algo_config.advantage_estimator)(
        rewards=np.asarray(rewards, np.float32), num_generations=algo_config.num_generations
    )

    def step():
        example = grpo_learner.TrainExample(
            prompt_ids=prompt_ids,
            prompt_mask=prompt_ids != PAD_ID,
            completion_ids=completion_ids,
            completion_mask=completion_ids != PAD_ID,
            advantages=jnp.asarray(advantages),
            ref_per_token_logps=reference_logps(),
            old_per_token_logps=None,  # one iteration: the policy's own, stop-gradient
        )
        jax.block_until_ready(train_step(example))

    results["grpo"] = timed(step, repeats)[0]
    return results


# --------------------------------------------------------------------------------------------------- driver


def write_inputs(folder: pathlib.Path, args: argparse.Namespace) -> None:
    """The random model (a Hugging Face folder), the tokens and rewards, and the settings both workers read."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from ftw_jax.lm import CausalLM, LMConfig, save

    config = LMConfig(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=args.intermediate or 3 * args.hidden,
        num_layers=args.layers,
        num_heads=args.heads,
        num_kv_heads=args.kv_heads,
        head_dim=args.head_dim,
        qkv_bias=True,
    )
    key_init, key_noise, key_tokens, key_rewards = jax.random.split(jax.random.key(args.seed), 4)
    params = jax.jit(CausalLM(config).init)(key_init, jnp.zeros((1, 8), jnp.int32))
    leaves, tree = jax.tree.flatten(params)
    noise = jax.random.split(key_noise, len(leaves))
    params = jax.tree.unflatten(
        tree, [leaf + 0.02 * jax.random.normal(k, leaf.shape, leaf.dtype) for leaf, k in zip(leaves, noise)]
    )
    save(folder / "model", config, params)
    tokens = jax.random.randint(key_tokens, (args.batch, args.length), PAD_ID + 1, args.vocab, jnp.int32)
    rewards = jax.random.bernoulli(key_rewards, 0.5, (args.batch,)).astype(jnp.float32)
    np.savez(folder / "batch.npz", tokens=np.asarray(tokens), rewards=np.asarray(rewards))
    setup = {"prompt": args.prompt, "repeats": args.repeats, "dtype": args.dtype}
    (folder / "setup.json").write_text(json.dumps(setup) + "\n")


def run_worker(python: pathlib.Path, side: str, folder: pathlib.Path) -> dict:
    command = [str(python), __file__, "--worker", side, str(folder)]
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    if done.returncode != 0:
        raise SystemExit(f"the {side} worker failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--intermediate", type=int, help="the MLP's size (default: 3 x hidden)")
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--vocab", type=int, default=32_768)
    parser.add_argument("--batch", type=int, default=8, help="B, sequences per step")
    parser.add_argument("--length", type=int, default=256, help="L, tokens per sequence")
    parser.add_argument("--prompt", type=int, default=64, help="the prompt's tokens of each sequence")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32", help="compute dtype")
    parser.add_argument("--repeats", type=int, default=5, help="timed calls per measure and process (median)")
    parser.add_argument("--rounds", type=int, default=2, help="alternating ftw_jax / Tunix process pairs (median)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tunix-venv", type=pathlib.Path, default=ROOT / "runs" / "tunix-venv")
    parser.add_argument("--out", type=pathlib.Path, help="also write every round's numbers here (JSON)")
    parser.add_argument("--worker", choices=["ftw", "tunix"], help=argparse.SUPPRESS)
    parser.add_argument("folder", nargs="?", type=pathlib.Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps((ftw_worker if args.worker == "ftw" else tunix_worker)(args.folder)))
        return

    group_size(args.batch)
    if not 1 <= args.prompt < args.length or min(args.repeats, args.rounds) < 1:
        raise SystemExit("error: --prompt must be in [1, --length) and --repeats, --rounds >= 1.")
    tunix_python = args.tunix_venv / "bin" / "python"
    if not tunix_python.is_file():
        raise SystemExit(
            f"error: no Tunix environment at {args.tunix_venv}: python3.11 -m venv {args.tunix_venv} && "
            f"{tunix_python.parent / 'pip'} install google-tunix==0.1.7"
        )
    started = time.perf_counter()
    import jax

    device = jax.devices()[0]
    intermediate = args.intermediate or 3 * args.hidden
    print(
        f"JAX {jax.__version__} on {device.device_kind} ({device.platform}), {os.cpu_count()} cores; Qwen2 shape: "
        f"{args.layers} layers, hidden {args.hidden}, MLP {intermediate}, {args.heads} heads ({args.kv_heads} "
        f"key/value) of {args.head_dim}, vocabulary {args.vocab:,}, {args.dtype}; {args.batch} sequences x "
        f"{args.length} tokens ({args.prompt} prompt); median of {args.repeats} calls per process, median of "
        f"{args.rounds} alternating rounds\n",
        flush=True,
    )
    rounds: dict[str, list[dict]] = {"ftw": [], "tunix": []}
    with tempfile.TemporaryDirectory() as scratch:
        folder = pathlib.Path(scratch)
        write_inputs(folder, args)
        for index in range(args.rounds):
            for side in ("ftw", "tunix"):
                python = pathlib.Path(sys.executable) if side == "ftw" else tunix_python
                rounds[side].append(run_worker(python, side, folder))
            print(f"  round {index + 1} of {args.rounds} done ({time.perf_counter() - started:.0f} s)", file=sys.stderr)
    medians = {
        side: {
            measure: {field: statistics.median(run[measure][field] for run in runs) for field in ("seconds", "compile")}
            for measure in (FTW_MEASURES if side == "ftw" else TUNIX_MEASURES)
        }
        for side, runs in rounds.items()
    }
    lines = ["| step | median s | / Tunix | compile s |", "|---|---:|---:|---:|"]
    for label, side, measure, against in ROWS:
        seconds, compile_seconds = medians[side][measure]["seconds"], medians[side][measure]["compile"]
        ratio = seconds / medians["tunix"][against]["seconds"]
        lines.append(f"| {label} | {seconds:.3f} | {ratio:.2f} | {compile_seconds:.1f} |")
    print("\n".join(lines))
    import numpy as np

    logp = {side: np.asarray(rounds[side][0]["logp"]) for side in rounds}
    print(
        f"\nlog-probs of the completion tokens under the initial weights, ftw_jax against Tunix: mean "
        f"{logp['ftw'].mean():.7f} and {logp['tunix'].mean():.7f}, largest difference of one token's "
        f"{np.abs(logp['ftw'] - logp['tunix']).max():.1e}"
    )
    ftw_over_tunix = medians["ftw"]["ftw"]["seconds"] / medians["tunix"]["grpo"]["seconds"]
    print(f"FTW's LM step / Tunix's GRPO step at the same kept tokens: {ftw_over_tunix:.2f} (target <= 1.00)")
    print(f"({time.perf_counter() - started:.0f} s in all)")
    if args.out:
        args.out.write_text(json.dumps({"args": vars(args), "rounds": rounds, "medians": medians}, default=str) + "\n")


if __name__ == "__main__":
    main()
