# Session 4 (2026-11-23): fp16 at batch 32 beside eager, torch.compile default and
# max-autotune, one model per process (a slow max-autotune compile cannot take the others
# down). Usage: bash bench/gpu_runs/session4_b32.sh SECONDS_PER_MODEL MODEL...
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo PIPFAIL
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
limit=$1; shift
cd /tmp
for m in "$@"; do
  timeout $limit python3 -m deploy.bench.gpu $m --dtype fp16 --batch 32 --runs 20 \
    --json $OUT/b32_$m.json 2>> $OUT/b32.err | tee -a $OUT/b32.md
done
tail -3 $OUT/b32.err
