"""The CLI tests' input: a random tiny biLM in the bilm-tf layout and the test module's `LINES`
as a text file."""

import pytest

from ..bilm.util import tiny_options, write_random_model


@pytest.fixture
def setup(tmp_path, request):
    """(folder, options file, weights file, input text file) of the module's `LINES`."""
    options, weights = write_random_model(tmp_path / "model", tiny_options(), seed=6)
    text = tmp_path / "input.txt"
    text.write_text("\n".join(request.module.LINES) + "\n", encoding="utf-8")
    return tmp_path, options, weights, text
