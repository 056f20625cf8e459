"""embed-corpus: every text file of a corpus into hdf5, in the layout of `spacy-elmo embed`."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Optional

from ..util.files import atomic_path, check_apart
from ..util.signals import deferred
from .apply import import_code, pipeline_files
from .embed_file import MAX_TOKENS, dataset_options, hdf5_written, write_sentence_to_index
from .engine import Cluster, check_positive
from .plan import plan_inputs
from .runner import CorpusResult, run_corpus, write_output

DEFAULT_SHARD_LINES = 2000


@dataclass(frozen=True)
class EmbedJob:
    """What a worker does: load the biLM once; embed a file, or a line range of it; join parts."""

    model: Optional[str]
    options_file: Optional[str]
    weights_file: Optional[str]
    output_format: str = "all"
    batch_size: int = 64
    pretokenized: bool = True
    lang: str = "en"
    pipeline: Optional[str] = None  # a spaCy pipeline whose tokenizer reads raw text
    max_tokens: int = MAX_TOKENS
    float16: bool = False
    compression: Optional[str] = None
    gpu: bool = False
    bf16: bool = False  # the biLM's LSTM products in bfloat16 (`bilm.quantize`)
    unit = "sentences"  # what one input line is (the progress bar's unit)
    code: Optional[str] = None  # a Python file each worker imports first (`--code`)

    def setup(self) -> Any:
        from ..bilm import BiLM
        from .embed_file import spacy_tokenizer, whitespace_tokenizer

        import_code(self.code)
        bilm = BiLM.load(self.model, options=self.options_file, weights=self.weights_file)
        if self.gpu:
            bilm = bilm.to("cuda")  # the GPU Ray gave this worker (CUDA_VISIBLE_DEVICES)
        if self.bf16:
            from ..bilm.quantize import set_quantize

            set_quantize(bilm, "bf16")
        if self.pretokenized:
            tokenize = whitespace_tokenizer
        else:
            tokenize = spacy_tokenizer(self.lang, self.pipeline)
        return bilm, tokenize

    def run(self, state: Any, payload: dict[str, Any]) -> dict[str, Any]:
        from .embed_file import embed_file

        if payload["kind"] == "join":
            return write_output(payload, partial(join_hdf5, [Path(p) for p in payload["parts"]]))
        bilm, tokenize = state
        embed = partial(
            embed_file,
            bilm,
            payload["input"],
            output_format=self.output_format,
            batch_size=self.batch_size,
            tokenize=tokenize,
            progress=False,
            max_tokens=self.max_tokens,
            float16=self.float16,
            compression=self.compression,
            lines=payload.get("range"),
        )
        return write_output(payload, embed)

    def options(self) -> dict[str, Any]:
        return {
            "command": "embed-corpus",
            "output_format": self.output_format,
            "tokens": "pretokenized"
            if self.pretokenized
            else f"spacy:{self.pipeline or self.lang}",
            "max_tokens": self.max_tokens,
            "float16": self.float16,
            "compression": self.compression,
            **({"quantize": "bf16"} if self.bf16 else {}),  # absent for float32
        }


def join_hdf5(parts: list[Path], output: Path) -> int:
    """Join part files into one, datasets copied as stored and each sentence keeping its first
    index in `sentence_to_index` (as `embed_file` over the whole file); return its lines."""
    import json

    import h5py

    sentence_to_index: dict[str, str] = {}
    lines = 0
    with atomic_path(output) as tmp, hdf5_written(tmp) as out:
        for part in parts:
            with deferred(), h5py.File(part, "r") as source:  # see `hdf5_written`
                for name in source:
                    if name != "sentence_to_index":
                        source.copy(source[name], out, name=name)
                        lines += 1
                for text, index in json.loads(source["sentence_to_index"][0]).items():
                    sentence_to_index.setdefault(text, index)
        with deferred():
            write_sentence_to_index(out, sentence_to_index)
    return lines


def embed_corpus(
    input: str | Path,
    output_dir: str | Path,
    model: Optional[str] = None,
    options_file: Optional[str | Path] = None,
    weights_file: Optional[str | Path] = None,
    output_format: str = "all",
    pretokenized: bool = True,
    lang: str = "en",
    pipeline: Optional[str] = None,
    max_tokens: int = MAX_TOKENS,
    batch_size: int = 64,
    float16: bool = False,
    compression: Optional[str] = None,
    shard_lines: int = DEFAULT_SHARD_LINES,
    bf16: bool = False,
    code: Optional[str | Path] = None,
    cluster: Cluster = Cluster(),
    progress: bool = True,
) -> CorpusResult:
    """Embed every `*.txt` under INPUT (a folder, a glob or a file) into OUTPUT_DIR/REL/NAME.hdf5,
    as `embed_file` would, skipping what the manifest has (docs/corpus.md). `code`: a Python
    file every worker imports first, on storage every node sees.
    """
    from ..bilm.quantize import quantize_from_flags
    from ..weights.sources import resolve_source

    check_positive(batch_size=batch_size)
    dataset_options(float16, compression, output_format, max_tokens)
    quantize_from_flags(bf16, cluster.gpus_per_worker > 0, "--gpus-per-worker")
    output_dir = Path(output_dir)
    source = resolve_source(model, options_file, weights_file)
    check_apart(output_dir, [source.path] if source.path else [], "the model's folder")
    check_apart(output_dir, source.files(), "the model's file")
    if pipeline is not None:
        pipeline = pipeline_files(pipeline, output_dir)[0]  # workers load it by that name
    inputs = plan_inputs(input, output_dir, (".txt",), ".hdf5", shard_lines)
    identity = model_identity(source)
    job = EmbedJob(
        model=_model_name(source),
        options_file=None if source.options_file is None else str(source.options_file.absolute()),
        weights_file=None if source.weights_file is None else str(source.weights_file.absolute()),
        output_format=output_format,
        batch_size=batch_size,
        pretokenized=pretokenized,
        lang=lang,
        pipeline=pipeline,
        max_tokens=max_tokens,
        float16=float16,
        compression=compression,
        gpu=cluster.gpus_per_worker > 0,
        bf16=bf16,
        code=None if code is None else str(Path(code).resolve()),  # where every worker finds it
    )
    return run_corpus("embed-corpus", inputs, output_dir, job, identity, cluster, progress)


def _model_name(source) -> Optional[str]:
    """How a worker names the biLM: "bundled" (its own installed copy) or an absolute path."""
    if source.kind == "allennlp":
        return None
    return "bundled" if source.kind == "bundled" else str(source.path.absolute())


def model_identity(source) -> dict[str, Any]:
    """The model as the manifest records it: kind, name and sha256 of its files."""
    return {"kind": source.kind, "name": source.name, "sha256": source.fingerprint()}
