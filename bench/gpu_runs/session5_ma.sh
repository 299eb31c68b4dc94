# Session 5 (2026-11-23): fp16 at batch 32 beside eager and torch.compile(mode="max-autotune"),
# one process per model, within one deadline. max-autotune's inductor cache (autotuning results,
# FX graphs; not the Triton binaries) is packed into $OUT/ind.tgz and, carried back as
# .devcache/ind.tgz, unpacked by the next call: a compile cut off by the deadline resumes there
# instead of starting over. Usage: bash bench/gpu_runs/session5_ma.sh SECONDS MODEL...
export PYTHONUNBUFFERED=1 TORCHINDUCTOR_CACHE_DIR=/tmp/ind
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo PIPFAIL
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
[ -f .devcache/ind.tgz ] && tar xzf .devcache/ind.tgz -C /tmp && echo "cache unpacked"
deadline=$(( $(date +%s) + $1 )); shift
here=$PWD
cd /tmp
for m in "$@"; do
  left=$(( deadline - $(date +%s) ))
  [ $left -lt 40 ] && echo "no time left for $m" && break
  echo "== $m ($left s left)"
  timeout $left python3 -m deploy.bench.gpu $m --dtype fp16 --batch 32 --runs 20 \
    --skip-default --json $OUT/b32_$m.json 2>> $OUT/b32.err | tee -a $OUT/b32.md
done
tar czf $OUT/ind.tgz --exclude=ind/triton -C /tmp ind
ls -la $OUT; du -sh /tmp/ind
grep -i "error\|Traceback" $OUT/b32.err | tail -5
