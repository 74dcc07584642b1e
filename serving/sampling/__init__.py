"""What a generation request asks for and what comes back, at the bottom of ``serving``:
vLLM's sampling parameters as a request carries them (``params.py``), the per-request output
constraint's spec (``constraint_spec.py``), and the engine's request and response types
(``types.py``). The engine, the constraint processor, the KServe server and the front end all
import these; they import nothing of theirs (vLLM keeps ``sampling_params`` at its package's
root for the same reason).
"""
