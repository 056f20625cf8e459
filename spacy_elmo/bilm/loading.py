"""Where a biLM's weights come from: the `BiLM` constructors and writers of every weights format
(the readers themselves are in `spacy_elmo.weights`; this is the one module of the package that
calls them), and the random initialisation. `model.BiLM` inherits them: `BiLM.from_allennlp`,
`BiLM.load`, `BiLM.save`, `BiLM.reset_parameters`, ..."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TypeVar

import torch
from torch import nn

from ..description.options import BiLMOptions
from ..weights.efml_lexicon import EfmlLexicon
from ..weights.elmoformanylangs import read_elmoformanylangs
from ..weights.layouts import (
    read_allennlp,
    read_saved,
    read_saved_options,
    saved_weights,
    write_allennlp,
    write_saved,
)
from ..weights.sources import BiLMSource, resolve_source
from . import lstm

Loaded = TypeVar("Loaded", bound="BiLMFiles")  # the class a constructor is called on: `BiLM`


class BiLMFiles:
    """The file side of `model.BiLM`, and its random weights (a mixin: `cls` is the BiLM
    class)."""

    @classmethod
    def from_allennlp(
        cls, options_file: str | Path, weight_file: str | Path, stateful: bool = False
    ) -> Loaded:
        """Load the published bilm-tf/AllenNLP files (options.json + weights hdf5)."""
        options, state_dict = read_allennlp(options_file, weight_file)
        return cls._from_state(options, state_dict, stateful)

    @classmethod
    def from_elmoformanylangs(cls, model_dir: str | Path, stateful: bool = False) -> Loaded:
        """Load an ELMoForManyLangs model directory (config.json, architecture JSON, char.dic,
        word.dic, token_embedder.pkl, encoder.pkl); the .pkl files are read without running
        code (`weights/elmoformanylangs.py`)."""
        options, state_dict, lexicon = read_elmoformanylangs(model_dir)
        bilm = cls._from_state(options, state_dict, stateful)
        bilm.set_lexicon(lexicon)
        return bilm

    def to_allennlp(self, options_file: str | Path, weight_file: str | Path) -> None:
        """Write options.json and the weights hdf5 in the bilm-tf layout."""
        if self.options.char_vocabulary != "bytes":
            raise ValueError(
                "an ELMoForManyLangs biLM (character dictionary, word embedding) has no "
                "bilm-tf hdf5 layout; save it with BiLM.save"
            )
        write_allennlp(self.options, self.state_dict(), options_file, weight_file)

    def save(self, directory: str | Path) -> None:
        """Save as JSON options plus safetensors weights (no pickle); an ELMoForManyLangs
        model's dictionaries go to `lexicon.json`."""
        if self.lexicon is not None:
            self.lexicon.save(directory)
        else:
            self._check_byte_model()
        write_saved(self.options, self.state_dict(), directory)

    @classmethod
    def load(
        cls,
        source: str | Path | BiLMSource | None = "bundled",
        stateful: bool = False,
        options: str | Path | None = None,
        weights: str | Path | None = None,
    ) -> Loaded:
        """Load a biLM however it is named: 'bundled' (the English biLM that ships in the
        package), a published name, a directory written by `save`, a `spacy-elmo pretrain` run
        directory, a bilm-tf/AllenNLP folder, an ELMoForManyLangs directory, or `options` +
        `weights` files (`weights.resolve_source`); or a source resolved already."""
        if not isinstance(source, BiLMSource):
            source = resolve_source(source, options, weights)
        if source.kind == "allennlp":
            return cls.from_allennlp(source.options_file, source.weights_file, stateful=stateful)
        if source.kind == "elmoformanylangs":
            return cls.from_elmoformanylangs(source.path, stateful=stateful)
        saved = read_saved_options(source.path)  # a directory written by `save`
        weights_path = saved_weights(source.path, saved)  # before a model of that size is built
        bilm = cls(saved, stateful=stateful, initialise=False)
        shapes = {key: tuple(value.shape) for key, value in bilm.state_dict().items()}
        bilm._assign(read_saved(weights_path, shapes))
        if saved.char_vocabulary == "dictionary":
            bilm.set_lexicon(EfmlLexicon.load(source.path))
        return bilm

    @classmethod
    def _from_state(
        cls, options: BiLMOptions, state_dict: dict[str, torch.Tensor], stateful: bool
    ) -> Loaded:
        """A float32 BiLM whose parameters are the given tensors (no second copy of them)."""
        bilm = cls(options, stateful=stateful, initialise=False)
        bilm._assign(state_dict)
        return bilm

    def _assign(self, state_dict: dict[str, torch.Tensor]) -> None:
        """Make the tensors of `state_dict`, in float32, this biLM's parameters."""
        state_dict = {k: v.to(torch.float32).contiguous() for k, v in state_dict.items()}
        self.load_state_dict(state_dict, assign=True)
        lstm.lay_out((self.forward_lstm, self.backward_lstm))

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Random initialisation in the spirit of bilm-tf's training defaults."""
        cnn = self.char_cnn
        nn.init.uniform_(cnn.char_embedding.weight, -1.0, 1.0)
        cnn.char_embedding.weight[0].zero_()
        for conv in cnn.convolutions:
            width = conv.kernel_size[0]
            std = math.sqrt(1.0 / (width * self.options.char_embedding_dim))
            nn.init.normal_(conv.weight, std=std)
            conv.bias.zero_()
        width = self.options.n_filters
        for highway in cnn.highways:
            nn.init.normal_(highway.weight, std=math.sqrt(1.0 / width))
            highway.bias[:width].zero_()  # transform
            highway.bias[width:].fill_(-2.0)  # carry gate: start close to the identity
        if cnn.word_embedding is not None:
            nn.init.uniform_(cnn.word_embedding.weight, -0.25, 0.25)
            cnn.word_embedding.weight[0].zero_()
        if isinstance(cnn.projection, nn.Linear):
            nn.init.normal_(cnn.projection.weight, std=math.sqrt(1.0 / width))
            cnn.projection.bias.zero_()
        for stack in (self.forward_lstm, self.backward_lstm):
            for cell in stack.layers:
                bound = 1.0 / math.sqrt(cell.cell_dim)
                for weight in (cell.input_weight, cell.recurrent_weight, cell.projection_weight):
                    if weight is not None:
                        # Drawn in the (out, in) order whatever the layout (some weights are
                        # transposed views), so that a seed's weights do not depend on it.
                        weight.copy_(torch.empty(weight.shape).uniform_(-bound, bound))
                cell.bias.zero_()
