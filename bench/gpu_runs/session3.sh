# Session 3 (2026-11-23): after channels-last dense convolutions moved to the flattened output
# grid and the attention recogniser moved to tensor_ir: the GPU tests, then fp16 ResNet-50,
# MobileNetV2 and BERT-base at batch 1 and 32 beside eager and torch.compile (default).
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo PIPFAIL
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
timeout 200 python3 -m pytest -q -m gpu tests/ -p no:cacheprovider > $OUT/gputests.txt 2>&1
tail -4 $OUT/gputests.txt
cd /tmp
timeout 270 python3 -m deploy.bench.gpu resnet50 mobilenet_v2 bert_base --dtype fp16 --batch 1 32 \
  --skip-max-autotune --runs 20 --json $OUT/s3.json 2> $OUT/s3.err | tee $OUT/s3.md
tail -3 $OUT/s3.err
