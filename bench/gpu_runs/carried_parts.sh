# Session 6 (2026-11-23): the transformers' fp16 artifacts, compiled on the CPU-only machine, run
# on the H100. They are 166-385 MB and the device tool carries 64 MiB a call, so here:
#   python -m deploy.bench.carried make bert_base gpt2_small vit_base --out /work/big \
#     --dtype fp16 --max-mb 2000
#   (cd /work/big && tar cf - . | tee >(sha256sum > SHA) | split -b 58M - parts/big.tar.)
# and each part travels in its own call (carry [".devcache/aa"], command
#   mkdir -p /tmp/parts && cp .devcache/*/big.tar.* /tmp/parts/)
# to one warm machine; the last call carries the last part with SHA and runs this script.
export PYTHONUNBUFFERED=1
mkdir -p /tmp/parts /tmp/big && cp .devcache/*/big.tar.* /tmp/parts/
echo "parts: $(ls /tmp/parts | wc -l)"
want=$(cut -d' ' -f1 .devcache/*/SHA)
got=$(cat /tmp/parts/big.tar.* | tee >(tar xf - -C /tmp/big) | sha256sum | cut -d' ' -f1)
sleep 2
[ "$want" = "$got" ] && echo "sha256 matches" || { echo "sha256 differs: $got vs $want"; exit 1; }
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo PIPFAIL
repo=$PWD
cd /tmp
python3 -m deploy.bench.carried check /tmp/big 2> $OUT/carried_big.err | tee $OUT/carried_big.md
timeout 240 python3 -m deploy.bench.gpu resnet50 mobilenet_v2 bert_base gpt2_small vit_base \
  --dtype fp32 --batch 1 --skip-max-autotune --skip-default --runs 20 --json $OUT/fp32.json \
  2> $OUT/fp32.err | tee $OUT/fp32.md
cd $repo && timeout 200 python3 -m pytest -q -m gpu tests/ -p no:cacheprovider 2>&1 | tail -15
