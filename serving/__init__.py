"""What runs outside the portal: one serving instance and the gateway in front of instances.

Top to bottom (each part imports only those below it; an import-linter contract in
``pyproject.toml`` keeps it so): ``instance`` (the start-up sequence and life of one instance);
``gateway``, ``frontend`` (OpenAI-compatible) and ``kserve`` (KServe v2 HTTP and gRPC, the
CPU stand-in for tritonserver); ``engine`` (the CPU engine); ``repository`` (the one reader of
a Triton model repository); ``constraints`` (the constraint logits processor and its native
core); and the shared bottom: ``sampling`` (what a generation request asks for and what comes
back), ``model_config`` (the vLLM backend's model configuration) and ``request_limits``.

Nothing here imports Django or ``portal``: an instance runs on its own (in the serving image,
or as a local process) and talks to the portal only over the network.
"""
