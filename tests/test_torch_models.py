"""Full-size models from transformers configs (seeded random weights) through torch.export and
through torch.compile(backend="deploy"), against eager (fp32, rtol 1e-3, atol 1e-4). Slow tier:
``python -m pytest -q -m slow tests/test_torch_models.py``."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import deploy
import deploy.torch_backend
from deploy.bench.models import build, random_inputs

MODELS = ["resnet50", "mobilenet_v2", "bert_base", "gpt2_small"]


@pytest.mark.slow
@pytest.mark.parametrize("name", MODELS)
def test_full_model_export_and_torch_compile(name):
    module, specs, _ = build(name)
    feed = random_inputs(specs, np.random.default_rng(3))
    args = tuple(torch.from_numpy(feed[s.name]) for s in specs)
    with torch.no_grad():
        ref = module(*args).numpy()
    mod = deploy.compile(torch.export.export(module, args)).load()
    names = [s.name for s in mod.input_specs]
    out = mod.run(dict(zip(names, [a.numpy() for a in args])))[0]
    np.testing.assert_allclose(out, ref, rtol=1e-3, atol=1e-4)
    torch._dynamo.reset()
    with torch.no_grad():
        out2 = torch.compile(module, backend="deploy")(*args).numpy()
    np.testing.assert_allclose(out2, ref, rtol=1e-3, atol=1e-4)
