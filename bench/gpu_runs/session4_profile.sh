# Session 4 (2026-11-23): per-kernel GPU time of fp16 artifacts compiled on the GPU machine
# (where the time goes before changing the transformer GEMMs): BERT-base, GPT-2 small and
# ViT-base at batch 32, BERT-base at batch 1, ResNet-50 at batch 32.
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo PIPFAIL
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
cd /tmp
prof() {  # name batch
  p=$(python3 -m deploy.bench.models $1 --batch $2 2>/dev/null | head -1 | awk '{print $NF}')
  echo "== $1 b$2 ($p)"
  deploy compile "$p" --target h100 --dtype fp16 -o /tmp/$1_$2.dpk > /dev/null || return
  python3 -m deploy.bench.gpu_profile /tmp/$1_$2.dpk --top ${3:-18} --json $OUT/$1_$2.json
}
for c in "bert_base 32 30" "gpt2_small 32" "vit_base 32" "bert_base 1 25" "resnet50 32 12"; do
  prof $c 2>&1 | tee -a $OUT/profile.txt
done
