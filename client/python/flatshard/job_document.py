"""Turns a job file (or a dict) into the JobDocument the coordinator parses.

The coordinator reads job files with the same reader as `flatshard job create -f`
(docs/job-spec.md), so the client only packs the text, and the model file a
`model: PATH` names, which the coordinator never reads from its own disk.
Errors then name the user's file and line, exactly as the CLI's do.
"""
from __future__ import annotations

import json
import os
from typing import Any, Mapping, Union

import yaml

from flatshard.v1 import job_pb2

JobSource = Union[str, os.PathLike, Mapping[str, Any]]


def job_document(source: JobSource) -> job_pb2.JobDocument:
    """A JobDocument for a job file path, or for a dict laid out like one.

    A dict's relative ``model`` path is taken from the current directory; a
    file's from the file's directory.
    """
    document = job_pb2.JobDocument()
    if isinstance(source, Mapping):
        document.text = json.dumps(dict(source), indent=1, default=_not_serializable)
        document.source = "<dict>"
        model = source.get("model")
        base_dir = os.getcwd()
    else:
        path = os.fspath(source)
        with open(path, encoding="utf-8") as f:
            document.text = f.read()
        document.source = path
        try:
            model = (yaml.safe_load(document.text) or {}).get("model")
        except (yaml.YAMLError, AttributeError):
            model = None  # the coordinator reports the syntax error with its line
        base_dir = os.path.dirname(os.path.abspath(path))
    if isinstance(model, str) and model:
        model_path = model if os.path.isabs(model) else os.path.join(base_dir, model)
        with open(model_path, encoding="utf-8") as f:
            document.files[model] = f.read()
    return document


def _not_serializable(value: Any) -> Any:
    raise TypeError(f"job dict: {type(value).__name__} value {value!r} is not JSON/YAML data")
