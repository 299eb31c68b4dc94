#!/bin/bash
# Serial GPU tuning against Ray (one measuring actor per GPU + a CPU compile pool), same model,
# level and budget, each with an empty Triton cache; the Ray run reports its agreement with the
# serial run's records. Needs a GPU, `pip install 'deploy-compiler[distributed]'` and torch +
# transformers (to export the model).
#
#   bash bench/ray_gpu_tune.sh [MODEL.onnx]      (default: BERT-base, batch 32 x seq 128)
#   MODES="serial auto local" LEVEL=full BUDGET=10m TARGET=h100 OUT=results/
set -o pipefail
OUT=${OUT:-.}; LEVEL=${LEVEL:-full}; BUDGET=${BUDGET:-10m}; TARGET=${TARGET:-h100}
WORK=$(mktemp -d)
M=${1:-$(python3 -c "from deploy.bench.models import model_path; print(model_path('bert_base', batch=32))")} || exit 1
ray_cli() { python3 -c 'import sys; from ray.scripts.scripts import main; sys.argv = ["ray"] + sys.argv[1:]; main()' "$@"; }
for mode in ${MODES:-serial auto local}; do
  export TRITON_CACHE_DIR=$WORK/triton-$mode
  extra="--ray $mode --reference-db $WORK/serial.jsonl"; [ "$mode" = serial ] && extra=""
  [ "$mode" = auto ] && ray_cli start --head --include-dashboard=false --disable-usage-stats >/dev/null 2>&1
  t0=$(date +%s.%N)
  deploy tune "$M" --target "$TARGET" --level "$LEVEL" --budget "$BUDGET" \
      --tuning-db "$WORK/$mode.jsonl" $extra 2>&1 | grep -v '^tune \['
  echo "$mode: rc $? whole command $(python3 -c "import time; print(round(time.time() - $t0, 1))") s"
  [ "$mode" = auto ] && ray_cli stop >/dev/null 2>&1
done
cp "$WORK"/*.jsonl "$OUT"/ 2>/dev/null
