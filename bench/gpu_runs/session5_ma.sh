# Session 5 (2026-11-23): fp16 at batch $BATCH (default 32) beside eager and
# torch.compile(mode="max-autotune"), one process per model, within one deadline.
# max-autotune's inductor cache (autotuning results, FX graphs; not the Triton binaries) is
# packed into $OUT/ind.tgz.* (15 MB parts; not with NOPACK=1) and, carried back as
# .devcache/ind.tgz.*, unpacked by the next call: a compile cut off by the deadline resumes
# there instead of starting over. Usage: bash bench/gpu_runs/session5_ma.sh SECONDS MODEL...
export PYTHONUNBUFFERED=1 TORCHINDUCTOR_CACHE_DIR=/tmp/ind
b=${BATCH:-32}
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo PIPFAIL
nvidia-smi --query-gpu=name --format=csv,noheader
[ -n "$(ls .devcache/ind.tgz* 2>/dev/null)" ] && cat .devcache/ind.tgz* | tar xz -C /tmp && echo "cache unpacked"
deadline=$(( $(date +%s) + $1 )); shift
cd /tmp
for m in "$@"; do
  left=$(( deadline - $(date +%s) ))
  [ $left -lt 40 ] && echo "no time left for $m" && break
  echo "== $m ($left s left)"
  timeout $left python3 -m deploy.bench.gpu $m --dtype fp16 --batch $b --runs 20 \
    --skip-default --json $OUT/b${b}_$m.json 2>> $OUT/b$b.err | tee -a $OUT/b$b.md
done
[ -n "$NOPACK" ] || tar cz --exclude=ind/triton -C /tmp ind | split -b 15m - $OUT/ind.tgz.
ls -la $OUT; du -sh /tmp/ind
grep -i "error\|Traceback" $OUT/b$b.err | tail -5
