# Session 5 (2026-11-23): per-kernel profile of GPT-2 small at batch 1 (fp16), then GPT-2 small
# and BERT-base at batch 1 beside torch.compile(mode="max-autotune") (session5_ma.sh).
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo PIPFAIL
p=$(cd /tmp && python3 -m deploy.bench.models gpt2_small --batch 1 2>/dev/null | head -1 | awk '{print $NF}')
deploy compile "$p" --target h100 --dtype fp16 -o /tmp/gpt2_1.dpk > /dev/null &&
  python3 -m deploy.bench.gpu_profile /tmp/gpt2_1.dpk --top 25 --json $OUT/prof_gpt2_b1.json \
  > $OUT/prof_gpt2_b1.txt 2>&1
tail -12 $OUT/prof_gpt2_b1.txt
BATCH=1 NOPACK=1 bash bench/gpu_runs/session5_ma.sh ${1:-440} gpt2_small bert_base
