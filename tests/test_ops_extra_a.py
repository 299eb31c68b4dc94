"""Recurrent layers, losses, signal ops, CumProd and BitCast, checked through the whole compiler
against ONNX Runtime (or the ONNX reference evaluator for opset-26 ops ONNX Runtime lacks) on
small random inputs."""
import numpy as np
import pytest
from deploy.errors import DeployError
from onnx import helper
from onnx.reference import ReferenceEvaluator

from tests.util import check_against_ort, make_model, run_deploy, run_ort

F32 = np.float32
RNG = np.random.default_rng(7)


def _rand(*shape, dtype=F32):
    return RNG.standard_normal(shape).astype(dtype)


# ---- RNN / GRU / LSTM -------------------------------------------------------------------------

def _recurrent(kind, T=4, B=3, I=5, H=4, direction="forward", lens=None, peep=False, **attrs):
    """A model with X, sequence_lens and initial states as runtime inputs, weights constant."""
    G = {"RNN": 1, "GRU": 3, "LSTM": 4}[kind]
    D = 2 if direction == "bidirectional" else 1
    feeds = {"X": _rand(T, B, I), "h0": _rand(D, B, H)}
    inits = {"W": _rand(D, G * H, I) * 0.5, "R": _rand(D, G * H, H) * 0.5,
             "B": _rand(D, 2 * G * H) * 0.5}
    names = ["X", "W", "R", "B", "", "h0", "", ""]
    if lens is not None:
        names[4], feeds["L"] = "L", np.asarray(lens, np.int32)
    if kind == "LSTM":
        names[6], feeds["c0"] = "c0", _rand(D, B, H)
    if peep:
        names[7], inits["P"] = "P", _rand(D, 3 * H)
    while not names[-1]:  # trailing optional inputs are omitted
        names.pop()
    outs = ["Y", "Y_h"] + (["Y_c"] if kind == "LSTM" else [])
    node = helper.make_node(kind, names, outs, hidden_size=H, direction=direction, **attrs)
    inputs = [(k, v.dtype, v.shape) for k, v in feeds.items()]
    outputs = [("Y", F32, (T, D, B, H))] + [(o, F32, (D, B, H)) for o in outs[1:]]
    return make_model([node], inputs, outputs, inits, opset=14), feeds


RECURRENT = [
    ("LSTM", {"direction": "bidirectional", "lens": [4, 1, 3], "peep": True}),
    ("LSTM", {"direction": "reverse", "clip": 0.6, "input_forget": 1}),
    ("GRU", {"direction": "bidirectional", "lens": [2, 4, 3], "linear_before_reset": 1}),
    ("GRU", {"activations": ["HardSigmoid", "ScaledTanh"], "activation_alpha": [0.3, 0.7],
             "activation_beta": [0.4, 1.2]}),
    ("RNN", {"direction": "reverse", "lens": [3, 4, 2], "activations": ["LeakyRelu"],
             "activation_alpha": [0.2]}),
]


@pytest.mark.parametrize("kind,attrs", RECURRENT, ids=[k for k, _ in RECURRENT])
def test_recurrent_matches_ort(kind, attrs):
    model, feeds = _recurrent(kind, **attrs)
    check_against_ort(model, feeds, rtol=1e-4, atol=1e-5)


def test_lstm_batch_major_layout():
    # layout=1 (ONNX Runtime has no batch-major kernel): compare with layout 0 on swapped axes
    T, B, I, H = 3, 2, 4, 5
    x, h0, c0 = _rand(B, T, I), _rand(B, 1, H), _rand(B, 1, H)
    inits = {"W": _rand(1, 4 * H, I), "R": _rand(1, 4 * H, H), "B": _rand(1, 8 * H)}

    def model(layout, xs, hs):
        node = helper.make_node("LSTM", ["X", "W", "R", "B", "", "h0", "c0"], ["Y", "Y_h", "Y_c"],
                                hidden_size=H, layout=layout)
        return make_model([node], [("X", F32, xs), ("h0", F32, hs), ("c0", F32, hs)],
                          [("Y", F32, None), ("Y_h", F32, None), ("Y_c", F32, None)], inits,
                          opset=14)

    ours = run_deploy(model(1, x.shape, h0.shape), {"X": x, "h0": h0, "c0": c0})
    sw = lambda a: np.ascontiguousarray(np.swapaxes(a, 0, 1))
    ref = run_ort(model(0, (T, B, I), (1, B, H)), {"X": sw(x), "h0": sw(h0), "c0": sw(c0)})
    np.testing.assert_allclose(ours[0], np.transpose(ref[0], (2, 0, 1, 3)), rtol=1e-4, atol=1e-5)
    for a, b in zip(ours[1:], ref[1:]):
        np.testing.assert_allclose(a, sw(b), rtol=1e-4, atol=1e-5)


# ---- losses -----------------------------------------------------------------------------------

LOSSES = [
    ("SoftmaxCrossEntropyLoss", (3, 5, 2, 2), {"reduction": "mean", "ignore_index": 1}, True, 2),
    ("SoftmaxCrossEntropyLoss", (4, 6), {"reduction": "none"}, False, 2),
    ("NegativeLogLikelihoodLoss", (3, 5, 4), {"reduction": "sum", "ignore_index": -1}, True, 1),
    ("NegativeLogLikelihoodLoss", (2, 4, 3), {"reduction": "mean"}, False, 1),
]


@pytest.mark.parametrize("op,shape,attrs,weighted,nout", LOSSES,
                         ids=[f"{o}-{a['reduction']}" for o, _, a, _, _ in LOSSES])
def test_loss_matches_ort(op, shape, attrs, weighted, nout):
    n, c, rest = shape[0], shape[1], shape[2:]
    target = RNG.integers(0, c, (n,) + rest).astype(np.int64)
    if "ignore_index" in attrs:
        target.flat[::3] = attrs["ignore_index"]
    feeds = {"x": _rand(*shape), "t": target}
    inputs = [("x", F32, shape), ("t", np.int64, target.shape)]
    if weighted:
        feeds["w"] = RNG.random(c).astype(F32) + 0.1
        inputs.append(("w", F32, (c,)))
    outs = ["loss", "log_prob"][:nout]
    node = helper.make_node(op, [name for name, _, _ in inputs], outs, **attrs)
    loss_shape = (n,) + rest if attrs["reduction"] == "none" else ()
    model = make_model([node], inputs, [("loss", F32, loss_shape), ("log_prob", F32, shape)][:nout],
                       opset=13)
    check_against_ort(model, feeds, rtol=1e-4, atol=1e-5)


# ---- signal -----------------------------------------------------------------------------------

DFTS = [  # (input shape, attrs, dft_length, axis)
    ((2, 8, 3, 1), {"onesided": 1}, 10, 1),  # real, zero-padded, one-sided
    ((2, 3, 7, 2), {"inverse": 1}, None, 2),  # complex inverse
    ((1, 4, 5, 2), {"inverse": 1, "onesided": 1}, 6, 1),  # irfft
]


@pytest.mark.parametrize("shape,attrs,length,axis", DFTS, ids=["rfft-pad", "ifft", "irfft"])
def test_dft_matches_numpy(shape, attrs, length, axis):
    x = _rand(*shape)
    names, inits = ["x", "", "axis"], {"axis": np.asarray(axis, np.int64)}
    if length is not None:
        names[1], inits["n"] = "n", np.asarray(length, np.int64)
    node = helper.make_node("DFT", names, ["y"], **attrs)
    model = make_model([node], [("x", F32, shape)], [("y", F32, None)], inits, opset=20)
    ours = run_deploy(model, {"x": x})[0]
    sig = x[..., 0] + (1j * x[..., 1] if shape[-1] == 2 else 0)
    n = length or shape[axis]
    if attrs.get("inverse") and attrs.get("onesided"):
        ref = np.fft.irfft(sig.astype(np.complex128), n=n, axis=axis)[..., None]
    else:
        fft = np.fft.ifft if attrs.get("inverse") else np.fft.fft
        full = fft(sig.astype(np.complex128), n=n, axis=axis)
        if attrs.get("onesided"):
            full = np.take(full, np.arange(n // 2 + 1), axis=axis)
        ref = np.stack([full.real, full.imag], -1)
    np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-5)


def test_stft_with_runtime_window_matches_ort():
    signal, window = _rand(2, 40, 1), _rand(8)
    node = helper.make_node("STFT", ["s", "step", "w"], ["y"])
    model = make_model([node], [("s", F32, signal.shape), ("w", F32, (8,))], [("y", F32, None)],
                       {"step": np.asarray(3, np.int64)}, opset=17)
    check_against_ort(model, {"s": signal, "w": window}, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("op", ["HannWindow", "HammingWindow", "BlackmanWindow"])
def test_windows_and_mel_matrix_match_ort(op):
    window = helper.make_node(op, ["n"], ["w"], periodic=0, output_datatype=11)
    mel = helper.make_node("MelWeightMatrix", ["bins", "dft", "rate", "lo", "hi"], ["m"])
    inits = {"n": np.asarray(12, np.int64), "bins": np.asarray(6, np.int64),
             "dft": np.asarray(32, np.int64), "rate": np.asarray(8000, np.int64),
             "lo": np.asarray(50, F32), "hi": np.asarray(3800, F32)}
    model = make_model([window, mel], [("x", F32, (1,))],
                       [("w", np.float64, None), ("m", F32, None)], inits, opset=17)
    check_against_ort(model, {"x": _rand(1)}, rtol=1e-6, atol=1e-7)


# ---- CumProd, BitCast (opset 26) --------------------------------------------------------------

def _check_reference(model, feeds):
    ours = run_deploy(model, feeds)
    ref = ReferenceEvaluator(model).run(None, feeds)
    for a, b in zip(ours, ref):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=0)


@pytest.mark.parametrize("dtype,exclusive,reverse",
                         [(F32, 1, 1), (np.int64, 0, 1), (np.int32, 1, 0)])
def test_cumprod_matches_reference(dtype, exclusive, reverse):
    x = (RNG.random((2, 5, 3)) * 3 - 1).astype(dtype) if dtype == F32 else \
        RNG.integers(-3, 4, (2, 5, 3)).astype(dtype)
    node = helper.make_node("CumProd", ["x", "axis"], ["y"], exclusive=exclusive, reverse=reverse)
    model = make_model([node], [("x", dtype, x.shape)], [("y", dtype, x.shape)],
                       {"axis": np.asarray(-2, np.int64)}, opset=26)
    _check_reference(model, {"x": x})


def test_bitcast_is_a_view_feeding_kernels():
    # float32 bits as int32, then an integer op on them; float16 bits as int16
    x, h = _rand(3, 4), _rand(5, dtype=np.float16)
    nodes = [helper.make_node("BitCast", ["x"], ["b"], to=6),
             helper.make_node("BitwiseAnd", ["b", "mask"], ["y"]),
             helper.make_node("BitCast", ["h"], ["z"], to=5)]
    model = make_model(nodes, [("x", F32, x.shape), ("h", np.float16, h.shape)],
                       [("y", np.int32, x.shape), ("z", np.int16, h.shape)],
                       {"mask": np.asarray(0x7FFFFF, np.int32)}, opset=26)
    y, z = run_deploy(model, {"x": x, "h": h})
    np.testing.assert_array_equal(y, x.view(np.int32) & 0x7FFFFF)
    np.testing.assert_array_equal(z, h.view(np.int16))


def test_bitcast_width_mismatch_is_a_clear_error():
    node = helper.make_node("BitCast", ["x"], ["y"], to=7)  # float32 -> int64
    model = make_model([node], [("x", F32, (2,))], [("y", np.int64, (2,))], opset=26)
    with pytest.raises(DeployError, match="widths must match|same bit-width"):
        run_deploy(model, {"x": _rand(2)})
