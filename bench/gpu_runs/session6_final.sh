# Session 6 (2026-11-23), after device outputs in place and torch inputs without per-tensor
# DLPack events: pytest -m gpu; BERT-base and GPT-2 small at batch 1 beside eager; GPT-2 small at
# batch 32 beside eager and torch.compile(mode="max-autotune") in the same process.
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo PIPFAIL
timeout 120 python3 -m pytest -q -m gpu tests/ -p no:cacheprovider 2>&1 | tail -4
cd /tmp
timeout 120 python3 -m deploy.bench.gpu bert_base gpt2_small --batch 1 --dtype fp16 \
  --skip-default --skip-max-autotune --runs 50 --json $OUT/b1.json 2> $OUT/b1.err | tee $OUT/b1.md
timeout 300 python3 -m deploy.bench.gpu gpt2_small --batch 32 --dtype fp16 --skip-default \
  --runs 20 --json $OUT/b32.json 2> $OUT/b32.err | tee $OUT/b32.md
