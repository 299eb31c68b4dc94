export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo PIPFAIL
cd /tmp
timeout 420 python3 -m deploy.bench.gpu bert_base gpt2_small --dtype fp16 --batch 1 --tune quick --tuning-db /tmp/gpu_tuning.jsonl --budget 90s --runs 20 --json $OUT/tuned.json 2> $OUT/tuned.err | tee $OUT/tuned.md
cp /tmp/gpu_tuning.jsonl $OUT/ 2>/dev/null
