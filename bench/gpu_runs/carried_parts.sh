# Session 6 (2026-11-23): the transformers' fp16 artifacts, compiled on the CPU-only machine, run
# on the H100. They are 166-385 MB and the device tool carries 64 MiB a call, so here:
#   python -m deploy.bench.carried make bert_base gpt2_small vit_base --out /work/big \
#     --dtype fp16 --max-mb 2000
#   (cd /work/big && tar cf - . | tee >(sha256sum > SHA) | split -b 58M - parts/big.tar.)
# and each part travels in its own call (carry [".devcache/aa"], command
#   mkdir -p /tmp/parts && cp .devcache/*/big.tar.* /tmp/parts/)
# to one warm machine; the last call carries the last part with SHA and runs this script.
# The fp32 artifacts of all five (1.5 GB, 27 parts) went the same way as big32 (--dtype fp32):
# `bash bench/gpu_runs/carried_parts.sh big32 check-only`.
export PYTHONUNBUFFERED=1
name=${1:-big}
mkdir -p /tmp/parts /tmp/$name && cp .devcache/*/$name.tar.* /tmp/parts/
echo "parts: $(ls /tmp/parts/$name.tar.* | wc -l)"
want=$(cut -d' ' -f1 .devcache/*/SHA)
cat /tmp/parts/$name.tar.* > /tmp/$name.tar && tar xf /tmp/$name.tar -C /tmp/$name
got=$(sha256sum < /tmp/$name.tar | cut -d' ' -f1)
[ "$want" = "$got" ] && echo "sha256 matches" || { echo "sha256 differs: $got vs $want"; exit 1; }
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo PIPFAIL
repo=$PWD
cd /tmp
python3 -m deploy.bench.carried check /tmp/$name 2> $OUT/carried_$name.err | tee $OUT/carried_$name.md
[ "$2" = check-only ] && exit
timeout 240 python3 -m deploy.bench.gpu resnet50 mobilenet_v2 bert_base gpt2_small vit_base \
  --dtype fp32 --batch 1 --skip-max-autotune --skip-default --runs 20 --json $OUT/fp32.json \
  2> $OUT/fp32.err | tee $OUT/fp32.md
cd $repo && timeout 200 python3 -m pytest -q -m gpu tests/ -p no:cacheprovider 2>&1 | tail -15
