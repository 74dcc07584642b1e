"""A version's JSON (engine arguments, I/O spec) as people read it: rows, not a Python dict.

The pages (``portal.web.templatetags.portal_status``) and the admin both render these rows.
"""

from __future__ import annotations

from typing import Any

from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString


def engine_arg_items(engine_args: Any) -> list[tuple[str, str]]:
    """``{"max_model_len": 2048, "enforce_eager": true}`` → sorted (name, value) rows, values
    as people write them on a command line (``true``, ``2048``, ``a, b`` for a list)."""
    if not isinstance(engine_args, dict):
        return []
    return [(str(k), _scalar(v)) for k, v in sorted(engine_args.items())]


def _scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, list):
        return ", ".join(_scalar(v) for v in value)
    if isinstance(value, dict):
        return ", ".join(f"{k}={_scalar(v)}" for k, v in value.items())
    return str(value)


def io_spec_rows(io_spec: Any) -> list[dict[str, str]]:
    """An I/O spec's tensors as table rows: side (input/output), name, datatype (``FP32`` for
    Triton's ``TYPE_FP32``), dims (``[-1, 4]``, -1 a variable size) and whether optional."""
    if not isinstance(io_spec, dict):
        return []
    rows = []
    for side, label in (("inputs", "input"), ("outputs", "output")):
        for tensor in io_spec.get(side) or []:
            if not isinstance(tensor, dict):
                continue
            dims = tensor.get("dims") or []
            rows.append(
                {
                    "side": label,
                    "name": str(tensor.get("name", "")),
                    "datatype": str(tensor.get("data_type", "")).removeprefix("TYPE_"),
                    "dims": f"[{', '.join(str(d) for d in dims)}]"
                    if isinstance(dims, list)
                    else "",
                    "optional": "optional" if tensor.get("optional") else "",
                }
            )
    return rows


def engine_args_html(engine_args: Any) -> SafeString:
    """The admin's rendering: one ``name = value`` line each, or "defaults"."""
    items = engine_arg_items(engine_args)
    if not items:
        return format_html("{}", "defaults")
    return format_html_join("", "<div><code>{} = {}</code></div>", items)


def io_spec_html(io_spec: Any) -> SafeString:
    """The admin's rendering: a table of the tensors (tensor, name, datatype, dims)."""
    rows = io_spec_rows(io_spec)
    if not rows:
        return format_html("{}", "none")
    body = format_html_join(
        "",
        "<tr><td>{}</td><td><code>{}</code></td><td><code>{}</code></td><td><code>{}</code></td></tr>",
        (
            (
                r["side"] + (" (optional)" if r["optional"] else ""),
                r["name"],
                r["datatype"],
                r["dims"],
            )
            for r in rows
        ),
    )
    return format_html(
        "<table><thead><tr><th>Tensor</th><th>Name</th><th>Datatype</th><th>Dims</th></tr>"
        "</thead><tbody>{}</tbody></table>",
        body,
    )
