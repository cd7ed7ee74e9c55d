"""What the served model accepts, checked before MLflow's scoring server sees a request.

Pure: :func:`check_request` takes a request's ``Content-Type`` and body and returns its number of rows, or raises
:class:`RequestProblem` (an HTTP status, an error code and a one-line message naming the field or row). MLflow then
parses the body again and scores it; a row whose ``text`` is a number, a null or empty gets its ``score_error`` there,
as in ``make score``.

Accepted: JSON (``application/json``) with exactly one of ``dataframe_records`` (a list of ``{"text": ...}``),
``dataframe_split`` (``{"columns": [..., "text", ...], "data": [[...], ...]}``), ``inputs`` or ``instances`` (a list
of texts, a list of ``{"text": ...}`` or ``{"text": [...]}``), and an optional ``params`` object; CSV (``text/csv``)
and Parquet (``application/vnd.apache.parquet``) tables with a ``text`` column. UTF-8 only.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from typing import Any

import pandas as pd

from pipeline.core.errors import ConfigError

TEXT = "text"  # the one input column every model of this pipeline takes
RECORDS, SPLIT, INPUTS, INSTANCES = "dataframe_records", "dataframe_split", "inputs", "instances"
JSON_FIELDS = (RECORDS, SPLIT, INPUTS, INSTANCES)  # MLflow's input fields, one per request
JSON, CSV, PARQUET = "application/json", "text/csv", "application/vnd.apache.parquet"
CONTENT_TYPES = (JSON, CSV, PARQUET)
DEFAULT_MAX_BODY_BYTES = 8_000_000
DEFAULT_MAX_ROWS = 10_000


@dataclass(frozen=True)
class RequestLimits:
    """The most one request may carry; a larger one is answered 413 before it is parsed."""

    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_rows: int = DEFAULT_MAX_ROWS

    def __post_init__(self) -> None:
        for name in ("max_body_bytes", "max_rows"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                option = "--" + name.replace("_", "-")
                raise ConfigError(f"{option} must be a whole number of at least 1, not {getattr(self, name)!r}")


class RequestProblem(ValueError):
    """A request the server refuses: ``status`` (HTTP), ``error_code`` and a one-line ``message``."""

    def __init__(self, status: int, error_code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.error_code, self.message = status, error_code, message

    def body(self) -> bytes:
        """The answer's JSON, on one line (MLflow's own errors have these two fields)."""
        return json.dumps({"error_code": self.error_code, "message": self.message}).encode() + b"\n"


def bad_request(message: str) -> RequestProblem:
    return RequestProblem(400, "BAD_REQUEST", message)


def too_large(message: str) -> RequestProblem:
    return RequestProblem(413, "PAYLOAD_TOO_LARGE", f"{message}: send it in smaller requests")


def body_too_large(limits: RequestLimits, size: int | None = None) -> RequestProblem:
    """``size`` None: a streamed body stopped once it passed the limit."""
    told = f"{size:,} bytes" if size is not None else f"over {limits.max_body_bytes:,} bytes"
    return too_large(f"the body is {told}; this server takes at most {limits.max_body_bytes:,} bytes a request")


def check_request(content_type: str | None, body: bytes, limits: RequestLimits) -> int:
    """The number of rows in ``body``; raises :class:`RequestProblem` for what MLflow would refuse with a message
    about its internals, or not refuse at all (no rows, too many, too large)."""
    if len(body) > limits.max_body_bytes:
        raise body_too_large(limits, len(body))
    media_type = check_content_type(content_type)
    if media_type == JSON:
        rows = json_rows(parse_json(body))
    else:
        rows = table_rows(media_type, body)
    if rows == 0:
        raise bad_request("no rows: the request holds an empty table (send at least one row with a 'text' field)")
    if rows > limits.max_rows:
        raise too_large(f"{rows:,} rows; this server takes at most {limits.max_rows:,} rows a request")
    return rows


def check_content_type(content_type: str | None) -> str:
    """The media type of ``content_type``; 415 for one MLflow does not parse or a charset other than UTF-8."""
    media_type, *parameters = [part.strip() for part in (content_type or "").split(";")]
    media_type = media_type.lower()
    if media_type not in CONTENT_TYPES:
        raise RequestProblem(
            415,
            "UNSUPPORTED_MEDIA_TYPE",
            f"Content-Type {content_type or '(none)'!r} is not one this server reads: send {JSON} "
            f"(or {CSV}, {PARQUET})",
        )
    for parameter in parameters:
        name, _, value = parameter.partition("=")
        if name.strip().lower() != "charset" or value.strip().strip('"').lower() not in ("utf-8", "utf8"):
            raise RequestProblem(
                415, "UNSUPPORTED_MEDIA_TYPE", f"Content-Type parameter {parameter!r}: this server reads UTF-8 only"
            )
    return media_type


def parse_json(body: bytes) -> Any:
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise bad_request(f"the body is not UTF-8: byte {exc.start:,} is {body[exc.start]:#04x}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise bad_request(f"the body is not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None


def json_rows(request: Any) -> int:
    if not isinstance(request, dict):
        raise bad_request(f"the body must be a JSON object with one of {', '.join(JSON_FIELDS)}; it is {kind(request)}")
    given = [field for field in JSON_FIELDS if field in request]
    if len(given) != 1:
        raise bad_request(f"the body needs exactly one of {', '.join(JSON_FIELDS)}; it has {field_list(request)}")
    if "params" in request and not isinstance(request["params"], dict):
        raise bad_request(f'params must be an object such as {{"explain": true}}; it is {kind(request["params"])}')
    (field,) = given
    value = request[field]
    if field == RECORDS:
        return record_rows(field, value)
    if field == SPLIT:
        return split_rows(value)
    if isinstance(value, dict):  # inputs / instances by column: {"text": [...]} or {"text": "..."}
        if TEXT not in value:
            raise bad_request(f"{field} has no 'text' field; it has {field_list(value)}")
        return len(value[TEXT]) if isinstance(value[TEXT], list) else 1
    if not isinstance(value, list):
        raise bad_request(f'{field} must be a list of texts or of {{"text": ...}} rows; it is {kind(value)}')
    if any(isinstance(row, dict) for row in value):
        return record_rows(field, value)
    return len(value)  # one text a row


def record_rows(field: str, rows: Any) -> int:
    if not isinstance(rows, list):
        raise bad_request(f'{field} must be a list of rows such as {{"text": "..."}}; it is {kind(rows)}')
    for index, row in enumerate(rows):
        if not isinstance(row, dict):
            raise bad_request(f'{field}[{index}] must be an object such as {{"text": "..."}}; it is {kind(row)}')
        if TEXT not in row:
            raise bad_request(f"{field}[{index}] has no 'text' field; it has {field_list(row)}")
    return len(rows)


def split_rows(split: Any) -> int:
    if not isinstance(split, dict) or not isinstance(split.get("columns"), list):
        raise bad_request(f'{SPLIT} must be an object such as {{"columns": ["text"], "data": [["..."]]}}')
    columns = split["columns"]
    if TEXT not in columns:
        raise bad_request(f"{SPLIT}.columns has no 'text' column; it has {columns}")
    data = split.get("data")
    if not isinstance(data, list):
        raise bad_request(f"{SPLIT}.data must be a list of rows; it is {kind(data)}")
    for index, row in enumerate(data):
        if len(row) != len(columns) if isinstance(row, list) else len(columns) != 1:  # a bare value: one column
            size = f"{len(row)} values" if isinstance(row, list) else kind(row)
            raise bad_request(f"{SPLIT}.data[{index}] has {size} for {len(columns)} columns {columns}")
    return len(data)


def table_rows(media_type: str, body: bytes) -> int:
    """The rows of a CSV or Parquet body, which must have a ``text`` column."""
    try:
        if media_type == CSV:
            table = pd.read_csv(io.BytesIO(body), dtype=str, encoding="utf-8")
        else:
            table = pd.read_parquet(io.BytesIO(body))
    except pd.errors.EmptyDataError:
        raise bad_request(
            "no rows: the CSV body is empty (its first line names the columns, one of them 'text')"
        ) from None
    except UnicodeDecodeError as exc:
        raise bad_request(f"the body is not UTF-8: byte {exc.start:,} is {body[exc.start]:#04x}") from None
    except Exception as exc:  # pandas and pyarrow raise many kinds for a body that is not a table
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise bad_request(f"the body is not a {media_type.split('/')[-1]} table: {first_line}") from None
    if TEXT not in table.columns:
        raise bad_request(f"the table has no 'text' column; it has {[str(column) for column in table.columns]}")
    return len(table)


def kind(value: Any) -> str:
    """``value``'s JSON type, for a message: 'a list', 'a string', 'null'."""
    if value is None:
        return "null"
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean", int: "a number", float: "a number"}
    return names.get(type(value), type(value).__name__)


def field_list(value: dict) -> str:
    return f"{sorted(value)}" if value else "no fields"
