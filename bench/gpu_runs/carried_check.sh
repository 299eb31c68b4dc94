# Prepared in session 5 (2026-11-23), for the next device session: the acceptance's "compiled for
# h100 on the CPU-only machine, then run on the H100", and fp32 on the H100 with today's code.
# Here (CPU-only), first:
#   python -m deploy.bench.carried make resnet50 mobilenet_v2 bert_base gpt2_small vit_base \
#     --out .devcache --dtype fp16      (43 s here; ResNet-50 50.9 MB and MobileNetV2 8.3 MB
#                                         travel, 61 MB with the rest, inside the 64 MiB carry
#                                         beside the ~2 MB repo; the transformers travel as
#                                         digests and compile there)
# then on the device, with .devcache carried: bash bench/gpu_runs/carried_check.sh
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo PIPFAIL
nvidia-smi --query-gpu=name --format=csv,noheader
repo=$PWD
cd /tmp
python3 -m deploy.bench.carried check $repo/.devcache 2> $OUT/carried.err | tee $OUT/carried.md
timeout 330 python3 -m deploy.bench.gpu resnet50 mobilenet_v2 bert_base gpt2_small vit_base \
  --dtype fp32 --batch 1 --skip-max-autotune --skip-default --runs 20 --json $OUT/fp32.json 2> $OUT/fp32.err \
  | tee $OUT/fp32.md
