"""An independent NumPy ELMo biLM following docs/MODEL.md, reading the hdf5 directly.

It shares no code with spacy_elmo (char ids are rebuilt here too) and runs one sentence at a
time from an explicit initial state, in float64 unless told otherwise.
"""

from __future__ import annotations

import json

import h5py
import numpy as np


def char_ids(token: str) -> list[int]:
    if token == "<S>":
        raw = [258, 256, 259]
    elif token == "</S>":
        raw = [258, 257, 259]
    else:
        raw = [258, *token.encode("utf-8", "ignore")[:48], 259]
    raw = raw + [260] * (50 - len(raw))
    return [i + 1 for i in raw]


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


class NumpyBiLM:
    def __init__(self, options_file, weight_file, dtype=np.float64):
        with open(options_file) as f:
            self.options = json.load(f)
        with h5py.File(weight_file, "r") as h:
            self.w = {}
            h.visititems(
                lambda n, o: (
                    self.w.__setitem__(n, o[...].astype(dtype))
                    if isinstance(o, h5py.Dataset)
                    else None
                )
            )
        self.dtype = dtype
        lstm = self.options["lstm"]
        self.P, self.D, self.L = lstm["projection_dim"], lstm["dim"], lstm.get("n_layers", 1)
        self.cell_clip = lstm.get("cell_clip")
        self.proj_clip = lstm.get("proj_clip")
        self.skip = lstm.get("use_skip_connections", False)

    def token(self, token: str) -> np.ndarray:
        cnn = self.options["char_cnn"]
        table = np.vstack([np.zeros((1, self.w["char_embed"].shape[1])), self.w["char_embed"]])
        x = table[char_ids(token)]  # (50, e)
        feats = []
        for k, (width, _) in enumerate(cnn["filters"]):
            kernel, bias = self.w[f"CNN/W_cnn_{k}"][0], self.w[f"CNN/b_cnn_{k}"]  # (w, e, n)
            conv = np.stack(
                [bias + np.einsum("ue,uen->n", x[p : p + width], kernel) for p in range(51 - width)]
            )
            pooled = conv.max(axis=0)
            feats.append(np.maximum(pooled, 0) if cnn["activation"] == "relu" else np.tanh(pooled))
        x = np.concatenate(feats)
        for h in range(cnn.get("n_highway", 0) or 0):
            g = f"CNN_high_{h}/"
            t = sigmoid(x @ self.w[g + "W_carry"] + self.w[g + "b_carry"])
            x = (
                t * np.maximum(x @ self.w[g + "W_transform"] + self.w[g + "b_transform"], 0)
                + (1 - t) * x
            )
        if "CNN_proj/W_proj" in self.w:
            x = x @ self.w["CNN_proj/W_proj"] + self.w["CNN_proj/b_proj"]
        return x

    def run_direction(self, d, xs, state):
        """xs: list of input vectors in time order; state: list of (h, c) per layer."""
        D = self.D
        outputs_per_layer, finals = [], []
        inputs = xs
        for layer in range(self.L):
            pre = f"RNN_{d}/RNN/MultiRNNCell/Cell{layer}/LSTMCell/"
            W, B = self.w[pre + "W_0"], self.w[pre + "B"]
            h, c = state[layer]
            outs = []
            for x in inputs:
                z = np.concatenate([x, h]) @ W + B
                i, j, f, o = z[:D], z[D : 2 * D], z[2 * D : 3 * D], z[3 * D :]
                c = sigmoid(f + 1.0) * c + sigmoid(i) * np.tanh(j)
                if self.cell_clip:
                    c = np.clip(c, -self.cell_clip, self.cell_clip)
                m = sigmoid(o) * np.tanh(c)
                if pre + "W_P_0" in self.w:
                    h = m @ self.w[pre + "W_P_0"]
                    if self.proj_clip:
                        h = np.clip(h, -self.proj_clip, self.proj_clip)
                else:
                    h = m
                outs.append(h)
            if layer > 0 and self.skip:
                outs = [o + x for o, x in zip(outs, inputs)]
            outputs_per_layer.append(outs)
            finals.append((h, c))
            inputs = outs
        return outputs_per_layer, finals

    def zero_state(self):
        hidden = self.P if "RNN_0/RNN/MultiRNNCell/Cell0/LSTMCell/W_P_0" in self.w else self.D
        return [(np.zeros(hidden, self.dtype), np.zeros(self.D, self.dtype)) for _ in range(self.L)]

    def sentence(self, tokens, fwd_state=None, bwd_state=None):
        """(L + 1, n, 2P) without boundaries, plus the final (forward, backward) states."""
        xs = [self.token(t) for t in ["<S>", *tokens, "</S>"]]
        fwd, fwd_final = self.run_direction(0, xs, fwd_state or self.zero_state())
        bwd, bwd_final = self.run_direction(1, xs[::-1], bwd_state or self.zero_state())
        bwd = [outs[::-1] for outs in bwd]
        n = len(tokens)
        layers = [np.stack([np.concatenate([x, x]) for x in xs])]
        layers += [
            np.stack([np.concatenate([a, b]) for a, b in zip(f, b_)]) for f, b_ in zip(fwd, bwd)
        ]
        out = np.stack(layers)[:, 1 : n + 1]
        return out, fwd_final, bwd_final
