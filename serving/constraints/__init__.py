"""Per-request output constraints enforced inside the decode loop.

See ``docs/constraints.md`` for the semantics. Like the rest of ``serving``, nothing here
imports Django.
"""

from __future__ import annotations

from serving.sampling.constraint_spec import (
    All,
    ConstraintError,
    ConstraintSpec,
    Regex,
    parse_constraint,
)

__all__ = [
    "LOGITS_PROCESSOR",
    "ConstraintError",
    "ConstraintSpec",
    "parse_constraint",
    "validate_spec",
]

# The vLLM logits processor, as vLLM's ``logits_processors`` engine argument names it.
LOGITS_PROCESSOR = "serving.constraints.vllm_v1:ConstraintLogitsProcessor"


def validate_spec(spec: ConstraintSpec) -> None:
    """Checks what can be checked without a vocabulary (regex syntax and features), so a bad
    constraint is refused when the request is admitted rather than when it is scheduled."""
    from serving.constraints import _native

    for part in spec.parts if isinstance(spec, All) else (spec,):
        if isinstance(part, Regex):
            _native.check_regex(part.pattern)
