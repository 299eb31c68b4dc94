export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo PIPFAIL
cd /tmp
timeout 260 python3 -m deploy.bench.gpu resnet50 mobilenet_v2 bert_base gpt2_small vit_base --dtype fp16 --batch 32 --skip-max-autotune --runs 20 --json $OUT/b32.json 2> $OUT/b32.err | tee $OUT/b32.md
timeout 150 python3 -m deploy.bench.gpu bert_base gpt2_small --dtype fp16 --batch 1 --runs 20 --json $OUT/mat1.json 2> $OUT/mat1.err | tee $OUT/mat1.md
timeout 150 python3 -m deploy.bench.gpu bert_base --dtype fp16 --batch 32 --runs 20 --json $OUT/mat32.json 2> $OUT/mat32.err | tee $OUT/mat32.md
