"""`BiLM`: ELMo's biLM with its files, state and tokens to ids (docs/MODEL.md §4-8).

Its modules are the reference's (`reference.py`); each call takes one of two routes, chosen
once at its top: the reference's forward pass where FAST_PATHS is off (SPACY_ELMO_REFERENCE=1
in the environment) or under `torch.autocast`; else the engine: the token layer of
`tokens.py`, then both LSTM stacks in `lstm.py`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy
import torch
from torch import nn

from ..description.chars import (
    BOS_CHAR_IDS,
    EOS_CHAR_IDS,
    PADDING_CHAR,
    add_boundaries,
    batch_to_ids,
    check_sentences,
)
from ..description.options import BiLMOptions
from . import lstm, reference, tokens
from .loading import BiLMFiles
from .reference import CharCNN, LstmStack, State
from .tokens import TokenCache

# The one speed switch: the engine (tokens.py, lstm.py), or the reference's forward pass.
FAST_PATHS = not lstm.environment_flag("SPACY_ELMO_REFERENCE")
DIRECTIONS = ("forward", "backward")


@dataclass
class BiLMOutput:
    """Outputs without sentence boundaries."""

    layers: torch.Tensor  # (L + 1, batch, time, 2P), zero at padded positions
    mask: torch.Tensor  # (batch, time), True where a token is


@dataclass
class BiLMActivations:
    """Outputs with `<S>`/`</S>` at 0 and n + 1 (what language-model training needs)."""

    token_embeddings: torch.Tensor  # (batch, time + 2, P)
    forward: list[torch.Tensor]  # L x (batch, time + 2, P), forward LSTM outputs
    backward: list[torch.Tensor]  # L x (batch, time + 2, P), backward outputs, original order
    mask: torch.Tensor  # (batch, time + 2)
    lengths: torch.Tensor  # (batch,) tokens per sentence, boundaries excluded


class BiLM(BiLMFiles, nn.Module):
    """ELMo's bidirectional language model, numerically equal to bilm-tf / AllenNLP.

    With `stateful=False` (the default) every sentence starts from a zero LSTM state, so its
    vectors do not depend on the batch. `stateful=True` carries each batch row's final state
    into the same row of the next call, as AllenNLP and bilm-tf do (docs/MODEL.md §8).
    """

    # The bfloat16 kernels of each layer under `quantize.set_quantize`, else None.
    bf16_layers: list | None = None

    def __init__(
        self, options: BiLMOptions, stateful: bool = False, *, initialise: bool = True
    ) -> None:
        """`initialise=False` leaves the large parameters unwritten and not yet laid out for
        the batched step: for weights about to be replaced (loading, which lays them out once
        they are in), so that their memory is never touched."""
        super().__init__()
        self.options = options
        self.char_cnn = CharCNN(options)  # the modules of `reference.ReferenceBiLM`
        self.forward_lstm = LstmStack(options)
        self.backward_lstm = LstmStack(options)
        self.stateful = stateful
        # At inference the char-CNN vectors of the tokens seen last (`tokens.TokenCache`).
        self.token_cache = TokenCache()
        # Counts the writes into the weights that torch's version counters miss (`weights_changed`)
        self.weights_generation = 0
        self._carried_states: dict[str, list[State]] = {}
        # How tokens become ids: None is ELMo's UTF-8 byte mapping (`description/chars.py`); an
        # ELMoForManyLangs model carries its dictionaries (`weights.efml_lexicon.EfmlLexicon`).
        self.lexicon = None
        # The id of the padding character after the end of a word (ELMo's 260, shifted; an
        # ELMoForManyLangs model's `<pad>` is set from its dictionary).
        self.padding_id = PADDING_CHAR + 1
        if initialise:  # random weights (`loading.BiLMFiles.reset_parameters`)
            lstm.lay_out((self.forward_lstm, self.backward_lstm))
            self.reset_parameters()

    @property
    def quantize(self) -> str | None:
        """How the LSTM products run: "bf16" in bfloat16 (`quantize.set_quantize`), None in
        float32; held by `bf16_layers`."""
        return None if self.bf16_layers is None else "bf16"

    # ------------------------------------------------------------------ the forward pass
    def forward(self, char_ids: torch.Tensor) -> BiLMOutput:
        """All L + 1 layers for (batch, time, 50) char ids, boundaries removed."""
        char_ids = self._checked(char_ids)
        states = self._states_in(char_ids.shape[0])
        if self._fast(char_ids) and not self._records_autograd():
            # The engine at inference writes every output row once, straight into the layers.
            run = self._run(char_ids, states, training=False)
            return BiLMOutput(layers=lstm.scatter_layers(run), mask=run.mask[:, 2:])
        acts = self._activations(char_ids, states)
        layers = reference.stack_layers(
            acts.token_embeddings, acts.forward, acts.backward, acts.lengths
        )
        return BiLMOutput(layers=layers, mask=acts.mask[:, 2:])

    def activations(self, char_ids: torch.Tensor) -> BiLMActivations:
        """Run the biLM on (batch, time, 50) char ids from `batch_to_ids` (no boundaries)."""
        char_ids = self._checked(char_ids)
        return self._activations(char_ids, self._states_in(char_ids.shape[0]))

    def _activations(
        self, char_ids: torch.Tensor, states: tuple[list[State], list[State]]
    ) -> BiLMActivations:
        if not self._fast(char_ids):
            tokens, forward, backward, lengths, finals = reference.run(
                self, char_ids, states, self._boundary_ids()
            )
            if self.stateful:
                self._states_out(finals)
            positions = torch.arange(tokens.shape[1], device=tokens.device)
            mask = positions[None, :] < lengths[:, None]
            return BiLMActivations(tokens, forward, backward, mask, lengths - 2)
        run = self._run(char_ids, states, self._records_autograd())
        forward, backward = lstm.padded_outputs(run)
        return BiLMActivations(run.tokens, forward, backward, run.mask, run.lengths)

    def _fast(self, char_ids: torch.Tensor) -> bool:
        """Whether this call takes the engine (else the reference's forward pass)."""
        return FAST_PATHS and not torch.is_autocast_enabled(char_ids.device.type)

    def _records_autograd(self) -> bool:
        """Whether autograd records this call: the engine's training route. The parameters are
        only looked at where autograd is on (listing them takes longer than some of the steps
        of a one-sentence batch)."""
        return torch.is_grad_enabled() and any(p.requires_grad for p in self.parameters())

    def _checked(self, char_ids: torch.Tensor) -> torch.Tensor:
        """(batch, time, W) ids on the biLM's device; ValueError for another shape, or an
        all-zero (padding) row before a token."""
        width = len(self._boundary_ids()[0])
        if char_ids.dim() != 3 or char_ids.shape[-1] != width:
            raise ValueError(
                f"char_ids must have shape (batch, time, {width}), got {tuple(char_ids.shape)}"
            )
        char_ids = char_ids.to(self.char_cnn.char_embedding.weight.device)
        token_mask = (char_ids > 0).any(dim=-1)  # (batch, time)
        positions = torch.arange(char_ids.shape[1], device=char_ids.device)
        if not torch.equal(token_mask, positions[None, :] < token_mask.sum(dim=1)[:, None]):
            raise ValueError("char_ids has an all-zero (padding) row before a token")
        return char_ids

    def _run(
        self, char_ids: torch.Tensor, states: tuple[list[State], list[State]], training: bool
    ) -> lstm.PackedRun:
        """The engine: token vectors with `<S>`/`</S>` (tokens.py), then both LSTM stacks
        (lstm.py); in stateful mode the final states kept."""
        with_boundaries, lengths = add_boundaries(char_ids, *self._boundary_ids())
        vectors = self._token_vectors(with_boundaries, training)  # (batch, time + 2, P)
        stacks = (self.forward_lstm, self.backward_lstm)
        run = lstm.run(stacks, vectors, lengths, states, training, self.bf16_layers)
        if self.stateful:
            self._states_out(run.final_states, run.packing.unsorted_indices)
        return run

    def steps_release_gil(self) -> bool:
        """Whether the LSTM steps at inference run as one call that releases the GIL (so that
        another Python thread runs beside them: the `elmo` component's `overlap`)."""
        weight = self.forward_lstm.layers[0].recurrent_weight
        return FAST_PATHS and lstm.compiled_loop_applies(weight)

    def token_embeddings(self, char_ids: torch.Tensor) -> torch.Tensor:
        """Context-insensitive vectors (..., P) for char ids (..., 50); zero where no token.
        The char CNN runs once per distinct token."""
        if not self._fast(char_ids):
            return reference.token_vectors(self.char_cnn, char_ids)
        return self._token_vectors(char_ids, self._records_autograd())

    def _token_vectors(self, char_ids: torch.Tensor, training: bool) -> torch.Tensor:
        """The engine's token layer (tokens.py), reading the token cache at inference."""
        version = (self.weights_generation, self.quantize)
        return tokens.token_vectors(
            self.char_cnn, char_ids, self.padding_id, training, self.token_cache, version
        )

    # ------------------------------------------------------------------ state
    def reset_states(self) -> None:
        """Forget the carried LSTM states (stateful mode); the next call starts from zeros."""
        self._carried_states = {}

    def _states_in(self, batch: int) -> tuple[list[State], list[State]]:
        """Each direction's initial (h, c) per layer, one row per sentence: zeros, or in stateful
        mode the states carried into those rows (§8)."""
        weight = self.char_cnn.char_embedding.weight  # the biLM's dtype and device
        directions = []
        for direction, stack in zip(DIRECTIONS, (self.forward_lstm, self.backward_lstm)):
            carried = self._carried_states.get(direction) if self.stateful else None
            states = []
            for index, cell in enumerate(stack.layers):
                h = weight.new_zeros(batch, cell.hidden_dim)
                c = weight.new_zeros(batch, cell.cell_dim)
                if carried is not None:
                    stored_h, stored_c = carried[index]
                    rows = min(batch, stored_h.shape[0])
                    h[:rows] = stored_h[:rows]
                    c[:rows] = stored_c[:rows]
                states.append((h, c))
            directions.append(states)
        return directions[0], directions[1]

    def _states_out(
        self, final_states: Sequence[list[State]], order: torch.Tensor | None = None
    ) -> None:
        """Keep each row's final state at its row index for the next call (stateful mode; rows
        in the packed order where `order`, the unsorted indices, is given); rows beyond the
        batch keep theirs."""
        for direction, finals in zip(DIRECTIONS, final_states):
            carried = self._carried_states.get(direction)
            updated = []
            for index, (h, c) in enumerate(finals):
                if order is not None:
                    h, c = h[order], c[order]
                h, c = h.detach(), c.detach()
                if carried is not None:  # the rows beyond this batch, if any
                    h = torch.cat([h, carried[index][0][len(h) :]])
                    c = torch.cat([c, carried[index][1][len(c) :]])
                updated.append((h, c))
            self._carried_states[direction] = updated

    # ------------------------------------------------------------------ tokens to ids
    def set_lexicon(self, lexicon) -> None:
        """Use an ELMoForManyLangs model's dictionaries to turn tokens into ids."""
        if self.options.char_vocabulary != "dictionary":
            raise ValueError("a lexicon is for a biLM with 'char_vocabulary': 'dictionary'")
        lexicon.check_sizes(self.options, "lexicon")
        self.lexicon = lexicon
        self.padding_id = lexicon.padding_id

    def batch_to_ids(self, sentences: Sequence[Sequence[str]]) -> torch.Tensor:
        """Ids of a batch of pre-tokenised sentences, (batch, max_tokens, row width), for this
        model: ELMo's UTF-8 bytes (`chars.batch_to_ids`), or an ELMoForManyLangs model's
        character and word dictionaries."""
        if self.lexicon is not None:
            return self.lexicon.batch_to_ids(sentences)
        self._check_byte_model()
        return batch_to_ids(sentences)

    def _boundary_ids(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The id rows of the sentence boundaries `<S>` and `</S>` (or `<bos>` and `<eos>`)."""
        if self.lexicon is not None:
            return self.lexicon.bos_ids, self.lexicon.eos_ids
        self._check_byte_model()
        return BOS_CHAR_IDS, EOS_CHAR_IDS

    def _check_byte_model(self) -> None:
        if self.options.char_vocabulary != "bytes":
            raise ValueError(
                "this biLM reads characters through a dictionary but has none: load it with "
                "BiLM.from_elmoformanylangs or BiLM.load, or call set_lexicon"
            )

    @torch.inference_mode()
    def embed(
        self, sentences: Sequence[Sequence[str]], batch_size: int = 64
    ) -> list[numpy.ndarray]:
        """One float32 array (L + 1, n_i, 2P) per pre-tokenised sentence, in input order.

        In the default mode sentences are batched longest first; in stateful mode they are
        batched in input order, as the carried states depend on the row a sentence lands in.
        """
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
        # A biLM that reads characters through a dictionary it lacks: `forward` says so
        to_ids = self.lexicon.batch_to_ids if self.lexicon is not None else batch_to_ids
        sentences = check_sentences(sentences)
        order = list(range(len(sentences)))
        if not self.stateful:  # longest first; a stable sort keeps equal lengths in order
            order.sort(key=list(map(len, sentences)).__getitem__, reverse=True)
        results: list[numpy.ndarray | None] = [None] * len(sentences)
        for start in range(0, len(order), batch_size):
            indices = order[start : start + batch_size]
            batch = list(map(sentences.__getitem__, indices))  # no frame of ours between calls
            layers = self(to_ids(batch)).layers.float().cpu().numpy()
            for row, index in enumerate(indices):
                n = len(sentences[index])
                results[index] = numpy.ascontiguousarray(layers[:, row, :n])
            del layers  # not alive while the next batch runs
        return results  # type: ignore[return-value]

    # ------------------------------------------------------------------ when the weights change
    @property
    def token_cache_size(self) -> int:
        """How many distinct tokens' char-CNN vectors are kept at inference (0: none)."""
        return self.token_cache.max_size

    @token_cache_size.setter
    def token_cache_size(self, size: int) -> None:
        """A new, empty token cache of `size` tokens."""
        self.token_cache = TokenCache(size)

    def weights_changed(self) -> None:
        """Say that the weights were written where torch's version counters do not see it
        (through `.data`, as the fine-tuning step does, `layers.bilm_wrapper.BiLMShim`): what
        was computed from the old weights is dropped: the weights' copies of `quantize` now,
        and the token cache, keyed by `weights_generation`, at its next read."""
        self.weights_generation += 1
        if self.bf16_layers is not None:  # the bfloat16 copies of the weights made anew
            self.bf16_layers = [lstm.Bf16Layer() for _ in self.bf16_layers]

    def __setstate__(self, state: dict) -> None:
        """After copy and pickle: the weights laid out again (`lstm.lay_out`: copying
        gives every weight its own memory)."""
        super().__setstate__(state)
        lstm.lay_out((self.forward_lstm, self.backward_lstm))

    def _apply(self, fn, recurse: bool = True) -> BiLM:
        """After `.to()` another device or dtype (`nn.Module._apply` gives every weight its own
        memory): the weights laid out again, so the batched step keeps using views of them."""
        super()._apply(fn, recurse)
        lstm.lay_out((self.forward_lstm, self.backward_lstm))
        return self
