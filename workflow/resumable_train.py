"""`spacy train` that can be stopped and resumed: spaCy 3.8's training loop
(spacy.training.loop.train / train_while_improving), plus a checkpoint of the whole training
state at every evaluation.

    python -m workflow.resumable_train CONFIG --output DIR [--gpu-id -1] [--section.key value ...]

Same arguments as `python -m spacy train`. Without DIR/checkpoint/ it is `spacy train` (same
initialisation, same data order, same updates; it only writes DIR/checkpoint/ besides). With
DIR/checkpoint/ it rebuilds the pipeline as at the start, replays the batch iterator and the
optimizer schedules up to the checkpoint's step without updating (the python RNG state before
each epoch's shuffle is stored, so the replayed order is the original), restores every parameter,
the Adam moments and update counts, the python / numpy / torch RNG states, the evaluation history
(patience, best) and continues from the next step; model-best is kept. The work after the last
checkpoint is redone. The checkpoint is written atomically (checkpoint.tmp, then renamed).
"""

from __future__ import annotations

# ruff: noqa: E402  (PROCESS_START is taken before the heavy imports)
import time

PROCESS_START = time.perf_counter()

import functools
import json
import os
import pickle
import random
import shutil
import sys
from pathlib import Path
from timeit import default_timer as timer

import numpy
import torch
from spacy import util
from spacy.cli._util import parse_config_overrides, setup_gpu, show_validation_error
from spacy.schemas import ConfigSchemaTraining
from spacy.training.initialize import init_nlp
from spacy.training.loop import (
    DIR_MODEL_BEST,
    DIR_MODEL_LAST,
    clean_output_dir,
    create_before_to_disk_callback,
    create_evaluation_callback,
    subdivide_batch,
    update_meta,
)
from spacy.util import registry, resolve_dot_names
from thinc.api import constant, fix_random_seed, set_gpu_allocator
from wasabi import Printer

CHECKPOINT = "checkpoint"
# steps between two calls of release_freed_memory
TRIM_EVERY = 100
msg = Printer()


@functools.cache
def _glibc():
    """glibc as a ctypes library, None where the C library is another (looked up once: libc_ver
    reads the python executable)."""
    import ctypes
    import platform

    if platform.libc_ver()[0] != "glibc":
        return None
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:
        return None


def release_freed_memory() -> bool:
    """Give the heap memory that has been freed back to the OS (glibc's malloc_trim); False
    where the C library is not glibc. Training the transformer pipeline on CPU, the batches'
    varying shapes leave glibc's heap holding freed blocks it does not return: the resident set
    grew by about 1 GB every 10 minutes (14.5 GB after 2,500 steps with all sentences), and one
    malloc_trim brought 3.4 GB back to 1.3 GB. It changes no computation."""
    libc = _glibc()
    if libc is None:
        return False
    libc.malloc_trim(0)
    return True


def iter_params(nlp):
    """(kind, stable key, object) of every thinc node ("node") and shim ("shim"), each once; the
    key, "component/walk index[/shimN]", is the same in every process that builds the pipeline
    from the same config. Nodes and shims are numbered by separate counters, so their ids are
    kept apart."""
    seen: set[tuple[str, int]] = set()
    for comp_name, proc in nlp.pipeline:
        model = getattr(proc, "model", None)
        if model in (None, True, False):
            continue
        for i, node in enumerate(model.walk()):
            if ("node", node.id) not in seen:
                seen.add(("node", node.id))
                yield "node", f"{comp_name}/{i}", node
            for j, shim in enumerate(node.shims):
                if ("shim", shim.id) not in seen:
                    seen.add(("shim", shim.id))
                    yield "shim", f"{comp_name}/{i}/shim{j}", shim


def optimizer_keys(nlp) -> dict[tuple[int, str], str]:
    """The optimizer's keys, (node id, param name) and (shim id, torch param name), as
    "stable key|name"."""
    keys: dict[tuple[int, str], str] = {}
    for kind, key, obj in iter_params(nlp):
        names = obj.param_names if kind == "node" else [n for n, _ in obj._model.named_parameters()]
        for name in names:
            if (obj.id, name) in keys:
                raise RuntimeError(f"two parameters with the optimizer key {(obj.id, name)}")
            keys[(obj.id, name)] = f"{key}|{name}"
    return keys


SIMPLE = (type(None), bool, int, float, str)


def is_simple(value) -> bool:
    """True for plain data (numbers, strings and sets/lists/tuples/dicts of them)."""
    if isinstance(value, SIMPLE):
        return True
    if isinstance(value, (set, frozenset, list, tuple)):
        return all(is_simple(v) for v in value)
    if isinstance(value, dict):
        return all(is_simple(k) and is_simple(v) for k, v in value.items())
    return False


def rng_state_to_json(state):
    version, internal, gauss = state
    return [version, list(internal), gauss]


def rng_state_from_json(data):
    version, internal, gauss = data
    return (version, tuple(internal), gauss)


def save_state(path: Path, nlp, optimizer, state: dict) -> None:
    """Write the training state (parameters, optimizer, RNGs, ``state``) to ``path`` atomically:
    into PATH.tmp, then renamed."""
    tmp = path.with_name(path.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    keys = optimizer_keys(nlp)
    arrays = {}
    shims = {}
    for kind, key, obj in iter_params(nlp):
        if kind == "node":
            for name in obj.param_names:
                if obj.has_param(name):
                    arrays[f"param|{key}|{name}"] = obj.ops.to_numpy(obj.get_param(name))
        else:
            shims[key] = obj._model.state_dict()
    for store, prefix in ((optimizer.mom1, "mom1"), (optimizer.mom2, "mom2")):
        for opt_key, value in store.items():
            arrays[f"{prefix}|{keys[opt_key]}"] = numpy.asarray(value)
    numpy.savez(tmp / "arrays.npz", **arrays)
    attrs = {}
    for kind, key, obj in iter_params(nlp):
        if kind == "node":  # e.g. the parser's unseen_classes, which training changes
            simple = {k: v for k, v in obj.attrs.items() if is_simple(v)}
            if simple:
                attrs[key] = simple
    (tmp / "attrs.pkl").write_bytes(pickle.dumps(attrs))
    torch.save(shims, tmp / "shims.pt")
    torch.save({"torch": torch.get_rng_state(), "numpy": numpy.random.get_state()}, tmp / "rng.pt")
    optimizer_state = {
        "nr_update": [[keys[k], v] for k, v in optimizer.nr_update.items()],
        "last_seen": [[keys[k], v] for k, v in optimizer.last_seen.items()],
        "scalars": {k: getattr(optimizer, k) for k in ("learn_rate", "b1", "b2", "eps", "L2")},
    }
    full = {
        **state,
        "optimizer": optimizer_state,
        "python_random": rng_state_to_json(random.getstate()),
    }
    (tmp / "state.json").write_text(json.dumps(full) + "\n")
    old = path.with_name(path.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if path.exists():
        path.rename(old)
    tmp.rename(path)
    shutil.rmtree(old, ignore_errors=True)


def load_state(path: Path, nlp, optimizer) -> dict:
    """Restore what `save_state` wrote into ``nlp``, ``optimizer`` and the RNGs; return the
    state dict."""
    state = json.loads((path / "state.json").read_text())
    by_key = {key: opt_key for opt_key, key in optimizer_keys(nlp).items()}
    arrays = numpy.load(path / "arrays.npz")
    shims = torch.load(path / "shims.pt", weights_only=False)
    restored = 0
    for kind, key, obj in iter_params(nlp):
        if kind == "node":
            for name in obj.param_names:
                if obj.has_param(name):
                    obj.set_param(name, obj.ops.asarray(arrays[f"param|{key}|{name}"]))
                    restored += 1
        else:
            obj._model.load_state_dict(shims[key])
            restored += 1
    attrs = pickle.loads((path / "attrs.pkl").read_bytes())
    for kind, key, obj in iter_params(nlp):
        if kind == "node" and key in attrs:
            for name, value in attrs[key].items():
                obj.attrs[name] = value
    for prefix, store in (("mom1", optimizer.mom1), ("mom2", optimizer.mom2)):
        store.clear()
        for name in arrays.files:
            if name.startswith(prefix + "|"):
                store[by_key[name.split("|", 1)[1]]] = arrays[name].copy()
    opt = state["optimizer"]
    optimizer.nr_update.clear()
    optimizer.nr_update.update({by_key[k]: v for k, v in opt["nr_update"]})
    optimizer.last_seen.clear()
    optimizer.last_seen.update({by_key[k]: v for k, v in opt["last_seen"]})
    for name, value in opt["scalars"].items():
        if getattr(optimizer, name) != value:
            raise RuntimeError(
                f"optimizer {name} after replaying {state['step'] + 1} schedule steps is "
                f"{getattr(optimizer, name)}, the checkpoint has {value}"
            )
    rng = torch.load(path / "rng.pt", weights_only=False)
    torch.set_rng_state(rng["torch"])
    numpy.random.set_state(rng["numpy"])
    random.setstate(rng_state_from_json(state["python_random"]))
    print(f"[resume] restored {restored} parameter sets from {path}", flush=True)
    return state


def train_batches(nlp, corpus, batcher, max_epochs: int, epoch_states: list):
    """spacy.training.loop.create_train_batches, noting the python RNG state before each epoch's
    shuffle (and, when replaying, setting it back to the noted one)."""
    if max_epochs < 0:
        raise ValueError("streamed corpora (max_epochs = -1) are not supported")
    epoch = 0
    examples = list(corpus(nlp))
    if not examples:
        raise ValueError("no training examples")
    while max_epochs < 1 or epoch != max_epochs:
        if epoch < len(epoch_states):
            random.setstate(rng_state_from_json(epoch_states[epoch]))
        else:
            epoch_states.append(rng_state_to_json(random.getstate()))
        random.shuffle(examples)
        for batch in batcher(examples):
            yield epoch, batch
        epoch += 1


def train(nlp, output_path: Path, use_gpu: int = -1) -> None:
    """spacy.training.loop.train with a checkpoint at each evaluation, resuming from
    OUTPUT/checkpoint/ if there is one; writes OUTPUT/timeline.json when it ends."""
    stdout, stderr = sys.stdout, sys.stderr
    printer = Printer(no_print=True)
    config = nlp.config.interpolate()
    if config["training"]["seed"] is not None:
        fix_random_seed(config["training"]["seed"])
    allocator = config["training"]["gpu_allocator"]
    if use_gpu >= 0 and allocator:
        set_gpu_allocator(allocator)
    T = registry.resolve(config["training"], schema=ConfigSchemaTraining)
    train_corpus, dev_corpus = resolve_dot_names(config, [T["train_corpus"], T["dev_corpus"]])
    optimizer = T["optimizer"]
    batcher = T["batcher"]
    before_to_disk = create_before_to_disk_callback(T["before_to_disk"])
    before_update = T["before_update"]
    exclude = T["frozen_components"]
    annotating = T["annotating_components"]
    evaluate = create_evaluation_callback(nlp, dev_corpus, T["score_weights"])
    dropout = T["dropout"]
    dropouts = constant(dropout) if isinstance(dropout, float) else dropout
    checkpoint = output_path / CHECKPOINT
    # a checkpoint write that was interrupted: drop the half-written one, keep the old one
    shutil.rmtree(output_path / (CHECKPOINT + ".tmp"), ignore_errors=True)
    if not checkpoint.exists() and (output_path / (CHECKPOINT + ".old")).exists():
        (output_path / (CHECKPOINT + ".old")).rename(checkpoint)
    resume = checkpoint.exists()
    epoch_states: list = []
    start_step, results, words_seen, seconds_before = 0, [], 0, 0.0
    evaluations: list = []  # [step, seconds of training loop so far] of every evaluation
    segments: list = []  # [start step, seconds from process start to the loop] of every start
    batches = None
    if resume:
        state = json.loads((checkpoint / "state.json").read_text())
        epoch_states = state["epoch_states"]
        batches = train_batches(nlp, train_corpus, batcher, T["max_epochs"], epoch_states)
        for _ in range(state["step"] + 1):  # replay: batches and schedules of steps 0..step
            next(batches)
            next(dropouts)
            optimizer.step_schedules()
        state = load_state(checkpoint, nlp, optimizer)
        start_step = state["step"] + 1
        results = [tuple(r) for r in state["results"]]
        words_seen = state["words"]
        seconds_before = state["seconds"]
        evaluations = state["evaluations"]
        segments = state["segments"]
        stdout.write(printer.info(f"Resuming at step {start_step} from {checkpoint}") + "\n")
    else:
        clean_output_dir(output_path)
        batches = train_batches(nlp, train_corpus, batcher, T["max_epochs"], epoch_states)

    def save_checkpoint(is_best):
        with nlp.use_params(optimizer.averages):
            before_to_disk(nlp).to_disk(output_path / DIR_MODEL_LAST)
        if is_best:
            if (output_path / DIR_MODEL_BEST).exists():
                shutil.rmtree(output_path / DIR_MODEL_BEST)
            shutil.copytree(output_path / DIR_MODEL_LAST, output_path / DIR_MODEL_BEST)

    stdout.write(printer.info(f"Pipeline: {nlp.pipe_names}") + "\n")
    stdout.write(printer.info(f"Initial learn rate: {optimizer.learn_rate}") + "\n")
    with nlp.select_pipes(disable=exclude):
        log_step, finalize_logger = T["logger"](nlp, stdout, stderr)
    patience, max_steps, eval_frequency = T["patience"], T["max_steps"], T["eval_frequency"]
    losses: dict = {}
    start_time = timer()
    segments.append([start_step, round(time.perf_counter() - PROCESS_START, 1)])
    finished = False
    try:
        step = start_step
        for step_offset, (epoch, batch) in enumerate(batches):
            step = start_step + step_offset
            if before_update:
                before_update(nlp, {"step": step, "epoch": epoch})
            drop = next(dropouts)
            for subbatch in subdivide_batch(batch, T["accumulate_gradient"]):
                nlp.update(
                    subbatch,
                    drop=drop,
                    losses=losses,
                    sgd=False,
                    exclude=exclude,
                    annotates=annotating,
                )
            for name, proc in nlp.pipeline:
                if (
                    name not in exclude
                    and hasattr(proc, "is_trainable")
                    and proc.is_trainable
                    and proc.model not in (True, False, None)
                ):
                    proc.finish_update(optimizer)
            optimizer.step_schedules()
            if not (step % TRIM_EVERY):
                release_freed_memory()
            if not (step % eval_frequency):
                if optimizer.averages:
                    with nlp.use_params(optimizer.averages):
                        score, other_scores = evaluate()
                else:
                    score, other_scores = evaluate()
                results.append((score, step))
                is_best = score == max(results)[0]
            else:
                score, other_scores, is_best = None, None, None
            words_seen += sum(len(eg) for eg in batch)
            seconds = seconds_before + timer() - start_time
            info = {
                "epoch": epoch,
                "step": step,
                "score": score,
                "other_scores": other_scores,
                "losses": losses,
                "checkpoints": results,
                "seconds": int(seconds),
                "words": words_seen,
            }
            if is_best is not None:
                evaluations.append([step, round(seconds, 1)])
                with nlp.select_pipes(disable=exclude):
                    update_meta(T, nlp, info)
                save_checkpoint(is_best)
                info["output_path"] = str(output_path / DIR_MODEL_LAST)
            log_step(info if is_best is not None else None)
            if is_best is not None:
                losses = {}
                state = {
                    "step": step,
                    "epoch": epoch,
                    "results": results,
                    "words": words_seen,
                    "seconds": seconds,
                    "epoch_states": epoch_states,
                    "evaluations": evaluations,
                    "segments": segments,
                }
                save_state(checkpoint, nlp, optimizer, state)
                if os.environ.get("RESUMABLE_STOP_AT_STEP") == str(step):  # for testing resume
                    raise SystemExit(f"[test] stopping after the checkpoint of step {step}")
            best_score, best_neg_step = max((s, -st) for s, st in results)
            if patience and (step - (-best_neg_step)) >= patience:
                break
            if max_steps and step >= max_steps:
                break
        finished = True
    finally:
        finalize_logger()
        if finished:
            save_checkpoint(False)
    stdout.write(printer.good("Saved pipeline to output directory", output_path / DIR_MODEL_LAST))
    stdout.write("\n")
    timeline = {
        "evaluations": evaluations,
        "segments": segments,
        "loop_seconds": round(seconds_before + timer() - start_time, 1),
        "last_step": step,
    }
    (output_path / "timeline.json").write_text(json.dumps(timeline, indent=1) + "\n")
    # the run is complete: its checkpoint is no longer needed
    shutil.rmtree(checkpoint, ignore_errors=True)


def parse_args(argv: list[str]) -> tuple[Path, Path, int, list[str]]:
    """CONFIG, --output, --gpu-id and the config overrides of a `spacy train` argv."""
    if not argv or argv[0].startswith("-"):
        raise SystemExit(__doc__)
    config_path, rest = Path(argv[0]), argv[1:]
    output, use_gpu, extra = None, -1, []
    i = 0
    while i < len(rest):
        if rest[i] in ("--output", "-o", "--gpu-id", "-g"):
            if i + 1 == len(rest):
                raise SystemExit(f"{rest[i]} needs a value")
            if rest[i] in ("--output", "-o"):
                output = Path(rest[i + 1])
            else:
                try:
                    use_gpu = int(rest[i + 1])
                except ValueError:
                    raise SystemExit(f"--gpu-id {rest[i + 1]!r} is not a number") from None
            i += 2
        else:
            extra.append(rest[i])
            i += 1
    if output is None:
        raise SystemExit("--output is required (the checkpoint lives there)")
    return config_path, output, use_gpu, extra


def main(argv: list[str]) -> int:
    """`spacy train CONFIG --output DIR ...`, resumable."""
    config_path, output, use_gpu, extra = parse_args(argv)
    overrides = parse_config_overrides(extra)
    output.mkdir(parents=True, exist_ok=True)
    msg.info(f"Saving to output directory: {output}")
    setup_gpu(use_gpu)
    with show_validation_error(config_path):
        config = util.load_config(config_path, overrides=overrides, interpolate=False)
    msg.divider("Initializing pipeline")
    with show_validation_error(config_path, hint_fill=False):
        nlp = init_nlp(config, use_gpu=use_gpu)
    msg.good("Initialized pipeline")
    msg.divider("Training pipeline")
    train(nlp, output, use_gpu=use_gpu)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
