export PYTHONUNBUFFERED=1
R=$PWD
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo PIPFAIL
nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/gpu.txt
timeout 170 python3 -m pytest -q -m gpu tests/ -p no:cacheprovider > $OUT/gputests.txt 2>&1
tail -5 $OUT/gputests.txt
cd /tmp
timeout 380 python3 -m deploy.bench.gpu resnet50 mobilenet_v2 bert_base gpt2_small vit_base --dtype fp16 fp32 --batch 1 --skip-max-autotune --runs 20 --json $OUT/b1.json 2> $OUT/b1.err | tee $OUT/b1.md
