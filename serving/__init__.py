"""What runs inside one serving instance: the OpenAI-compatible front end, the engine start-up
sequence and the unified ``/metrics`` endpoint.

This package must never import Django or anything from ``portal``: an instance runs on its own
(in the serving image, or as a local process) and talks to the portal only over the network.
Nothing is here yet; the serving instance arrives with issue 5.
"""
