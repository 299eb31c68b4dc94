# Session 4 (2026-11-23), same code as session4_final.sh: fp16 at batch 1 for the five models,
# beside eager and torch.compile default; BERT-base and GPT-2 small also beside max-autotune.
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo PIPFAIL
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
cd /tmp
timeout 170 python3 -m deploy.bench.gpu resnet50 mobilenet_v2 vit_base --dtype fp16 --batch 1 \
  --skip-max-autotune --runs 20 --json $OUT/b1.json 2> $OUT/b1.err | tee $OUT/b1.md
for m in bert_base gpt2_small; do
  timeout 140 python3 -m deploy.bench.gpu $m --dtype fp16 --batch 1 --runs 20 \
    --json $OUT/b1_$m.json 2>> $OUT/b1_ma.err | tee -a $OUT/b1_ma.md
done
