"""ScalarMix against a NumPy reference and central finite differences."""

from __future__ import annotations

import math
from itertools import combinations

import numpy
import pytest
from spacy.util import registry
from thinc.api import Adam, fix_random_seed

from spacy_elmo.layers.scalar_mix import LAYER_NORM_EPS, scalar_mix, softmax_weights_and_gamma

N_LAYERS = 3
WIDTH = 6


def reference_mix(X, weights, gamma, layer_norm=False):
    """gamma * sum_j softmax(weights)_j * h_j for one doc's (L, n, D) array, in float64."""
    X = numpy.asarray(X, dtype="float64")
    weights = numpy.asarray(weights, dtype="float64")
    s = numpy.exp(weights - weights.max())
    s /= s.sum()
    if layer_norm:
        mean = X.mean(axis=-1, keepdims=True)
        var = X.var(axis=-1, keepdims=True)
        X = (X - mean) / numpy.sqrt(var + LAYER_NORM_EPS)
    return gamma * numpy.einsum("l,lnd->nd", s, X)


def random_docs(lengths, dtype="float32", seed=0):
    rng = numpy.random.default_rng(seed)
    return [
        (rng.normal(size=(N_LAYERS, n, WIDTH)) * 3 + rng.normal(size=(N_LAYERS, 1, 1))).astype(
            dtype
        )
        for n in lengths
    ]


def to_float64(model):
    """Store the parameters in float64 so that the whole computation runs in float64."""
    for name in ("weights", "log_gamma"):
        model.set_param(name, model.get_param(name).astype("float64"))
    return model


@pytest.mark.parametrize("layer_norm", [False, True])
def test_forward_matches_numpy(layer_norm):
    weights, gamma = [0.5, -1.0, 2.0], 1.7
    model = scalar_mix(N_LAYERS, initial_weights=weights, gamma=gamma, layer_norm=layer_norm)
    Xs = random_docs([4, 7, 1])
    Ys = model.predict(Xs)
    assert len(Ys) == len(Xs)
    for X, Y in zip(Xs, Ys):
        assert Y.shape == (X.shape[1], WIDTH)
        assert Y.dtype == numpy.float32
        numpy.testing.assert_allclose(
            Y, reference_mix(X, weights, gamma, layer_norm), rtol=1e-5, atol=1e-5
        )


def test_default_weights_are_equal():
    model = scalar_mix(N_LAYERS)
    weights, gamma = softmax_weights_and_gamma(model)
    assert weights == pytest.approx([1 / N_LAYERS] * N_LAYERS)
    assert gamma == pytest.approx(1.0)
    (X,) = random_docs([5])
    (Y,) = model.predict([X])
    numpy.testing.assert_allclose(Y, X.mean(axis=0), rtol=1e-5, atol=1e-6)


def test_mix_weights_reports_softmax_and_gamma():
    model = scalar_mix(2, initial_weights=[0.0, math.log(3.0)], gamma=2.5)
    weights, gamma = softmax_weights_and_gamma(model)
    assert weights == pytest.approx([0.25, 0.75])
    assert gamma == pytest.approx(2.5)
    assert all(isinstance(w, float) for w in weights) and isinstance(gamma, float)


@pytest.mark.parametrize("layer_norm", [False, True])
def test_gradients_match_finite_differences(layer_norm):
    model = to_float64(
        scalar_mix(N_LAYERS, initial_weights=[0.3, -0.4, 0.8], gamma=1.3, layer_norm=layer_norm)
    )
    Xs = random_docs([3, 0, 2], dtype="float64", seed=1)
    rng = numpy.random.default_rng(2)
    targets = [rng.normal(size=(X.shape[1], WIDTH)) for X in Xs]

    def loss() -> float:
        return sum(float((Y * T).sum()) for Y, T in zip(model.predict(Xs), targets))

    Ys, backprop = model.begin_update(Xs)
    assert all(Y.dtype == numpy.float64 for Y in Ys)
    dXs = backprop(targets)
    eps = 1e-6

    for X, dX in zip(Xs, dXs):
        assert dX.shape == X.shape and dX.dtype == numpy.float64
        numpy.testing.assert_allclose(dX, numeric_gradient(X, loss, eps), rtol=1e-5, atol=1e-6)
    for name in ("weights", "log_gamma"):
        numeric = numeric_gradient(model.get_param(name), loss, eps)
        numpy.testing.assert_allclose(model.get_grad(name), numeric, rtol=1e-5, atol=1e-6)


def numeric_gradient(array: numpy.ndarray, loss, eps: float) -> numpy.ndarray:
    """d loss / d array by central differences, moving one value of `array` (in place) at a time."""
    numeric = numpy.zeros_like(array)
    for index in numpy.ndindex(*array.shape):
        original = array[index]
        array[index] = original + eps
        plus = loss()
        array[index] = original - eps
        minus = loss()
        array[index] = original
        numeric[index] = (plus - minus) / (2 * eps)
    return numeric


def test_gradients_accumulate_over_calls():
    model = scalar_mix(N_LAYERS, initial_weights=[0.1, 0.2, -0.3])
    Xs = random_docs([4])
    Ys, backprop = model.begin_update(Xs)
    backprop([numpy.ones_like(Y) for Y in Ys])
    once = model.get_grad("weights").copy()
    Ys, backprop = model.begin_update(Xs)
    backprop([numpy.ones_like(Y) for Y in Ys])
    numpy.testing.assert_allclose(model.get_grad("weights"), 2 * once, rtol=1e-6)


def test_not_trainable_leaves_parameters_unchanged():
    model = scalar_mix(N_LAYERS, initial_weights=[1.0, 0.0, -1.0], gamma=2.0, trainable=False)
    before = {name: model.get_param(name).copy() for name in ("weights", "log_gamma")}
    Xs = random_docs([4, 2])
    Ys, backprop = model.begin_update(Xs)
    dXs = backprop([numpy.ones_like(Y) for Y in Ys])
    assert any(numpy.abs(dX).sum() > 0 for dX in dXs)  # inputs still get gradients
    assert not model.has_grad("weights") and not model.has_grad("log_gamma")
    model.finish_update(Adam(0.1, L2=0.01))
    for name, value in before.items():
        numpy.testing.assert_array_equal(model.get_param(name), value)


@pytest.mark.parametrize("gamma", [2.0, 0.5])
def test_weight_decay_pulls_gamma_towards_one(gamma):
    model = scalar_mix(N_LAYERS, initial_weights=[1.0, 0.0, -1.0], gamma=gamma)
    weights_before, _ = softmax_weights_and_gamma(model)
    for name in ("weights", "log_gamma"):
        model.inc_grad(name, numpy.zeros_like(model.get_param(name)))
    model.finish_update(Adam(0.1, L2=0.01, L2_is_weight_decay=True))
    weights, new_gamma = softmax_weights_and_gamma(model)
    assert abs(new_gamma - 1.0) < abs(gamma - 1.0)
    assert min(new_gamma, gamma) >= 1.0 or max(new_gamma, gamma) <= 1.0  # no overshoot
    # the pre-softmax weights decay towards 0, i.e. the mix moves towards uniform
    assert max(weights) - min(weights) < max(weights_before) - min(weights_before)


def test_layer_dropout_only_in_training():
    # constant layers 1, 10, 100: the output value tells which layers were mixed
    X = numpy.stack([numpy.full((4, WIDTH), v, dtype="float32") for v in (1.0, 10.0, 100.0)])
    model = scalar_mix(N_LAYERS, layer_dropout=0.5)
    full = X.mean(axis=0)
    for _ in range(5):
        numpy.testing.assert_allclose(model.predict([X])[0], full, rtol=1e-6)
    subsets = {
        float(numpy.mean([(1.0, 10.0, 100.0)[j] for j in subset])): subset
        for size in range(1, N_LAYERS + 1)
        for subset in combinations(range(N_LAYERS), size)
    }
    fix_random_seed(0)
    seen = set()
    for _ in range(40):
        (Y,), backprop = model.begin_update([X])
        value = float(Y[0, 0])
        numpy.testing.assert_allclose(Y, value, rtol=1e-6)
        # float32 output: 37 (all three layers) comes out as 37.0000038
        match = [s for mean, s in subsets.items() if math.isclose(mean, value, rel_tol=1e-6)]
        assert match, f"output {value} is not the mean of any subset of layers"
        kept = match[0]
        seen.add(kept)
        (dX,) = backprop([numpy.ones_like(Y)])
        for j in range(N_LAYERS):
            expected = 1.0 / len(kept) if j in kept else 0.0
            numpy.testing.assert_allclose(dX[j], expected, rtol=1e-6)
    assert len(seen) > 2  # several different subsets were drawn, including some dropping


def test_empty_docs_and_empty_batch():
    model = scalar_mix(N_LAYERS, layer_norm=True)
    assert model.predict([]) == []
    Ys, backprop = model.begin_update([])
    assert Ys == [] and backprop([]) == []
    Xs = random_docs([0, 3, 0])
    Ys, backprop = model.begin_update(Xs)
    assert [Y.shape for Y in Ys] == [(0, WIDTH), (3, WIDTH), (0, WIDTH)]
    dXs = backprop([numpy.ones_like(Y) for Y in Ys])
    assert [dX.shape for dX in dXs] == [X.shape for X in Xs]
    Ys = model.predict(random_docs([0]))
    assert Ys[0].shape == (0, WIDTH)


@pytest.mark.parametrize("layer_norm", [False, True])
def test_docs_of_different_lengths_are_independent(layer_norm):
    model = scalar_mix(N_LAYERS, initial_weights=[0.2, 0.9, -0.5], layer_norm=layer_norm)
    Xs = random_docs([5, 1, 8, 2], seed=3)
    batch = model.predict(Xs)
    for X, Y in zip(Xs, batch):
        numpy.testing.assert_allclose(Y, model.predict([X])[0], rtol=1e-6, atol=1e-6)
    Ys, backprop = model.begin_update(Xs)
    dYs = [numpy.full_like(Y, 0.5) + Y for Y in Ys]
    dXs = backprop(dYs)
    for X, dY, dX in zip(Xs, dYs, dXs):
        _, single = model.begin_update([X])
        numpy.testing.assert_allclose(dX, single([dY])[0], rtol=1e-5, atol=1e-6)


def test_float16_storage_computes_in_float32():
    model = scalar_mix(N_LAYERS, initial_weights=[0.5, 0.0, -0.5], layer_norm=True)
    Xs = random_docs([3, 4], dtype="float16")
    Ys, backprop = model.begin_update(Xs)
    for X, Y in zip(Xs, Ys):
        assert Y.dtype == numpy.float32
        numpy.testing.assert_allclose(
            Y, reference_mix(X, [0.5, 0.0, -0.5], 1.0, True), rtol=1e-4, atol=1e-4
        )
    dXs = backprop([numpy.ones_like(Y) for Y in Ys])
    assert all(dX.dtype == numpy.float16 for dX in dXs)


def test_bad_arguments_and_inputs():
    with pytest.raises(ValueError, match="initial_weights"):
        scalar_mix(3, initial_weights=[0.0, 1.0])
    with pytest.raises(ValueError, match="gamma"):
        scalar_mix(3, gamma=0.0)
    with pytest.raises(ValueError, match="layer_dropout"):
        scalar_mix(3, layer_dropout=1.0)
    model = scalar_mix(3)
    with pytest.raises(ValueError, match="n_layers=3"):
        model.predict([numpy.zeros((2, 4, WIDTH), dtype="float32")])
    with pytest.raises(ValueError, match="same width"):
        model.predict([numpy.zeros((3, 4, 5), "f"), numpy.zeros((3, 4, 6), "f")])


def test_registered_for_configs_and_serialises():
    config = {
        "mix": {
            "@layers": "spacy_elmo.ScalarMix.v1",
            "n_layers": 3,
            "initial_weights": [1.0, 2.0, 3.0],
            "gamma": 0.5,
            "layer_norm": True,
        }
    }
    model = registry.resolve(config)["mix"]
    assert model.attrs["layer_norm"] is True
    assert registry.layers.get("spacy_elmo.ScalarMix.v1") is scalar_mix
    assert "spacy_elmo.ScalarMix.v1" not in registry.architectures  # a layer, no alias
    copy = scalar_mix(3).from_bytes(model.to_bytes())
    assert softmax_weights_and_gamma(copy)[0] == pytest.approx(softmax_weights_and_gamma(model)[0])
    assert softmax_weights_and_gamma(copy)[1] == pytest.approx(0.5)
    X = numpy.random.default_rng(0).normal(size=(3, 4, WIDTH)).astype("float32")
    expected = reference_mix(X, [1.0, 2.0, 3.0], 0.5, layer_norm=True)
    numpy.testing.assert_allclose(model.predict([X])[0], expected, rtol=1e-5, atol=1e-6)


@pytest.mark.gpu
@pytest.mark.parametrize("layer_norm", [False, True])
def test_same_result_on_gpu(layer_norm):
    cupy = pytest.importorskip("cupy")
    from thinc.util import has_cupy_gpu

    if not has_cupy_gpu:
        pytest.skip("no CUDA device for cupy")
    kwargs = {"initial_weights": [0.4, -0.2, 0.1], "gamma": 1.5, "layer_norm": layer_norm}
    cpu, gpu = scalar_mix(N_LAYERS, **kwargs), scalar_mix(N_LAYERS, **kwargs)
    gpu.to_gpu(0)
    Xs = random_docs([4, 0, 2])
    Ys, backprop = cpu.begin_update(Xs)
    gYs, gbackprop = gpu.begin_update([cupy.asarray(X) for X in Xs])
    dXs = backprop([Y + 1 for Y in Ys])
    gdXs = gbackprop([Y + 1 for Y in gYs])
    for a, b in zip(Ys + dXs, gYs + gdXs):
        numpy.testing.assert_allclose(a, cupy.asnumpy(b), rtol=1e-5, atol=1e-5)
    for name in ("weights", "log_gamma"):
        numpy.testing.assert_allclose(
            cpu.get_grad(name), cupy.asnumpy(gpu.get_grad(name)), rtol=1e-4, atol=1e-5
        )


@pytest.mark.parametrize("layer_norm", [False, True])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_predict_in_chunks_matches_the_whole_batch(monkeypatch, layer_norm, dtype):
    """Inference mixes groups of docs and slices of a long doc; every token gets what the
    whole-batch (training) arithmetic gives it, and the NumPy reference's value."""
    import spacy_elmo.layers.scalar_mix as scalar_mix_module

    monkeypatch.setattr(scalar_mix_module, "PREDICT_CHUNK_TOKENS", 8)
    weights = [0.3, -0.7, 1.1]
    model = scalar_mix(N_LAYERS, initial_weights=weights, gamma=1.3, layer_norm=layer_norm)
    # small docs grouped past the chunk, an empty one, one doc of exactly a chunk, one of 2.5
    Xs = random_docs([3, 0, 4, 2, 8, 1, 20, 5], dtype=dtype, seed=5)
    predicted = model.predict(Xs)
    whole, _ = model.begin_update(Xs)  # layer_dropout 0: the same maths in one piece
    assert len(predicted) == len(Xs)
    for X, Y, Y_whole in zip(Xs, predicted, whole):
        assert Y.shape == (X.shape[1], WIDTH) and Y.dtype == numpy.float32
        numpy.testing.assert_allclose(Y, Y_whole, rtol=1e-6, atol=1e-6)
        numpy.testing.assert_allclose(
            Y, reference_mix(X, weights, 1.3, layer_norm), rtol=1e-4, atol=1e-4
        )
