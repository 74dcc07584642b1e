# GPU serving image: NVIDIA's Triton container with the vLLM backend, at the pinned platform
# release (Triton 26.07 ships vLLM 0.24.0). Build it per platform release:
#   docker build -f docker/serving.Dockerfile \
#       --build-arg TRITON_TAG=26.07 --build-arg VLLM_VERSION=0.24.0 -t serving:26.07 .
# It cannot be built on our development machines (no Docker engine, no GPU); see
# docs/compatibility.md for the pairs and docs/operations.md for how releases are managed.
ARG TRITON_TAG=26.07
FROM nvcr.io/nvidia/tritonserver:${TRITON_TAG}-vllm-python-py3

ARG TRITON_TAG
ARG VLLM_VERSION=0.24.0

# The container bundles its own vLLM build (e.g. 0.24.0+092c4842.nv26.7); the pair is only
# valid if that is the version the platform release pins. Fail the build otherwise.
RUN python3 -c "import sys, vllm; v = vllm.__version__.split('+')[0]; \
    sys.exit(0 if v == '${VLLM_VERSION}' else f'vLLM {vllm.__version__} in Triton ${TRITON_TAG}, release pins ${VLLM_VERSION}')"

# Fail the build when the Triton vllm backend cannot import against the installed vLLM
# (the 25.09 'vllm.engine.metrics' class of failure).
COPY docker/check_vllm_backend.py /opt/platform/check_vllm_backend.py
RUN python3 /opt/platform/check_vllm_backend.py /opt/tritonserver/backends/vllm

# This project's serving package (start-up sequence, unified /metrics, constraint plugin) and
# its native extension. --no-deps: the container's vLLM, torch and Triton stay as NVIDIA built them.
COPY pyproject.toml setup.py README.md /opt/platform/src/
COPY portal /opt/platform/src/portal
COPY serving /opt/platform/src/serving
COPY native /opt/platform/src/native
RUN pip install --no-cache-dir --no-deps /opt/platform/src
# What serving/ needs beyond the container's own vLLM stack (fastapi, uvicorn, httpx and
# prometheus-client come with vLLM): the KServe v2 client the OpenAI front end drives Triton
# with, and the schema checker for response_format.
RUN pip install --no-cache-dir "tritonclient[grpc]" jsonschema

# vLLM loads the constraint processor only by the qualified name the packager writes into each
# model.json (no entry point), and imports it only when the model loads: fail the build if the
# names the packager writes do not load against this vLLM.
RUN python3 -c "import sys; from serving.package import vllm_repository_files as files; \
    sys.stdout.buffer.write(files('m', 1, '/weights', {})['m/1/model.json'])" > /tmp/model.json \
    && python3 /opt/platform/check_vllm_backend.py --model-json /tmp/model.json \
    && rm /tmp/model.json

# The instance supervisor starts the image's own tritonserver as the engine (the same command
# line the CPU engine takes in tests; serving/instance/engines.py), on the vLLM or Python
# backend. Pods name --engine explicitly; this default covers a plain `docker run`.
ENV PLATFORM_RELEASE_TRITON=${TRITON_TAG} PLATFORM_RELEASE_VLLM=${VLLM_VERSION} \
    SERVING_ENGINE=tritonserver TRITONSERVER_BIN=/opt/tritonserver/bin/tritonserver
RUN test -x "$TRITONSERVER_BIN" || (echo "no tritonserver at $TRITONSERVER_BIN" >&2; exit 1)
EXPOSE 8000 8001 8002 9000
ENTRYPOINT ["python3", "-m", "serving.instance"]
