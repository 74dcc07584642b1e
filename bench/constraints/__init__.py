"""Constraint-processor benchmark: per-decode-step time of mask fill + apply against batch size.

Run from the repository root (``./dev bench`` installs the peers and runs this)::

    python -m bench.constraints --quick   # a small grid, about a minute
    python -m bench.constraints           # the full grid (about 20 minutes on 2 cores)

Every engine is driven through the same teacher-forced token streams over the same synthetic
byte-level vocabulary (``bench/synthetic_vocab.py``). One decode step, timed from the Python call
boundary, is: advance every row by its next token, fill the bitmask ``[B, ceil(V/32)]``, apply it
to float32 logits ``[B, V]``. Engines:

- ``native``: ``NativeEngine`` batch (live output lists, one ``fill`` call) + ``apply_bitmask_``.
- ``reference``: ``ReferenceEngine`` batch through the same harness (the stand-in for ``native``
  while it did not exist; not in the default list).
- ``baseline``: per-request sequential processing as vLLM V0's per-request logits processors did
  it: for each row in Python, the reference constraint's allowed-token list for the row's state
  (memoized per state), as a tensor, ``mask = full(-inf); mask[allowed] = 0; logits[row] += mask``.
- ``xgrammar``: one ``GrammarMatcher`` per row, ``accept_token`` per row,
  ``BatchGrammarMatcher.batch_fill_next_token_bitmask`` and ``xgr.apply_token_bitmask_inplace``
  (CPU kernel).
- ``llguidance``: one ``LLMatcher`` per row, ``consume_token`` per row,
  ``llguidance.numpy.fill_next_token_bitmask_par`` on an ``LLExecutor``, then ``apply_bitmask_``.

Before timing each (vocabulary, constraint), every engine runs the same steps on a small batch
and the masks it applied (read back from the logits) are compared: they must be identical, except
that llguidance may allow a subset. Observed: where the next bytes are forced (one catalog entry
left), llguidance allows only the first token of its tokenizer's own tokenization of them, while
the documented semantics allow every token that keeps the output a prefix of a choice.

Results go to a JSON file and a Markdown summary next to it (``--out``).
"""
