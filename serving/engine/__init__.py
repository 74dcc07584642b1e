"""The CPU engine: a Hugging Face model behind a batching loop (see :mod:`serving.engine.core`).

Nothing is imported here: the OpenAI front end uses this package's request parser
(:mod:`serving.sampling.params`) and must not pull torch in with it.
"""
