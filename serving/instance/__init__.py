"""One serving instance, started as one explicit sequence (``python -m serving.instance``).

unpack the package → check that its constraint plugins load → clean the Prometheus multiprocess directory →
start the engine and wait until it is ready → only then open the front end. See
:mod:`serving.instance.supervisor`.
"""
