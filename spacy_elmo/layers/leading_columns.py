"""The first columns of a concatenation: one part of it, read back after the concatenation."""

from functools import partial
from typing import Optional

from thinc.api import Model
from thinc.types import Floats2d


def leading_columns(source: Model) -> Model[Floats2d, Floats2d]:
    """The first nO columns of the input, nO being `source`'s width; their gradient, zero-padded.

    nO is read from `source` when the layer is initialized, so it may be inferred then.
    """
    width = source.get_dim("nO") if source.has_dim("nO") else None
    return Model(
        "leading_columns",
        forward,
        init=partial(init, source),
        dims={"nO": width},
    )


def init(
    source: Model, model: Model, X: Optional[Floats2d] = None, Y: Optional[Floats2d] = None
) -> None:
    if not model.has_dim("nO"):
        model.set_dim("nO", source.get_dim("nO"))


def forward(model: Model[Floats2d, Floats2d], X: Floats2d, is_train: bool):
    n_columns = model.get_dim("nO")
    total = X.shape[1]
    if total < n_columns:
        raise ValueError(f"leading_columns: the input has {total} columns, fewer than {n_columns}")

    def backprop(dY: Floats2d) -> Floats2d:
        dX = model.ops.alloc2f(dY.shape[0], total)
        dX[:, :n_columns] = dY
        return dX

    return X[:, :n_columns], backprop
