"""The lab: FTW and its baselines trained on JAX environments, the whole run one jitted program.

Modules: `rollout` (episodes played on the device), `warm_start` (the environment's demonstrations fitted before
RL), `probes` (task filtering), `train` (`make_train(config) -> Trainer`, seeds vmapped), `sweep` (a grid as one
program), `tuning` and `compare` (every method tuned alike, then compared), `comparison_tables` and `stats` (their
tables and tests), `reproduction` (the paper's bandit), `reports` (what finished comparisons' files say: the
README's table, curve ends, choice ends, phase records, seed groups merged). The lab and the agent
(`ftw_jax.agent`) never import each other; both stand on `core`, `algos`, `policies`, `lm`, `envs` and `running`.
"""
