"""Read a corpus (JSONL, Parquet or CSV) as chunks of exactly `chunk_rows` rows.

Chunk k always holds input rows [k * chunk_rows, (k + 1) * chunk_rows), whatever block sizes
the file readers use, so part file k of a resumed job covers the same rows as in the first run.
Memory holds one chunk plus one reader block.

Parquet and CSV go through pyarrow's streaming readers (`ParquetFile.iter_batches`,
`pyarrow.csv.open_csv`). JSONL is parsed line by line with `json`: pyarrow's JSON reader fails a
whole block when one row's text is a number, and turns date-like strings into timestamps, while a
corpus job must report such a row and go on.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

FORMATS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl", ".parquet": "parquet",
           ".pq": "parquet", ".csv": "csv"}
_READ_BLOCK_ROWS = 8192


@dataclass
class Chunk:
    index: int                 # part number
    first_row: int             # input row number of the chunk's first row (0-based)
    ids: list = field(default_factory=list)     # [n] id values (row numbers without an id column)
    texts: list = field(default_factory=list)   # [n] raw text values, validated later
    problems: list = field(default_factory=list)  # [n] why a row could not be read, else None

    def __len__(self) -> int:
        return len(self.texts)


def input_format(path: str | Path, fmt: str | None = None) -> str:
    if fmt:
        if fmt not in set(FORMATS.values()):
            raise ValueError(f"--input-format must be one of jsonl, parquet, csv; got {fmt!r}.")
        return fmt
    suffix = Path(path).suffix.lower()
    if suffix not in FORMATS:
        raise ValueError(f"cannot tell the format of {path}: name it .jsonl, .parquet or .csv, "
                         "or pass --input-format.")
    return FORMATS[suffix]


def read_chunks(path: str | Path, fmt: str, text_column: str, id_column: str | None,
                chunk_rows: int, option: str = "--text-column") -> Iterator[Chunk]:
    """Every row of the input, in order, as chunks of `chunk_rows` rows (the last may be
    shorter). text_column: the column of inputs (texts, or images with `option`
    "--image-column"); `option` is the flag that names it in errors. Blocks of at most
    `chunk_rows` rows are read at a time (an image column holds big cells)."""
    if chunk_rows <= 0:
        raise ValueError(f"chunk rows must be positive, got {chunk_rows}.")
    chunk = Chunk(0, 0)
    row = 0
    block_rows = min(_READ_BLOCK_ROWS, chunk_rows)
    for ids, texts, problems in _blocks(Path(path), fmt, text_column, id_column, option,
                                        block_rows):
        n = len(texts)
        if ids is None:
            ids = list(range(row, row + n))
        problems = problems or [None] * n
        start = 0
        while start < n:
            take = min(chunk_rows - len(chunk), n - start)
            chunk.ids += ids[start:start + take]
            chunk.texts += texts[start:start + take]
            chunk.problems += problems[start:start + take]
            start += take
            if len(chunk) == chunk_rows:
                yield chunk
                chunk = Chunk(chunk.index + 1, chunk.first_row + chunk_rows)
        row += n
    if len(chunk):
        yield chunk


def count_rows(path: str | Path, fmt: str, text_column: str,
               option: str = "--text-column") -> int:
    """Rows in the input (for the progress bar's ETA): Parquet from its footer, others by a
    pass over the file that keeps nothing."""
    path = Path(path)
    if fmt == "parquet":
        import pyarrow.parquet as pq

        return pq.ParquetFile(path).metadata.num_rows
    if fmt == "jsonl":
        with open(path, "rb") as f:
            return sum(1 for line in f if line.strip())
    return sum(len(texts) for _, texts, _ in _blocks(path, fmt, text_column, None, option))


def _blocks(path: Path, fmt: str, text_column: str, id_column: str | None, option: str,
            block_rows: int = _READ_BLOCK_ROWS):
    """(ids or None, texts, problems or None) per reader block."""
    if not path.is_file():
        raise FileNotFoundError(f"input file not found: {path}")
    if fmt == "jsonl":
        yield from _jsonl_blocks(path, text_column, id_column, option, block_rows)
    elif fmt == "parquet":
        yield from _parquet_blocks(path, text_column, id_column, option, block_rows)
    else:
        yield from _csv_blocks(path, text_column, id_column, option)


def _check_columns(names: list[str], text_column: str, id_column: str | None,
                   path: Path, text_option: str) -> None:
    for option, column in ((text_option, text_column), ("--id-column", id_column)):
        if column is not None and column not in names:
            raise ValueError(f"{path} has no column {column!r} ({option}); its columns are "
                             f"{names}.")


def _parquet_blocks(path: Path, text_column: str, id_column: str | None, option: str,
                    block_rows: int):
    import pyarrow.parquet as pq

    file = pq.ParquetFile(path)
    _check_columns(file.schema_arrow.names, text_column, id_column, path, option)
    columns = [text_column] + ([id_column] if id_column else [])
    for batch in file.iter_batches(batch_size=block_rows, columns=columns):
        texts = batch.column(text_column).to_pylist()
        ids = batch.column(id_column).to_pylist() if id_column else None
        yield ids, texts, None


def _csv_blocks(path: Path, text_column: str, id_column: str | None, option: str):
    import pyarrow as pa
    import pyarrow.csv as pcsv

    # Texts stay strings (a text "12" is text, and "" is an empty row, not a null).
    convert = pcsv.ConvertOptions(column_types={text_column: pa.string()},
                                  strings_can_be_null=False)
    reader = pcsv.open_csv(path, convert_options=convert)
    _check_columns(reader.schema.names, text_column, id_column, path, option)
    for batch in reader:
        texts = batch.column(text_column).to_pylist()
        ids = batch.column(id_column).to_pylist() if id_column else None
        yield ids, texts, None


def _jsonl_blocks(path: Path, text_column: str, id_column: str | None, option: str,
                  block_rows: int):
    ids: list = []
    texts: list = []
    problems: list = []
    with open(path, "rb") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue  # blank lines are not rows
            text, id_value, problem = None, None, None
            try:
                record = json.loads(line)
            except ValueError as exc:
                problem = f"line {number}: invalid JSON ({exc})"
            else:
                if not isinstance(record, dict):
                    problem = f"line {number}: a JSON line must be an object with a " \
                              f"{text_column!r} field"
                elif text_column not in record:
                    problem = f"line {number}: no {text_column!r} field ({option})"
                else:
                    text = record[text_column]
                if isinstance(record, dict) and id_column is not None:
                    id_value = record.get(id_column)
            ids.append(id_value)
            texts.append(text)
            problems.append(problem)
            if len(texts) == block_rows:
                yield (ids if id_column else None), texts, problems
                ids, texts, problems = [], [], []
    if texts:
        yield (ids if id_column else None), texts, problems
