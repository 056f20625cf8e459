"""apply: a spaCy pipeline over a corpus, one DocBin per input file (like `spacy apply`), without
`doc._.elmo_layers` (27 KB a sentence; `embed-corpus` is the command for vectors).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any, Iterator, Optional

from ..util.files import atomic_path, check_apart, files_sha256
from .embed_file import LineRange, read_lines
from .engine import Cluster, check_positive
from .plan import plan_inputs
from .runner import CorpusResult, run_corpus, write_output

APPLY_SUFFIXES = (".jsonl", ".txt", ".spacy")
DEFAULT_SHARD_DOCS = 2000


@dataclass(frozen=True)
class ApplyJob:
    """What a worker does: load the pipeline once; annotate a file or a range of it; join."""

    pipeline: str
    text_key: str = "text"
    batch_size: int = 64
    gpu: bool = False
    code: Optional[str] = None  # a Python file each worker imports first (`--code`)
    unit = "documents"  # what one input line is (the progress bar's unit)

    def setup(self) -> Any:
        import spacy

        import_code(self.code)
        if self.gpu:
            spacy.require_gpu()  # the GPU Ray gave this worker
        return spacy.load(self.pipeline)

    def run(self, nlp: Any, payload: dict[str, Any]) -> dict[str, Any]:
        from spacy.tokens import Doc, DocBin

        docbin = DocBin(store_user_data=True)
        if payload["kind"] == "join":
            for part in payload["parts"]:
                docbin.merge(DocBin(store_user_data=True).from_bytes(Path(part).read_bytes()))
        else:
            stream = read_documents(
                Path(payload["input"]), payload.get("range"), self.text_key, nlp
            )
            drop_layers = Doc.has_extension("elmo_layers")
            for doc in nlp.pipe(stream, batch_size=self.batch_size):
                if drop_layers:
                    doc._.elmo_layers = None
                docbin.add(doc)

        def write(stage: Path) -> int:
            with atomic_path(stage) as tmp:
                tmp.write_bytes(docbin.to_bytes())
            return len(docbin)

        return write_output(payload, write)

    def options(self) -> dict[str, Any]:
        return {"command": "apply", "text_key": self.text_key}


def read_documents(
    path: Path, line_range: Optional[LineRange], text_key: str, nlp: Any
) -> Iterator[Any]:
    """The texts (or Docs, for .spacy) of `path`, or of `line_range` of it; of .jsonl, the
    texts of the JSON objects (blank lines skipped: the range counts objects)."""
    if path.suffix == ".spacy":
        from spacy.tokens import DocBin

        yield from DocBin().from_disk(path).get_docs(nlp.vocab)
        return
    if path.suffix != ".jsonl":
        yield from read_lines(path, line_range)
        return
    with path.open("rb") as handle:
        handle.seek(line_range.offset if line_range else 0)
        lines = (raw.removeprefix(b"\xef\xbb\xbf") for raw in handle)
        objects = (line for line in lines if line.strip())
        for line in islice(objects, line_range.count if line_range else None):
            yield json.loads(line)[text_key]


def apply_corpus(
    pipeline: str | Path,
    input: str | Path,
    output_dir: str | Path,
    text_key: str = "text",
    code: Optional[str | Path] = None,
    batch_size: int = 64,
    shard_docs: int = DEFAULT_SHARD_DOCS,
    cluster: Cluster = Cluster(),
    progress: bool = True,
) -> CorpusResult:
    """Run `pipeline` over every .jsonl/.txt/.spacy file of INPUT into OUTPUT_DIR/REL/NAME.spacy,
    resumable as `embed_corpus` is. `code`: a Python file every worker imports first."""
    check_positive(batch_size=batch_size)
    output_dir = Path(output_dir)
    name, identity = _pipeline(pipeline, output_dir)
    inputs = plan_inputs(input, output_dir, APPLY_SUFFIXES, ".spacy", shard_docs, text_key)
    code = None if code is None else str(Path(code).resolve())  # where every worker finds it
    job = ApplyJob(name, text_key, batch_size, gpu=cluster.gpus_per_worker > 0, code=code)
    return run_corpus("apply", inputs, output_dir, job, identity, cluster, progress)


def import_code(code: Optional[str]) -> None:
    """Import the Python file a worker is given (`--code`) before it loads the model."""
    if code is not None:
        import spacy.util

        spacy.util.import_file("python_code", code)


def pipeline_files(
    pipeline: str | Path, output_dir: Path
) -> tuple[str, Optional[Path], list[Path]]:
    """How workers load a spaCy pipeline (a folder's absolute path or an installed package's
    name), its folder (None where it is neither, or a file), and its files; ValueError when
    OUTPUT_DIR is, is inside or contains the folder, or holds one of the files."""
    import spacy.util

    path = Path(pipeline).expanduser()
    if path.exists():
        name = str(path.absolute())
    elif spacy.util.is_package(str(pipeline)):
        name = str(pipeline)
        path = Path(spacy.util.get_package_path(name))
    else:
        return str(pipeline), None, []
    if path.is_dir():
        folder = path
        files = sorted(p for p in path.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    else:
        folder, files = None, [path]
    check_apart(output_dir, [folder] if folder else [], "the pipeline's folder")
    check_apart(output_dir, files, "the pipeline's file")
    return name, folder, files


def _pipeline(pipeline: str | Path, output_dir: Path) -> tuple[str, dict[str, Any]]:
    """`pipeline_files`, checked, and the pipeline's manifest identity (sha256 over the names
    and bytes of every file of its folder)."""
    path = Path(pipeline).expanduser()
    if path.exists() and not (path / "config.cfg").is_file():
        raise ValueError(f"pipeline {pipeline} is not a spaCy pipeline folder (no config.cfg)")
    name, folder, files = pipeline_files(pipeline, output_dir)
    if folder is None:
        raise ValueError(f"pipeline {pipeline} is neither a folder nor an installed spaCy package")
    digest = files_sha256((os.fsencode(f.relative_to(folder).as_posix()), f) for f in files)
    return name, {"kind": "spacy", "name": str(pipeline), "sha256": digest}
