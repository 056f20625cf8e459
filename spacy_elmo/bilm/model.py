"""`BiLM`: the reference biLM (reference.py) with its files, state, tokens to ids, and the fast
routes to the same numbers (docs/MODEL.md §4-8).

The route is taken once per call: the reference's forward pass where the fast paths are off
(`fast_paths.ENABLED`) or under `torch.autocast`; else the packed route, whose LSTM steps run as
one fused autograd node where autograd records (`fused.py`) and in place at inference
(`lstm.py`, `compiled_steps.py`), its token vectors computed once per distinct token
(`fast_paths.char_cnn`, `token_cache.py`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy
import torch
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence, pad_packed_sequence

from ..description.chars import (
    BOS_CHAR_IDS,
    EOS_CHAR_IDS,
    PADDING_CHAR,
    batch_to_ids,
    check_sentences,
)
from ..description.options import BiLMOptions
from . import fast_paths
from .loading import BiLMFiles
from .lstm import run_stacks
from .reference import ReferenceBiLM, State, token_vectors
from .token_cache import TOKEN_CACHE_SIZE, TokenCache

DIRECTIONS = ("forward", "backward")


@dataclass
class BiLMOutput:
    """Outputs without sentence boundaries."""

    layers: torch.Tensor  # (L + 1, batch, time, 2P), zero at padded positions
    mask: torch.Tensor  # (batch, time), True where a token is


@dataclass
class PackedRun:
    """What one run of both LSTM stacks leaves, in the packed (length-sorted) layout."""

    tokens: torch.Tensor  # (batch, time + 2, P) token vectors with <S>/</S>
    outputs: list[list[torch.Tensor]]  # per direction, per layer: packed (N, P)
    batch_sizes: torch.Tensor  # of the packing, as `pack_padded_sequence` gives it
    sorted_indices: torch.Tensor
    unsorted_indices: torch.Tensor
    lengths: torch.Tensor  # (batch,) tokens per sentence, boundaries excluded
    cpu_lengths: torch.Tensor  # (batch,) lengths + 2 on the CPU, for packing
    mask: torch.Tensor  # (batch, time + 2)
    reverse_index: torch.Tensor  # (batch, time + 2): the backward LM's input positions


@dataclass
class BiLMActivations:
    """Outputs with `<S>`/`</S>` at 0 and n + 1 (what language-model training needs)."""

    token_embeddings: torch.Tensor  # (batch, time + 2, P)
    forward: list[torch.Tensor]  # L x (batch, time + 2, P), forward LSTM outputs
    backward: list[torch.Tensor]  # L x (batch, time + 2, P), backward outputs, original order
    mask: torch.Tensor  # (batch, time + 2)
    lengths: torch.Tensor  # (batch,) tokens per sentence, boundaries excluded


class BiLM(BiLMFiles, ReferenceBiLM):
    """ELMo's bidirectional language model, numerically equal to bilm-tf / AllenNLP.

    With `stateful=False` (the default) every sentence starts from a zero LSTM state, so its
    vectors do not depend on the batch. `stateful=True` carries each batch row's final state
    into the same row of the next call, as AllenNLP and bilm-tf do (docs/MODEL.md §8).
    """

    # "bf16" where the LSTM products run in bfloat16 (`quantize.set_quantize`), else None.
    quantize: str | None = None
    # What makes each layer's products at inference (`lstm.run_stacks`): float32 where None,
    # bfloat16 under `quantize.set_quantize`.
    layer_products: list | None = None

    def __init__(
        self,
        options: BiLMOptions,
        stateful: bool = False,
        token_cache_size: int = TOKEN_CACHE_SIZE,
        *,
        initialise: bool = True,
    ) -> None:
        """`initialise=False` leaves the large parameters unwritten and not yet laid out for
        the batched step: for weights about to be replaced (loading, which lays them out once
        they are in), so that their memory is never touched."""
        super().__init__(options)  # the char CNN and both LSTM stacks (reference.py)
        self.stateful = stateful
        # At inference the char-CNN vectors of the tokens seen last (a fast path).
        self.token_cache = TokenCache(token_cache_size)
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
            fast_paths.lay_out((self.forward_lstm, self.backward_lstm))
            self.reset_parameters()

    # ------------------------------------------------------------------ the forward pass
    def forward(self, char_ids: torch.Tensor) -> BiLMOutput:
        """All L + 1 layers for (batch, time, 50) char ids, boundaries removed."""
        char_ids = self._checked(char_ids)
        if not self._fast(char_ids):
            states = self._states_in(char_ids.shape[0])
            layers, finals = super().forward(char_ids, states, self._boundary_ids())
            self._states_out(finals)
            return BiLMOutput(layers=layers, mask=(char_ids > 0).any(dim=-1))
        training = fast_paths.records_autograd(modules=(self,))
        run = self._run(char_ids, training)
        mask = _token_mask(run.lengths, run.tokens.shape[1] - 2)  # (batch, time)
        if not training:  # the same layers, without the autograd route's copies
            layers = fast_paths.scatter_layers(
                run.tokens, run.outputs, run.lengths, run.cpu_lengths, run.reverse_index, mask
            )
            return BiLMOutput(layers=layers, mask=mask)
        acts = self._activations(run)
        layers = [torch.cat([acts.token_embeddings, acts.token_embeddings], dim=-1)]
        layers += [torch.cat(pair, dim=-1) for pair in zip(acts.forward, acts.backward)]
        stacked = torch.stack(layers)[:, :, 1:-1]  # (L + 1, batch, time, 2P)
        return BiLMOutput(layers=stacked * mask[None, :, :, None], mask=mask)

    def activations(self, char_ids: torch.Tensor) -> BiLMActivations:
        """Run the biLM on (batch, time, 50) char ids from `batch_to_ids` (no boundaries)."""
        char_ids = self._checked(char_ids)
        if not self._fast(char_ids):
            states = self._states_in(char_ids.shape[0])
            tokens, forward, backward, lengths, finals = self.run(
                char_ids, states, self._boundary_ids()
            )
            self._states_out(finals)
            positions = torch.arange(tokens.shape[1], device=tokens.device)
            mask = positions[None, :] < lengths[:, None]
            return BiLMActivations(tokens, forward, backward, mask, lengths - 2)
        training = fast_paths.records_autograd(modules=(self,))
        return self._activations(self._run(char_ids, training))

    def _fast(self, char_ids: torch.Tensor) -> bool:
        """Whether this call takes the fast routes (else the reference's forward pass)."""
        return fast_paths.ENABLED and not torch.is_autocast_enabled(char_ids.device.type)

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

    def _run(self, char_ids: torch.Tensor, training: bool) -> PackedRun:
        """Token vectors and the packed output of every LSTM layer of both directions."""
        bos_ids, eos_ids = self._boundary_ids()
        batch, time, _ = char_ids.shape
        device = char_ids.device
        lengths = (char_ids > 0).any(dim=-1).sum(dim=1)  # (batch,)
        positions = torch.arange(time + 2, device=device)

        # Add <S> at 0 and </S> right after each sentence's last token.
        bounded = char_ids.new_zeros((batch, time + 2, char_ids.shape[-1]))
        bounded[:, 1 : time + 1] = char_ids
        bounded[:, 0] = torch.tensor(bos_ids, device=device)
        bounded[torch.arange(batch, device=device), lengths + 1] = torch.tensor(
            eos_ids, device=device
        )
        bounded_lengths = lengths + 2
        mask = positions[None, :] < bounded_lengths[:, None]  # (batch, time + 2)

        tokens = self.token_embeddings(bounded)  # (batch, time + 2, P)
        # The backward LM reads each sentence from </S> to <S>: reverse within its length.
        reverse_index = torch.where(
            mask, bounded_lengths[:, None] - 1 - positions[None, :], positions[None, :]
        )
        # Both directions have the same lengths, hence the same packing: step them together.
        stacks = (self.forward_lstm, self.backward_lstm)
        cpu_lengths = bounded_lengths.cpu()
        packed = [
            pack_padded_sequence(inputs, cpu_lengths, batch_first=True, enforce_sorted=False)
            for inputs in (tokens, _gather_time(tokens, reverse_index))
        ]  # forward and backward inputs, each packed (N, P), N = sum of bounded_lengths
        sorted_indices, unsorted_indices = packed[0].sorted_indices, packed[0].unsorted_indices
        states = [
            [(h[sorted_indices], c[sorted_indices]) for h, c in direction]
            for direction in self._states_in(batch)
        ]
        outputs, final_states = run_stacks(
            stacks,
            [p.data for p in packed],
            packed[0].batch_sizes.tolist(),
            states,
            training,
            self.layer_products,
        )  # per direction, per layer: packed outputs (N, P) and final (h, c)
        self._states_out(final_states, unsorted_indices)
        return PackedRun(
            tokens=tokens,
            outputs=outputs,
            batch_sizes=packed[0].batch_sizes,
            sorted_indices=sorted_indices,
            unsorted_indices=unsorted_indices,
            lengths=lengths,
            cpu_lengths=cpu_lengths,
            mask=mask,
            reverse_index=reverse_index,
        )

    def token_embeddings(self, char_ids: torch.Tensor) -> torch.Tensor:
        """Context-insensitive vectors (..., P) for char ids (..., 50); zero where no token.

        The char CNN runs once per distinct token in the batch.
        """
        if not self._fast(char_ids):
            return token_vectors(self.char_cnn, char_ids)
        mask = (char_ids > 0).any(dim=-1)
        output = char_ids.new_zeros(
            (*char_ids.shape[:-1], self.options.projection_dim),
            dtype=self.char_cnn.char_embedding.weight.dtype,
        )
        if mask.any():
            distinct, inverse = fast_paths.distinct_rows(char_ids[mask])  # (k, 50), (n,)
            inference = not fast_paths.records_autograd(modules=(self.char_cnn,))
            if inference and self.token_cache.max_size > 0:  # tokens seen before: token_cache.py
                version = (self.weights_generation, self.quantize)
                vectors = self.token_cache.char_cnn(
                    self._char_cnn, self.char_cnn.parameters(), distinct, version
                )
            else:
                vectors = self._char_cnn(distinct)  # (k, P)
            output[mask] = vectors[inverse]
        return output

    def _char_cnn(self, char_ids: torch.Tensor) -> torch.Tensor:
        """The char CNN's (n, P) vectors of (n, W) distinct ids, on the fast route."""
        return fast_paths.char_cnn(self.char_cnn, char_ids, self.padding_id)

    def _activations(self, run: PackedRun) -> BiLMActivations:
        """Each layer's padded outputs, the backward ones in the original word order."""
        time = run.tokens.shape[1]
        outputs = {}
        for direction, layer_outputs in zip(DIRECTIONS, run.outputs):
            padded = [
                pad_packed_sequence(
                    PackedSequence(
                        output, run.batch_sizes, run.sorted_indices, run.unsorted_indices
                    ),
                    batch_first=True,
                    total_length=time,
                )[0]
                for output in layer_outputs
            ]  # L x (batch, time + 2, P)
            if direction == "backward":
                padded = [_gather_time(output, run.reverse_index) for output in padded]
            outputs[direction] = padded
        return BiLMActivations(
            token_embeddings=run.tokens,
            forward=outputs["forward"],
            backward=outputs["backward"],
            mask=run.mask,
            lengths=run.lengths,
        )

    # ------------------------------------------------------------------ state
    def reset_states(self) -> None:
        """Forget the carried LSTM states (stateful mode); the next call starts from zeros."""
        self._carried_states = {}

    def _states_in(self, batch: int) -> tuple[list[State], list[State]]:
        """Each direction's initial (h, c) per layer, one row per sentence: zeros, or in stateful
        mode the states carried into those rows (§8)."""
        dtype = self.char_cnn.char_embedding.weight.dtype
        device = self.char_cnn.char_embedding.weight.device
        directions = []
        for direction, stack in zip(DIRECTIONS, (self.forward_lstm, self.backward_lstm)):
            carried = self._carried_states.get(direction) if self.stateful else None
            states = []
            for index, cell in enumerate(stack.layers):
                h = torch.zeros(batch, cell.hidden_dim, device=device, dtype=dtype)
                c = torch.zeros(batch, cell.cell_dim, device=device, dtype=dtype)
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
        """In stateful mode, store each row's final state at its row index (rows in the packed
        order where `order`, the unsorted indices, is given); rows beyond the batch keep
        theirs."""
        if not self.stateful:
            return
        for direction, finals in zip(DIRECTIONS, final_states):
            carried = self._carried_states.get(direction)
            updated = []
            for index, (h, c) in enumerate(finals):
                if order is not None:
                    h, c = h[order], c[order]
                h, c = h.detach(), c.detach()
                if carried is not None and carried[index][0].shape[0] > h.shape[0]:
                    old_h, old_c = carried[index]
                    h = torch.cat([h, old_h[h.shape[0] :]])
                    c = torch.cat([c, old_c[c.shape[0] :]])
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

    def embed(
        self, sentences: Sequence[Sequence[str]], batch_size: int = 64
    ) -> list[numpy.ndarray]:
        """One float32 array (L + 1, n_i, 2P) per pre-tokenised sentence, in input order.

        In the default mode sentences are batched longest first; in stateful mode they are
        batched in input order, as the carried states depend on the row a sentence lands in.
        """
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
        sentences = check_sentences(sentences)
        order = list(range(len(sentences)))
        if not self.stateful:
            order.sort(key=lambda i: -len(sentences[i]))
        results: list[numpy.ndarray | None] = [None] * len(sentences)
        with torch.inference_mode():
            for start in range(0, len(order), batch_size):
                indices = order[start : start + batch_size]
                layers = self(self.batch_to_ids([sentences[i] for i in indices])).layers
                layers = layers.float().cpu().numpy()
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
        was computed from the old weights is dropped (the token cache, the weights' copies of
        `quantize`), and `weights_generation` tells copies of the biLM elsewhere (the `elmo`
        component's process) to take the new weights."""
        self.weights_generation += 1
        self.token_cache.clear()
        if self.quantize is not None:  # the quantized copies of the weights made anew
            from .quantize import set_quantize

            mode = self.quantize
            set_quantize(self, None)
            set_quantize(self, mode)

    def __setstate__(self, state: dict) -> None:
        """After copy and pickle: the weights laid out again (`fast_paths.lay_out`: copying
        gives every weight its own memory)."""
        super().__setstate__(state)
        fast_paths.lay_out((self.forward_lstm, self.backward_lstm))

    def _apply(self, fn, recurse: bool = True) -> BiLM:
        """After `.to()` another device or dtype (`nn.Module._apply` gives every weight its own
        memory): the weights laid out again, so the batched step keeps using views of them."""
        super()._apply(fn, recurse)
        fast_paths.lay_out((self.forward_lstm, self.backward_lstm))
        return self


def _token_mask(lengths: torch.Tensor, time: int) -> torch.Tensor:
    """(batch, time) True where a token is."""
    return torch.arange(time, device=lengths.device)[None, :] < lengths[:, None]


def _gather_time(values: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """values[b, index[b, t]] for (batch, time, dim) values and (batch, time) index."""
    return values.gather(1, index[:, :, None].expand(-1, -1, values.shape[-1]))
