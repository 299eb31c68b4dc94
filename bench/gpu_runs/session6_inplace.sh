# Session 6 (2026-11-23): device outputs written in place by their kernels (a graph per output
# slab, no copy out). pytest -m gpu, then fp16 beside eager (torch.compile left out: session 5
# measured it) for GPT-2 small at batch 32 (823 MB of logits were copied per run) and BERT-base /
# GPT-2 small at batch 1, then where the host time of one BERT-base batch-1 run goes (cProfile).
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo PIPFAIL
timeout 150 python3 -m pytest -q -m gpu tests/ -p no:cacheprovider 2>&1 | tail -4
cd /tmp
timeout 200 python3 -m deploy.bench.gpu gpt2_small --batch 32 --dtype fp16 --skip-default \
  --skip-max-autotune --runs 20 --json $OUT/b32.json 2> $OUT/b32.err | tee $OUT/b32.md
timeout 150 python3 -m deploy.bench.gpu bert_base gpt2_small --batch 1 --dtype fp16 \
  --skip-default --skip-max-autotune --runs 50 --json $OUT/b1.json 2> $OUT/b1.err | tee $OUT/b1.md
timeout 90 python3 - <<'PY' 2>&1 | tail -40 | tee $OUT/host_profile.txt
import cProfile, pstats, numpy as np, torch, deploy
from deploy.bench.models import model_path, input_specs, random_inputs
p = str(model_path("bert_base", batch=1))
mod = deploy.compile(p, target="h100", dtype="fp16").load()
feed = random_inputs(input_specs(p), np.random.default_rng(1))
args = {k: torch.from_numpy(v).cuda() for k, v in feed.items()}
for _ in range(20):
    mod.run(args)
torch.cuda.synchronize()
prof = cProfile.Profile()
prof.enable()
for _ in range(1000):
    mod.run(args)
torch.cuda.synchronize()
prof.disable()
pstats.Stats(prof).sort_stats("tottime").print_stats(25)
PY
