#!/usr/bin/env bash
# Shaped Sokoban, fixed configurations on the reviewed protocol's held-out rooms, 10 seeds each, no tuning (a
# diagnostic outside the protocol, docs/results.md says why), for the two methods whose success fell there:
#   ftw-reviewed-choice        the configuration the reviewed protocol's tuning chose for FTW
#   ftw-earlier-choice         the one the earlier protocol's tuning chose (results/compare-successive-halving)
#   reinforce-earlier-choice   the same for REINFORCE (its reviewed choice is the report's run)
# They run the library at the protocol's commit, in the worktree experiments/protocol/protocol_worktree.sh makes; about
# 4, 8 and 10 minutes on 2 cores. Their tables go to runs/shaped-NAME; the committed copies to
# results/sokoban-shaped-choices.
#   bash experiments/protocol/shaped_choices.sh
set -euo pipefail
source "$(dirname "$0")/protocol_worktree.sh"  # sets $code, the worktree at the protocol's commit
# A single learning rate is no tuning; β decays to 0 over the configuration's share of the 300 iterations.
run() {
  local name="shaped-$1"
  shift
  if [ -f "runs/$name/summary.json" ]; then echo "runs/$name: done"; return; fi
  PYTHONPATH="$code" .venv/bin/python -P -m ftw_jax.cli compare --env sokoban --iterations 300 \
    --seeds 0,1,2,3,4,5,6,7,8,9 --max-grad-norm 0.5 --anneal-learning-rate yes --eval-greedy true --kl-coef-final 0 \
    --name "$name" "$@"
}
run ftw-reviewed-choice --algos ftw --learning-rates 0.003 -N 256 -J 32 -C 4 -K 1 --elite-rule top_k \
  --kl-coef 0.3 --kl-decay-iterations 150
run ftw-earlier-choice --algos ftw --learning-rates 0.01 -N 512 -J 128 -C 4 -K 2 --elite-rule beat_minimum \
  --kl-coef 1 --kl-decay-iterations 75
run reinforce-earlier-choice --algos reinforce --learning-rates 0.001 --updates-per-iteration 4 --entropy-coef 0 \
  --kl-coef 0.5 --kl-decay-iterations 300
