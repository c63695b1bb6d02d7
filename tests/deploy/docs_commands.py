"""Reading commands out of text: shared by static_checks.py and live_checks.py."""
import os
import re


def logical_lines(text):
    """(first physical line number, line) with backslash continuations joined."""
    out, start, parts = [], 1, []
    for n, line in enumerate(text.split("\n"), 1):
        if not parts:
            start = n
        if line.rstrip().endswith("\\"):
            parts.append(line.rstrip()[:-1])
            continue
        parts.append(line)
        out.append((start, " ".join(p.strip() for p in parts)))
        parts = []
    if parts:
        out.append((start, " ".join(parts)))
    return out


def documented_secrets(markdown):
    """{secret: {key: (file|literal, source)}} from a Markdown text's
    `kubectl create secret generic` commands."""
    out = {}
    for _, line in logical_lines(code_text(markdown)):
        m = re.search(r"kubectl (?:-n \S+ )?create secret generic (\S+)(.*)", line)
        if not m:
            continue
        keys = out.setdefault(m.group(1), {})
        for kind, key, value in re.findall(r"--from-(file|literal)=([^=\s]+)(?:=(\S+))?",
                                           m.group(2)):
            if kind == "file" and not value:
                key, value = os.path.basename(key), key
            keys[key] = (kind, value)
    return out


def code_text(markdown):
    """The code of a Markdown text, line for line (so line numbers hold):
    fenced blocks as they are, and of other lines their inline code spans,
    separated by ';' so that two spans never read as one command."""
    out, fenced = [], False
    for line in markdown.split("\n"):
        if line.startswith("```"):
            fenced = not fenced
            out.append("")
        elif fenced:
            out.append(line)
        else:
            out.append(" ; ".join(re.findall(r"`([^`]+)`", line)))
    return "\n".join(out)
