"""One serving instance, started as one explicit sequence (``python -m serving.instance``).

unpack the package → install its plugin wheels and check that every plugin loads → clean the
Prometheus multiprocess directory → start the engine and wait until it is ready → only then open the front end. See
:mod:`serving.instance.supervisor`.
"""
