# Session 4 (2026-11-23), after row-resident normalizations, unmasked whole-tile GEMM loads
# and merged q/k/v projections: the GPU tests, then fp16 at batch 32 for the five models beside
# eager and torch.compile (default), then BERT-base at batch 32 beside max-autotune.
# Usage: bash bench/gpu_runs/session4_final.sh (from the repository root, $OUT set)
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo PIPFAIL
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
timeout 100 python3 -m pytest -q -m gpu tests/ -p no:cacheprovider > $OUT/gputests.txt 2>&1
tail -3 $OUT/gputests.txt
cd /tmp
timeout 250 python3 -m deploy.bench.gpu resnet50 mobilenet_v2 bert_base gpt2_small vit_base \
  --dtype fp16 --batch 32 --skip-max-autotune --runs 20 --json $OUT/b32.json 2> $OUT/b32.err \
  | tee $OUT/b32.md
timeout 210 python3 -m deploy.bench.gpu bert_base --dtype fp16 --batch 32 --runs 20 \
  --json $OUT/b32_ma.json 2> $OUT/b32_ma.err | tee $OUT/b32_ma.md
