#!/usr/bin/env bash
# Shaped Sokoban, FTW alone, two fixed configurations on the reviewed protocol's held-out rooms, 10 seeds each,
# no tuning (a diagnostic outside the protocol, docs/results.md says why):
#   reviewed-choice  the configuration the reviewed protocol's tuning chose
#   earlier-choice   the one the earlier protocol's tuning chose (results/compare-successive-halving/sokoban-shaped)
# Both run the library at the protocol's commit, in the worktree experiments/rerun.sh makes; about 4 and 8 minutes
# on 2 cores. Their tables go to runs/shaped-ftw-NAME; the committed copies are in results/sokoban-shaped-ftw-choices.
#   bash experiments/shaped_ftw_choices.sh
set -euo pipefail
commit=124644591de8b649103eddbfe86422e791c6fa96
code="$(cd .. && pwd)/ftw-rerun-${commit:0:7}"
[ -d "$code" ] || git worktree add --detach "$code" "$commit"
task=(--env sokoban --iterations 300 --algos ftw --seeds 0,1,2,3,4,5,6,7,8,9 --max-grad-norm 0.5
      --anneal-learning-rate yes --eval-greedy true --kl-coef-final 0 --elite-rule)
# A single learning rate is no tuning; β decays to 0 over the configuration's share of the 300 iterations.
PYTHONPATH="$code" .venv/bin/python -P -m ftw_jax.cli compare "${task[@]}" top_k --learning-rates 0.003 \
  -N 256 -J 32 -C 4 -K 1 --kl-coef 0.3 --kl-decay-iterations 150 --name shaped-ftw-reviewed-choice
PYTHONPATH="$code" .venv/bin/python -P -m ftw_jax.cli compare "${task[@]}" beat_minimum --learning-rates 0.01 \
  -N 512 -J 128 -C 4 -K 2 --kl-coef 1 --kl-decay-iterations 75 --name shaped-ftw-earlier-choice
