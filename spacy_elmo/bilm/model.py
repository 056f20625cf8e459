"""The ELMo biLM: char CNN token layer, forward and backward LSTM stacks (docs/MODEL.md §4-8)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy
import torch
from torch import nn
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence, pad_packed_sequence

from ..description.chars import BOS_CHAR_IDS, EOS_CHAR_IDS, batch_to_ids
from ..description.options import BiLMOptions
from . import fast_paths
from .char_cnn import CharCNN
from .embedding import embed_sentences
from .loading import BiLMFiles
from .lstm import LstmStack, State, run_stacks
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


class BiLM(BiLMFiles, nn.Module):
    """ELMo's bidirectional language model, numerically equal to bilm-tf / AllenNLP.

    With `stateful=False` (the default) every sentence starts from a zero LSTM state, so its
    vectors do not depend on the batch. `stateful=True` carries each batch row's final state
    into the same row of the next call, as AllenNLP and bilm-tf do (docs/MODEL.md §8).
    """

    # "bf16" where the LSTM products run in bfloat16 (`quantize.set_quantize`), else None.
    quantize: str | None = None

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
        super().__init__()
        self.options = options
        self.stateful = stateful
        # At inference the char-CNN vectors of the tokens seen last (a fast path).
        self.token_cache = TokenCache(token_cache_size)
        # Counts the writes into the weights that torch's version counters miss (`weights_changed`)
        self.weights_generation = 0
        self.char_cnn = CharCNN(options)
        stack_args = dict(
            n_layers=options.n_layers,
            dim=options.projection_dim,
            cell_dim=options.lstm_dim,
            cell_clip=options.cell_clip,
            proj_clip=options.proj_clip,
            use_skip_connections=options.use_skip_connections,
            use_projection=options.has_lstm_projection,
        )
        self.forward_lstm = LstmStack(**stack_args)
        self.backward_lstm = LstmStack(**stack_args)
        self._carried_states: dict[str, list[State]] = {}
        # How tokens become ids: None is ELMo's UTF-8 byte mapping (`chars.py`); an
        # ELMoForManyLangs model carries its dictionaries (`weights.efml_lexicon.EfmlLexicon`).
        self.lexicon = None
        if initialise:  # random weights (`loading.BiLMFiles.reset_parameters`)
            fast_paths.lay_out((self.forward_lstm, self.backward_lstm))
            self.reset_parameters()

    # ------------------------------------------------------------------ the forward pass
    def forward(self, char_ids: torch.Tensor) -> BiLMOutput:
        """All L + 1 layers for (batch, time, 50) char ids, boundaries removed."""
        run = self._run(char_ids)
        mask = _token_mask(run.lengths, run.tokens.shape[1] - 2)  # (batch, time)
        if fast_paths.at_inference(modules=(self,)):
            layers = fast_paths.scatter_layers(
                run.tokens, run.outputs, run.lengths, run.cpu_lengths, run.reverse_index, mask
            )  # the same layers, without the autograd route's copies
            return BiLMOutput(layers=layers, mask=mask)
        acts = self._activations(run)
        layers = [torch.cat([acts.token_embeddings, acts.token_embeddings], dim=-1)]
        layers += [torch.cat(pair, dim=-1) for pair in zip(acts.forward, acts.backward)]
        stacked = torch.stack(layers)[:, :, 1:-1]  # (L + 1, batch, time, 2P)
        return BiLMOutput(layers=stacked * mask[None, :, :, None], mask=mask)

    def activations(self, char_ids: torch.Tensor) -> BiLMActivations:
        """Run the biLM on (batch, time, 50) char ids from `batch_to_ids` (no boundaries)."""
        return self._activations(self._run(char_ids))

    def _run(self, char_ids: torch.Tensor) -> PackedRun:
        """Token vectors and the packed output of every LSTM layer of both directions."""
        bos_ids, eos_ids = self._boundary_ids()
        if char_ids.dim() != 3 or char_ids.shape[-1] != len(bos_ids):
            raise ValueError(
                f"char_ids must have shape (batch, time, {len(bos_ids)}), "
                f"got {tuple(char_ids.shape)}"
            )
        batch, time, _ = char_ids.shape
        device = self.char_cnn.char_embedding.weight.device
        char_ids = char_ids.to(device)
        token_mask = (char_ids > 0).any(dim=-1)  # (batch, time)
        lengths = token_mask.sum(dim=1)  # (batch,)
        positions = torch.arange(time + 2, device=device)
        if not torch.equal(token_mask, positions[None, :time] < lengths[:, None]):
            raise ValueError("char_ids has an all-zero (padding) row before a token")

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
            self._initial_states(direction, stack, batch, sorted_indices)
            for direction, stack in zip(DIRECTIONS, stacks)
        ]
        outputs, final_states = run_stacks(
            stacks, [p.data for p in packed], packed[0].batch_sizes.tolist(), states
        )  # per direction, per layer: packed outputs (N, P) and final (h, c)
        if self.stateful:
            for direction, finals in zip(DIRECTIONS, final_states):
                self._carry_states(direction, finals, unsorted_indices)
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
        mask = (char_ids > 0).any(dim=-1)
        output = char_ids.new_zeros(
            (*char_ids.shape[:-1], self.options.projection_dim),
            dtype=self.char_cnn.char_embedding.weight.dtype,
        )
        if mask.any():
            distinct, inverse = fast_paths.distinct_rows(char_ids[mask])  # (k, 50), (n,)
            if self.token_cache.applies():  # the vectors of tokens seen before (token_cache.py)
                version = (self.weights_generation, self.quantize)
                vectors = self.token_cache.char_cnn(self.char_cnn, distinct, version)
            else:
                vectors = self.char_cnn(distinct)  # (k, P)
            output[mask] = vectors[inverse]
        return output

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

    def _initial_states(
        self, direction: str, stack: LstmStack, batch: int, sorted_indices: torch.Tensor
    ) -> list[State]:
        """One (h, c) per layer, rows in the packed (length-sorted) order."""
        device = sorted_indices.device
        dtype = self.char_cnn.char_embedding.weight.dtype
        states = []
        for index, cell in enumerate(stack.layers):
            h = torch.zeros(batch, cell.hidden_dim, device=device, dtype=dtype)
            c = torch.zeros(batch, cell.cell_dim, device=device, dtype=dtype)
            carried = self._carried_states.get(direction)
            if self.stateful and carried is not None:
                stored_h, stored_c = carried[index]
                rows = min(batch, stored_h.shape[0])
                h[:rows] = stored_h[:rows]
                c[:rows] = stored_c[:rows]
            states.append((h[sorted_indices], c[sorted_indices]))
        return states

    def _carry_states(
        self, direction: str, final_states: list[State], unsorted_indices: torch.Tensor
    ) -> None:
        """Store each row's final state at its row index; rows beyond the batch keep theirs."""
        carried = self._carried_states.get(direction)
        updated = []
        for index, (h, c) in enumerate(final_states):
            h, c = h[unsorted_indices].detach(), c[unsorted_indices].detach()
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
        self.char_cnn.padding_id = lexicon.padding_id

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
        return embed_sentences(self, sentences, batch_size)

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
