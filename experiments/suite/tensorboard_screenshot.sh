#!/usr/bin/env bash
# A picture of TensorBoard showing a run's curves, taken in headless Chromium (Debian's `chromium` package):
#   bash experiments/suite/tensorboard_screenshot.sh RUN_FOLDER OUT.png [TAG_FILTER]
# e.g. the README's: a three-seed comparison on Sokoban, then its held-out success per seed.
#   .venv/bin/ftw-jax compare --env sokoban --algos ftw,ppo,grpo --seeds 0,1,2 --iterations 80 --name sokoban-3
#   bash experiments/suite/tensorboard_screenshot.sh runs/sokoban-3 docs/tensorboard.png 'eval/success$'
set -euo pipefail
run="$1"; out="$2"; filter="${3:-eval/}"
port=6199
.venv/bin/tensorboard --logdir "$run/tensorboard" --port "$port" --host 127.0.0.1 >/dev/null 2>&1 &
board=$!
trap 'kill $board 2>/dev/null || true' EXIT
for _ in $(seq 60); do curl -fs "http://127.0.0.1:$port/" >/dev/null && break; sleep 1; done
profile=$(mktemp -d)
chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run --disable-background-networking \
  --disable-component-update --disable-sync --user-data-dir="$profile" --hide-scrollbars \
  --window-size=1400,820 --virtual-time-budget=20000 --screenshot="$out" \
  "http://127.0.0.1:$port/#scalars&tagFilter=$(python3 -c 'import sys, urllib.parse; print(urllib.parse.quote(sys.argv[1]))' "$filter")&_smoothingWeight=0" \
  2>/dev/null
rm -rf "$profile"
echo "TensorBoard of $run ($filter) in $out"
