"""Dropout at a rate of its own, which spaCy's training dropout does not overwrite."""

from thinc.api import Model
from thinc.types import Floats2d


def own_dropout(rate: float) -> Model[Floats2d, Floats2d]:
    """Inverted dropout at `rate` in training, identity at inference.

    The rate is kept in attrs["own_dropout_rate"], not "dropout_rate": spaCy's update sets
    every layer's "dropout_rate" to `training.dropout`.
    """
    return Model("own_dropout", forward, attrs={"own_dropout_rate": rate})


def forward(model: Model[Floats2d, Floats2d], X: Floats2d, is_train: bool):
    rate = model.attrs["own_dropout_rate"]
    if not is_train or rate == 0.0:
        return X, lambda dY: dY
    mask = model.ops.get_dropout_mask(X.shape, rate)

    def backprop(dY: Floats2d) -> Floats2d:
        return dY * mask

    return X * mask, backprop
