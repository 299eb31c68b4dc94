"""How a case ends, and the checks that decide it.

Every case ends in one of:

- ``error``: a ``deploy.DeployError`` subclass with a one-paragraph message (command line: a
  non-zero exit, ``deploy: error: ...`` on stderr, no traceback): the expected end of a
  malformed input;
- ``correct``: a result that the oracle (ONNX Runtime, or the untouched artifact's outputs)
  agrees with;
- ``crash``: any other exception (a raw traceback), an "internal error" from the command line,
  or the worker process dying (a segfault, an abort);
- ``hang``: the case ran past the per-case timeout (the pool kills and replaces the worker);
- ``silent``: a malformed input accepted, or a result that disagrees with the oracle;
- ``bad-message``: a DeployError whose message is empty, holds a traceback, or is not one
  paragraph (a blank line, or more than MAX_MESSAGE characters).
"""
from __future__ import annotations

import contextlib
import io
import traceback
from dataclasses import dataclass

import numpy as np
from deploy.errors import CompileError, DeployError

OUTCOMES = ("error", "correct", "crash", "hang", "silent", "bad-message")
FAILURES = ("crash", "hang", "silent", "bad-message")
MAX_MESSAGE = 4000  # characters; a message quoting a 10 MB input back is not one paragraph


@dataclass
class Result:
    outcome: str
    detail: str = ""

    def as_json(self) -> dict:
        return {"outcome": self.outcome, "detail": self.detail[:3000]}


class Wrong(Exception):
    """Raised by a check: the result disagrees with the oracle (a silent acceptance)."""


def message_problem(msg: str) -> str | None:
    text = msg.strip()
    if not text:
        return "empty message"
    if "Traceback (most recent call last)" in text:
        return "a traceback in the message"
    if "\n\n" in text:
        return "more than one paragraph"
    if len(text) > MAX_MESSAGE:
        return f"{len(text)} characters"
    return None


def refused(e: DeployError) -> Result:
    msg = str(e)
    if isinstance(e, CompileError):  # the C compiler failed on generated code: a deploy bug
        return Result("crash", f"CompileError: {msg[:1500]}")
    problem = message_problem(msg)
    if problem:
        return Result("bad-message", f"{type(e).__name__} ({problem}): {msg[:1500]}")
    return Result("error", f"{type(e).__name__}: {msg.splitlines()[0][:300]}")


def crashed(e: BaseException) -> Result:
    tb = traceback.format_exception(type(e), e, e.__traceback__)
    return Result("crash", f"{type(e).__name__}: {str(e)[:500]}\n" + "".join(tb[-6:])[-2500:])


def judge(call, check=None) -> Result:
    """Run ``call()``; a DeployError is an ``error``, any other exception a ``crash``. What it
    returns goes to ``check(value)``, which returns nothing (``correct``), raises ``Wrong``
    (``silent``) or raises itself (a DeployError from a later step is still an ``error``)."""
    try:
        value = call()
        if check is not None:
            check(value)
    except Wrong as e:
        return Result("silent", str(e))
    except DeployError as e:
        return refused(e)
    except (Exception, RecursionError) as e:  # noqa: BLE001  (that is what a crash is)
        return crashed(e)
    return Result("correct")


def accepted(what: str):
    """A check for inputs that must be refused: being accepted is a silent acceptance."""
    def check(_value):
        raise Wrong(f"accepted: {what}")
    return check


def cli(argv: list[str]) -> Result:
    """``deploy ARGV`` in this process (the command line's own entry point, ``cli.main``): a
    non-zero exit with ``deploy: error:`` and no traceback is an ``error``; exit 0 is
    returned as ``correct`` (the caller decides whether accepting was right)."""
    from deploy.cli import main
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(argv)
    except SystemExit as e:  # argparse
        code = e.code if isinstance(e.code, int) else 2
    except (Exception, RecursionError) as e:  # noqa: BLE001
        return crashed(e)
    text = err.getvalue()
    if code == 0:
        return Result("correct", text[-300:])
    if "Traceback (most recent call last)" in text:
        return Result("crash", f"exit {code} with a traceback: {text[-2500:]}")
    if "internal error" in text or code == 70:  # cli.EXIT_INTERNAL
        return Result("crash", f"exit {code}: {text.strip()[-1500:]}")
    body = text.strip().removeprefix("deploy: error:").strip()
    if "CompileError" in text or "C compiler failed" in text:
        return Result("crash", f"exit {code}: {text.strip()[-1500:]}")
    problem = message_problem(body) if text.strip().startswith("deploy: error:") else \
        "no 'deploy: error:' line" if code != 2 else None  # (2: argparse's usage error)
    if problem:
        return Result("bad-message", f"exit {code} ({problem}): {text.strip()[:1500]}")
    return Result("error", f"exit {code}: {text.strip().splitlines()[-1][:300]}")


# ---- the oracle: ONNX Runtime and comparisons ------------------------------------------

def session(model: bytes | str):
    import onnxruntime as ort
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = opts.inter_op_num_threads = 1
    opts.log_severity_level = 4
    return ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])


def ort_run(model_bytes_or_session, feeds: dict) -> list[np.ndarray]:
    """ONNX Runtime's outputs; its refusal of a model deploy accepted is a ``Wrong``."""
    try:
        sess = (session(model_bytes_or_session) if isinstance(model_bytes_or_session, bytes)
                else model_bytes_or_session)
        return sess.run(None, feeds)
    except Exception as e:  # noqa: BLE001  (any ORT failure)
        raise Wrong(f"ONNX Runtime refuses what deploy accepted: {type(e).__name__}: "
                    f"{' '.join(str(e).split())[:400]}") from None


def compare(ours, ref, what: str = "output", rtol: float = 1e-3) -> None:
    """``ours`` agrees with ``ref`` (lists of arrays): same count, shapes, dtypes; values
    close (NaN where ref has NaN, the same infinities), relative to the output's scale."""
    if len(ours) != len(ref):
        raise Wrong(f"{len(ours)} {what}s, the oracle has {len(ref)}")
    for k, (a, b) in enumerate(zip(ours, ref)):
        a, b = np.asarray(a), np.asarray(b)
        if a.shape != b.shape:
            raise Wrong(f"{what} {k}: shape {list(a.shape)}, the oracle's {list(b.shape)}")
        if a.dtype != b.dtype:
            raise Wrong(f"{what} {k}: dtype {a.dtype}, the oracle's {b.dtype}")
        if a.dtype.kind not in "fc":
            if not np.array_equal(a, b):
                raise Wrong(f"{what} {k}: values differ from the oracle's")
            continue
        finite = np.abs(b[np.isfinite(b)])
        scale = max(1.0, float(finite.max())) if finite.size else 1.0
        close = np.isclose(a, b, rtol=rtol, atol=1e-4 * scale, equal_nan=True)
        if not close.all():
            bad = np.argwhere(~close)[0]
            at = tuple(int(i) for i in bad)
            raise Wrong(f"{what} {k}: {int((~close).sum())} of {a.size} values differ, e.g. "
                        f"at {list(at)}: {a[at]!r} vs the oracle's {b[at]!r}")


def random_feeds(specs, rng: np.random.Generator, batch: int = 2) -> dict[str, np.ndarray]:
    """Inputs for a module's ``input_specs``: symbolic dims take ``batch``; integer inputs
    hold small non-negative values (valid indices of any axis of size >= 3)."""
    feeds = {}
    for spec in specs:
        shape = tuple(d if isinstance(d, int) else batch for d in spec.shape)
        dtype = np.dtype(spec.dtype)
        if dtype == np.bool_:
            feeds[spec.name] = rng.random(shape) > 0.5
        elif dtype.kind in "iu":
            feeds[spec.name] = rng.integers(0, 3, shape).astype(dtype)
        elif dtype.kind == "f":
            feeds[spec.name] = rng.standard_normal(shape).astype(dtype)
        else:
            raise Wrong(f"input '{spec.name}' has dtype {dtype}, which the fuzzer does not feed")
    return feeds


# ONNX Runtime refusals that are about its own coverage, not the model's meaning: deploy runs
# some ops on more types of a kind than ORT has kernels for, and infers outputs declared with
# an UNDEFINED element type. ONNX's reference evaluator is the oracle there.
ORT_GAPS = ("NOT_IMPLEMENTED", "Could not find an implementation", "Type Error: Type '",
            "Invalid tensor data type 0")
ORT_OUT_OF_MEMORY = "Failed to allocate memory"  # (a fused deploy kernel may need far less)


def check_against_ort(model: bytes | str, module, rng: np.random.Generator) -> None:
    """A compiled (possibly mutated) model (its bytes, or its path) agrees with ONNX Runtime
    on random inputs (with ONNX's reference evaluator where ORT lacks a kernel)."""
    feeds = random_feeds(module.input_specs, rng)
    try:
        sess = session(model)
        names = [i.name for i in sess.get_inputs()]
    except Exception as e:  # noqa: BLE001
        text = " ".join(str(e).split())
        if "Cannot parse data from external tensors" in text and isinstance(model, str):
            import onnx  # ORT's shape inference reads no side files: the data in the model
            return check_against_ort(onnx.load(model).SerializeToString(), module, rng)
        if not any(g in text for g in ORT_GAPS):
            raise Wrong(f"ONNX Runtime refuses a model deploy compiled: {type(e).__name__}: "
                        f"{text[:400]}") from None
        ours = module.run(dict(feeds))
        compare(ours, reference_run(model, feeds, text))
        return
    if sorted(names) != sorted(feeds):
        raise Wrong(f"deploy's inputs {sorted(feeds)} are not ONNX Runtime's {sorted(names)}")
    ours = module.run(dict(feeds))
    agrees(ours, model, feeds, lambda: ort_run(sess, feeds))


def agrees(ours, model: bytes | str, feeds: dict, ort_outputs) -> None:
    """``ours`` matches ONNX Runtime's outputs or, where they differ, ONNX's reference
    evaluator's: the spec's executable semantics (ORT's Max/Min reductions, say, drop a NaN
    or keep it depending on where it lies; the reference and deploy keep it)."""
    try:
        try:
            ref = ort_outputs()
        except Wrong as e:
            if ORT_OUT_OF_MEMORY not in str(e):
                raise
            ref = reference_run(model, feeds, str(e))
        compare(ours, ref)
    except Wrong as e:
        try:
            compare(ours, reference_run(model, feeds, str(e)))
        except Wrong:
            raise e from None


def reference_run(model: bytes | str, feeds: dict, why: str) -> list[np.ndarray]:
    import onnx
    from onnx.reference import ReferenceEvaluator
    try:
        proto = model if isinstance(model, onnx.ModelProto) else onnx.load(model) if \
            isinstance(model, str) else onnx.load_from_string(model)
        return [np.asarray(o) for o in ReferenceEvaluator(proto).run(None, feeds)]
    except Exception as e:  # noqa: BLE001
        raise Wrong(f"ONNX Runtime ({why[:200]}) and ONNX's reference evaluator ({type(e).__name__}"
                    f": {' '.join(str(e).split())[:200]}) refuse a model deploy compiled") from None
